"""A run's results as Prometheus metrics: the text exposition format a node_exporter textfile collector reads.

One series per host and what was checked, named as Prometheus' conventions ask (a `fleetops_` prefix, base units,
`_seconds`/`_bytes` suffixes, states as a set of 0/1 series). Label values come from what the operator wrote (the
inventory's host names, the playbook's check and module names) or from a fixed vocabulary (states); what a node
answered goes into a label only when it has a known, bounded form (a GPU index), never as free text, so a node
cannot invent series or smuggle text into an alerting pipeline. The scrape target's own `job` and `instance`
labels are left to Prometheus: a job's name is `job_name`.

Pure: results in, text out. The file is written by write_atomically, so a collector never reads half a file."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..results import Result, Status

MAX_LABEL = 128  # characters of a label value; longer ones end in "..."
PATCH_STATES = ("patched", "original", "drifted", "unknown")
JOB_STATES = ("running", "starting", "pending", "succeeded", "stopped", "failed", "killed", "cancelled", "lost",
              "unknown")
# The node agent's status words for a file of a patch set, as a file state (remote_scripts/core/protocol.py).
_PATCH_STATE_OF = {"applied": "patched", "already_applied": "patched", "would_restore": "patched",
                   "restored": "original", "already_original": "original", "would_apply": "original",
                   "drifted": "drifted"}
_CHECK_LABEL = re.compile(r"^(?P<check>.+) \[(?P<kind>[a-z]+)\]$")
_MIB = 1024 * 1024

_HELP = {
    "fleetops_host_reachable": ("gauge", "1 if fleetops reached the host in its last run, else 0."),
    "fleetops_check_ok": ("gauge", "1 if the playbook's check passed on the host, 0 if it failed."),
    "fleetops_verify_seconds": ("gauge", "Seconds the last verify of the host took."),
    "fleetops_patch_state": ("gauge", "1 for the state each file of the patch set is in on the host, else 0."),
    "fleetops_gpu_memory_used_bytes": ("gauge", "GPU memory in use, as nvidia-smi reported it."),
    "fleetops_job_state": ("gauge", "1 for the state the host's latest job is in, else 0."),
    "fleetops_last_run_timestamp_seconds": ("gauge", "When fleetops last ran the task, in Unix seconds."),
}


@dataclass
class Exposition:
    """Series by metric name, each a (labels, value) pair; `text()` renders them in a stable order."""

    series: dict[str, list[tuple[tuple[tuple[str, str], ...], float]]] = field(default_factory=dict)

    def add(self, name: str, value: float, **labels: str) -> None:
        pairs = tuple(sorted((key, label_value(text)) for key, text in labels.items()))
        self.series.setdefault(name, []).append((pairs, value))

    def text(self) -> str:
        out: list[str] = []
        for name in sorted(self.series):
            kind, help_text = _HELP[name]
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            seen: set[tuple[tuple[str, str], ...]] = set()
            for pairs, value in sorted(self.series[name]):
                if pairs in seen:  # one sample per series: the first result for it stands
                    continue
                seen.add(pairs)
                labels = ",".join(f'{key}="{_escaped(text)}"' for key, text in pairs)
                out.append(f"{name}{{{labels}}} {_number(value)}" if labels else f"{name} {_number(value)}")
        return "\n".join(out) + "\n" if out else ""


def label_value(text: object) -> str:
    """A label value from text: printable characters only (anything else becomes `?`), at most MAX_LABEL."""
    value = "".join(ch if ch.isprintable() else "?" for ch in str(text))
    return value if len(value) <= MAX_LABEL else value[:MAX_LABEL - 3] + "..."


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))


def exposition(results: Iterable[Result], *, playbook: str | None, now: float) -> str:
    """The metrics of one run: `playbook` labels the check series (the playbook the run verified)."""
    out = Exposition()
    results = list(results)
    reached: dict[str, bool] = {}
    for r in results:
        reached[r.host] = reached.get(r.host, True) and r.status is not Status.UNREACHABLE
        if r.status is Status.UNREACHABLE:
            continue
        if r.task == "verify":
            _verify(out, r, playbook or "")
        elif r.task in ("patch", "rollback"):
            _patch(out, r)
        elif r.task == "gpu":
            _gpu(out, r)
        elif r.task == "status":
            _job(out, r)
    for host, ok in reached.items():
        out.add("fleetops_host_reachable", 1 if ok else 0, host=host)
    for task in sorted({r.task for r in results}):
        out.add("fleetops_last_run_timestamp_seconds", round(now, 3), task=task)
    return out.text()


def _verify(out: Exposition, r: Result, playbook: str) -> None:
    for item in r.items:
        if item.status not in (Status.OK, Status.FAILED):
            continue  # a check not run (skipped) says nothing about the node
        shape = _CHECK_LABEL.match(item.label)
        check, kind = (shape["check"], shape["kind"]) if shape else (item.label, "")
        out.add("fleetops_check_ok", 1 if item.status is Status.OK else 0, host=r.host, playbook=playbook,
                check=check, kind=kind)
    out.add("fleetops_verify_seconds", round(r.seconds, 3), host=r.host)


def _patch(out: Exposition, r: Result) -> None:
    for item in r.items:
        if item.label == "requirements":
            continue
        current = _PATCH_STATE_OF.get(str(item.details.get("state", "")), "unknown")
        for state in PATCH_STATES:
            out.add("fleetops_patch_state", 1 if state == current else 0, host=r.host, file=item.label,
                    state=state)


def _gpu(out: Exposition, r: Result) -> None:
    for gpu in r.data.get("gpus") or []:
        index, used = gpu.get("index"), gpu.get("memory_used_mib")
        if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < 1024 \
                and isinstance(used, (int, float)) and not isinstance(used, bool) and used >= 0:
            out.add("fleetops_gpu_memory_used_bytes", used * _MIB, host=r.host, gpu=str(index))


def _job(out: Exposition, r: Result) -> None:
    job = r.data.get("job")
    if not isinstance(job, dict):
        return
    name = job.get("name")
    state = r.data.get("state")
    current = state if state in JOB_STATES else "unknown"
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
        name = "unknown"
    for word in JOB_STATES:
        out.add("fleetops_job_state", 1 if word == current else 0, host=r.host, job_name=name, state=word)


def write_atomically(path: Path, text: str) -> None:
    """`text` at `path`, whole or not at all: written to a temp file beside it, flushed to disk, then renamed over
    it (a collector reading meanwhile sees the old file or the new one). Readable by all, as collectors need."""
    path = Path(path)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
