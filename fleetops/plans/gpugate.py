"""GPU gates: is every selected GPU there, healthy and free? Pure functions over the node's
snapshot."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from ..results import (
    EXIT_GPU_BUSY,
    EXIT_GPU_UNHEALTHY,
    EXIT_NO_NVIDIA_SMI,
    EXIT_NVIDIA_SMI_FAILED,
    EXIT_OK,
    Item,
    Next,
    Severity,
    Status,
)
from .timefmt import duration

DEFAULT_THRESHOLD_MIB = 1024
# Nagios-style verdicts, as diagnose says them: each gate exit status stands for one (README, exit
# statuses).
OK, WARN, CRITICAL, UNKNOWN = Severity.OK, Severity.WARN, Severity.CRITICAL, Severity.UNKNOWN
VERDICT_FOR = {
    EXIT_OK: OK,
    EXIT_GPU_BUSY: WARN,
    EXIT_GPU_UNHEALTHY: CRITICAL,
    EXIT_NO_NVIDIA_SMI: UNKNOWN,
    EXIT_NVIDIA_SMI_FAILED: UNKNOWN,
}
WAIT_HINT_S = 600  # the --wait the next action suggests for busy GPUs


@dataclass(frozen=True)
class Gate:
    threshold_mib: int = DEFAULT_THRESHOLD_MIB
    select: tuple[int, ...] | None = None  # None: every GPU
    expected: int | None = None  # from the inventory: how many GPUs the node should have


@dataclass
class Verdict:
    code: int
    msg: str
    items: list[Item]
    # each selected GPU of the snapshot, with its state (free / busy / unhealthy)
    gpus: list[tuple[dict[str, Any], str]]
    holders: list[str]
    missing: list[int] = field(default_factory=list)

    @property
    def word(self) -> Severity:
        """OK (all selected GPUs free), WARN (busy), CRITICAL (missing or unhealthy), UNKNOWN (no
        answer)."""
        return VERDICT_FOR[self.code]

    @property
    def ours(self) -> bool:
        """A fleetops job holds one of the busy GPUs (`fab stop` can end it; it cannot end anyone
        else's)."""
        return any(
            p.get("job")
            for g, state in self.gpus
            if state == "busy"
            for p in g.get("processes") or []
        )


def next_action(host: str, verdict: Verdict) -> Next | None:
    """What to run next for this host's finding, or None when all is well. It names the host the way
    the operator types it, so hosts that differ only by their name fold into one group with one next
    action."""
    fab = f"fab -H {shlex.quote(host)}"
    if verdict.code == EXIT_GPU_BUSY and verdict.ours:
        return Next(
            "a fleetops job holds them: see it, and stop it if it should not run",
            [f"{fab} jobs", f"{fab} stop"],
        )
    if verdict.code == EXIT_GPU_BUSY:
        return Next(
            "wait for the holders (not fleetops jobs: ask their owners; extract --force would "
            "share the GPUs with them)",
            [f"{fab} gpu --wait {WAIT_HINT_S}"],
        )
    if verdict.code == EXIT_GPU_UNHEALTHY:
        return Next(
            "Xid events, ECC, row remapping; keep work off the node until it is fixed",
            [f"{fab} diagnose"],
        )
    if verdict.code == EXIT_NO_NVIDIA_SMI:
        return Next(
            "is the NVIDIA driver installed, nvidia-smi on the login PATH?",
            [f"{fab} run 'command -v nvidia-smi'"],
        )
    if verdict.code == EXIT_NVIDIA_SMI_FAILED:
        return Next(
            "nvidia-smi fails: driver/library mismatch, NVML, Xid events", [f"{fab} diagnose"]
        )
    return None


def parse_selection(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(sorted({int(x) for x in str(text).split(",") if x.strip()}))
    except ValueError:
        raise ValueError(f"--gpus takes GPU indices like 0,1,2 (got {text!r})") from None


def describe_process(p: dict[str, Any]) -> str:
    owner = f"job {p['job']}" if p.get("job") else "foreign"
    who = p.get("user") or "?"
    cmd = " ".join((p.get("command") or p.get("name") or "?").split())[:100]
    return (
        f"pid {p['pid']} {p.get('name')} {p.get('used_mib')} MiB, {who}, "
        f"{duration(p.get('age_s'))}, {owner}: {cmd}"
    )


def evaluate(snap: dict[str, Any], gate: Gate) -> Verdict:
    if not snap.get("ok"):
        return _unanswered(snap)
    gpus = sorted(snap["gpus"], key=lambda g: g.get("index") or 0)
    missing = _missing(gpus, gate)
    selected = [g for g in gpus if gate.select is None or g["index"] in gate.select]
    items, states, holders = [], [], []
    for g in selected:
        judged = _judge(g, gate.threshold_mib)
        items.append(judged.item(g))
        states.append((g, judged.state))
        holders += judged.holders
    items += [
        Item(
            f"GPU {index}",
            Status.FAILED,
            "missing: not reported by nvidia-smi",
            {"state": "missing"},
        )
        for index in sorted(missing)
    ]
    counts = {state: sum(1 for _, s in states if s == state) for state in ("busy", "unhealthy")}
    msg = _summary(snap, gate, len(gpus), missing, counts, len(selected))
    if missing or counts["unhealthy"]:
        code = EXIT_GPU_UNHEALTHY
    elif counts["busy"]:
        code = EXIT_GPU_BUSY
    else:
        code = EXIT_OK
    return Verdict(code, msg, items, states, holders, sorted(missing))


def _unanswered(snap: dict[str, Any]) -> Verdict:
    """No snapshot: nvidia-smi is not there, or it failed."""
    if snap.get("error_kind") == "no_nvidia_smi":
        code = EXIT_NO_NVIDIA_SMI
    else:
        code = EXIT_NVIDIA_SMI_FAILED
    return Verdict(code, snap.get("error", "nvidia-smi failed"), [], [], [])


def _missing(gpus: list[dict[str, Any]], gate: Gate) -> set[int]:
    """GPUs the inventory expects or the selection names that nvidia-smi did not report."""
    seen = {g["index"] for g in gpus}
    missing: set[int] = set()
    if gate.expected is not None and len(gpus) < gate.expected:
        missing |= set(range(gate.expected)) - seen
    if gate.select is not None:
        missing |= set(gate.select) - seen
    return missing


@dataclass
class _Judged:
    """One GPU's state (free / busy / unhealthy), why, and who holds it."""

    state: str
    status: Status
    why: str
    holders: list[str] = field(default_factory=list)

    def item(self, g: dict[str, Any]) -> Item:
        return Item(
            f"GPU {g['index']} {g.get('name')}",
            self.status,
            f"{self.state}: {self.why}",
            {
                "uuid": g.get("uuid"),
                "state": self.state,
                "processes": g.get("processes") or [],
                "memory_used_mib": g.get("memory_used_mib") or 0,
                "memory_total_mib": g.get("memory_total_mib"),
                "memory_free_mib": g.get("memory_free_mib"),
            },
        )


def _judge(g: dict[str, Any], threshold_mib: int) -> _Judged:
    problems = list(g.get("problems") or [])
    if (g.get("ecc_uncorrected") or 0) > 0:
        problems.append(f"{g['ecc_uncorrected']} uncorrected ECC errors")
    if problems:
        return _Judged("unhealthy", Status.FAILED, "; ".join(problems))
    procs = g.get("processes") or []
    used = g.get("memory_used_mib") or 0
    if not (used > threshold_mib or procs):
        return _Judged("free", Status.OK, f"{used} MiB used")
    why = f"{used} MiB used (threshold {threshold_mib})"
    if procs:
        why += f", {len(procs)} processes"
    holders = [f"GPU {g['index']}: {describe_process(p)}" for p in procs] or [
        f"GPU {g['index']}: {used} MiB held by no listed process"
    ]
    return _Judged("busy", Status.FAILED, why, holders)


def _summary(
    snap: dict[str, Any],
    gate: Gate,
    reported: int,
    missing: set[int],
    counts: dict[str, int],
    selected: int,
) -> str:
    """`free/selected selected GPUs free`, then what is missing, unhealthy, busy or unlisted."""
    parts = []
    if missing:
        expected = gate.expected if gate.expected is not None else reported
        parts.append(
            f"expected {expected} GPUs, saw {reported}: "
            f"missing {', '.join(f'GPU {i}' for i in sorted(missing))}"
        )
    parts += [f"{counts[state]} {state}" for state in ("unhealthy", "busy") if counts[state]]
    if snap.get("apps_error"):
        parts.append(f"nvidia-smi could not list GPU processes: {snap['apps_error']}")
    free = selected - counts["busy"] - counts["unhealthy"]
    msg = f"{free}/{selected} selected GPUs free"
    if parts:
        msg += f"; {'; '.join(parts)}"
    return msg
