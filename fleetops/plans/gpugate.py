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
        code = (
            EXIT_NO_NVIDIA_SMI
            if snap.get("error_kind") == "no_nvidia_smi"
            else EXIT_NVIDIA_SMI_FAILED
        )
        return Verdict(code, snap.get("error", "nvidia-smi failed"), [], [], [])
    gpus = sorted(snap["gpus"], key=lambda g: g.get("index") or 0)
    seen = {g["index"] for g in gpus}
    missing: set[int] = set()
    if gate.expected is not None and len(gpus) < gate.expected:
        missing |= set(range(gate.expected)) - seen
    if gate.select is not None:
        missing |= set(gate.select) - seen
    selected = [g for g in gpus if gate.select is None or g["index"] in gate.select]
    items, states, holders = [], [], []
    busy = unhealthy = 0
    for g in selected:
        problems = list(g.get("problems") or [])
        if (g.get("ecc_uncorrected") or 0) > 0:
            problems.append(f"{g['ecc_uncorrected']} uncorrected ECC errors")
        procs = g.get("processes") or []
        used = g.get("memory_used_mib") or 0
        if problems:
            state, status = "unhealthy", Status.FAILED
            unhealthy += 1
            why = "; ".join(problems)
        elif used > gate.threshold_mib or procs:
            state, status = "busy", Status.FAILED
            busy += 1
            why = f"{used} MiB used (threshold {gate.threshold_mib})" + (
                f", {len(procs)} processes" if procs else ""
            )
            holders += [f"GPU {g['index']}: {describe_process(p)}" for p in procs] or [
                f"GPU {g['index']}: {used} MiB held by no listed process"
            ]
        else:
            state, status, why = "free", Status.OK, f"{used} MiB used"
        items.append(
            Item(
                f"GPU {g['index']} {g.get('name')}",
                status,
                f"{state}: {why}",
                {
                    "uuid": g.get("uuid"),
                    "state": state,
                    "processes": procs,
                    "memory_used_mib": used,
                    "memory_total_mib": g.get("memory_total_mib"),
                    "memory_free_mib": g.get("memory_free_mib"),
                },
            )
        )
        states.append((g, state))
    for index in sorted(missing):
        items.append(
            Item(
                f"GPU {index}",
                Status.FAILED,
                "missing: not reported by nvidia-smi",
                {"state": "missing"},
            )
        )
    parts = []
    if missing:
        parts.append(
            f"expected {gate.expected if gate.expected is not None else len(gpus)} GPUs, saw "
            f"{len(gpus)}: missing {', '.join(f'GPU {i}' for i in sorted(missing))}"
        )
    if unhealthy:
        parts.append(f"{unhealthy} unhealthy")
    if busy:
        parts.append(f"{busy} busy")
    free = len(selected) - busy - unhealthy
    if snap.get("apps_error"):
        parts.append(f"nvidia-smi could not list GPU processes: {snap['apps_error']}")
    msg = f"{free}/{len(selected)} selected GPUs free" + (f"; {'; '.join(parts)}" if parts else "")
    code = EXIT_GPU_UNHEALTHY if (missing or unhealthy) else EXIT_GPU_BUSY if busy else EXIT_OK
    return Verdict(code, msg, items, states, holders, sorted(missing))
