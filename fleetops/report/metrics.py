"""A run's results as Prometheus metrics: the text exposition format a node_exporter textfile
collector reads.

One series per host and what was checked, named as Prometheus' conventions ask (a `fleetops_`
prefix, base units, `_seconds`/`_bytes` suffixes, states as a set of 0/1 series). Label values come
from what the operator wrote (the inventory's host names, the playbook's check and module names) or
from a fixed vocabulary (states); what a node answered goes into a label only when it has a known,
bounded form (a GPU index), never as free text, so a node cannot invent series or smuggle text into
an alerting pipeline. The scrape target's own `job` and `instance` labels are left to Prometheus: a
job's name is `job_name`.

Pure: results in, text out. The file is written by report/files.py, so a collector never reads half
a file."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..agent.core.exposition import (
    MAX_LABEL,
    PATCH_STATES,
    Exposition,
    add_patch_states,
    label_value,
)
from ..results import Result, Status

__all__ = ["MAX_LABEL", "PATCH_STATES", "Exposition", "exposition", "label_value"]

JOB_STATES = (
    "running",
    "starting",
    "pending",
    "succeeded",
    "stopped",
    "failed",
    "killed",
    "cancelled",
    "lost",
    "unknown",
)
_CHECK_LABEL = re.compile(r"^(?P<check>.+) \[(?P<kind>[a-z]+)\]$")
_MIB = 1024 * 1024


def exposition(results: Iterable[Result], *, now: float, playbook: str | None = None) -> str:
    """The metrics of one run. A check series is labelled with the playbook its host was verified
    with (each host of a playbook set may have its own); `playbook` stands in where a result does
    not name one."""
    out = Exposition()
    results = list(results)
    reached: dict[str, bool] = {}
    for r in results:
        reached[r.host] = reached.get(r.host, True) and r.status is not Status.UNREACHABLE
        if r.status is Status.UNREACHABLE:
            continue
        if r.task == "verify":
            named = r.data.get("playbook")
            _verify(out, r, named if isinstance(named, str) and named else playbook or "")
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
        out.add(
            "fleetops_check_ok",
            1 if item.status is Status.OK else 0,
            host=r.host,
            playbook=playbook,
            check=check,
            kind=kind,
        )
    out.add("fleetops_verify_seconds", round(r.seconds, 3), host=r.host)


def _patch(out: Exposition, r: Result) -> None:
    add_patch_states(
        out, r.host, [{"label": item.label, "state": item.details.get("state")} for item in r.items]
    )


def _gpu(out: Exposition, r: Result) -> None:
    for gpu in r.data.get("gpus") or []:
        index, used = gpu.get("index"), gpu.get("memory_used_mib")
        if (
            isinstance(index, int)
            and not isinstance(index, bool)
            and 0 <= index < 1024
            and isinstance(used, (int, float))
            and not isinstance(used, bool)
            and used >= 0
        ):
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
        out.add(
            "fleetops_job_state",
            1 if word == current else 0,
            host=r.host,
            job_name=name,
            state=word,
        )
