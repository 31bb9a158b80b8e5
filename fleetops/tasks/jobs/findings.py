"""diagnose's reading of the node's latest job, SSH or Slurm: killed by the kernel's OOM killer,
running, or ended, its log read with the playbook's failures: patterns (a CUDA out-of-memory named
as such), and what an ended job left running. Pure: the node's answer in, findings out."""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import TYPE_CHECKING

from ...plans.jobspec import describe_end
from ...plans.jobverdict import of as verdict_of
from ..findings import CRITICAL, OK, UNKNOWN, WARN, Finding, fab_cmd, quoted, run_cmd
from .backend import backend_of_record

if TYPE_CHECKING:
    from ...plans.kernellog import OomKill


# A CUDA out-of-memory in a job's log: PyTorch's words (RuntimeError or torch.OutOfMemoryError) and
# the CUDA runtime's own. Known as the job's cause whatever its failures: patterns say.
GPU_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory")
GPU_OOM_ADVICE = (
    "read the end of its log; then give the job less to hold in GPU memory (batch size, "
    "max_model_len, gpu_memory_utilization) or free the GPUs (fab gpu), and extract again"
)


def _unread_job(host: str, job: dict) -> Finding | None:
    """No job on the node, or one whose record could not be read; None when there is one."""
    if job.get("error_kind") == "no_job":
        return Finding(
            OK,
            "job",
            "no job has been started on this node",
            [fab_cmd(host, "extract")],
            rank=95,
            why="start one",
        )
    if job.get("error"):
        return Finding(
            UNKNOWN,
            "job",
            f"the latest job could not be read: {job['error']}",
            [fab_cmd(host, "status")],
            rank=45,
            why="the job's own account",
        )
    return None


def _oom_finding(host: str, job: dict, ours: list[OomKill], details: dict) -> Finding:
    """The kernel's OOM killer killed the job's main process, or one it started."""
    from ...plans.kernellog import OOM_ADVICE, oom_text

    main = next((k for k in ours if k.pid == job.get("pid")), ours[0])
    if main.pid == job.get("pid"):
        how = "main process"
    else:
        how = "process (one that died during its run)"
    return Finding(
        CRITICAL,
        "oom",
        f"the kernel OOM killer killed job {job.get('id')}'s {how}: "
        f"{oom_text(main)}; the job ended: {describe_end(job)}",
        [fab_cmd(host, "logs", "--job-id", str(job.get("id"))), *rerun(host, job)],
        rank=3,
        details={
            **details,
            "oom": [asdict(k) | {"lines": [ln.text for ln in k.lines]} for k in ours],
        },
        why=OOM_ADVICE,
    )


def job_findings(
    host: str,
    job: dict,
    kills: list[OomKill],
    kernel_ok: bool,
    progress_rx: re.Pattern[str],
    failure_rxs: list[re.Pattern[str]],
) -> list[Finding]:
    """The latest job (SSH or Slurm): killed by the kernel's OOM killer, running, or ended; an ended
    job's log is read with the playbook's failures: patterns, whatever its exit status said."""
    unread = _unread_job(host, job)
    if unread is not None:
        return [unread]
    verdict = verdict_of(job)
    state = verdict.word  # the word `status` and `jobs` give it
    tail = job.get("log_tail") or []
    progress = next((ln for ln in reversed(tail) if progress_rx.search(ln)), None)
    failures = [ln for ln in tail if any(rx.search(ln) for rx in failure_rxs)][-5:]
    runtime = job.get("runtime_s")
    backend = backend_of_record(job)
    facts = f"job {job.get('id')} ({backend.who(job)}) {state}"
    if isinstance(runtime, (int, float)):
        facts += f" after {runtime:.0f}s"
    details = {
        "job_id": job.get("id"),
        "state": state,
        "exit": job.get("exit"),
        "runtime_s": runtime,
        "last_progress": progress,
        "failure_lines": failures,
        "log": job.get("log"),
        "scheduler": job.get("scheduler") or "ssh",
    }
    from ...plans.kernellog import match_oom

    # A login node's kernel log says nothing of the compute node its scheduler allocated: no OOM
    # kill is matched to such a job.
    ours = [] if backend.allocates else match_oom(kills, job)[0]
    if ours:
        return [_oom_finding(host, job, ours, details)]
    if not verdict.ended and verdict.health == OK:
        msg = f"{facts}; last progress: {progress or '(none yet)'}"
        return [
            Finding(
                OK, "job", msg, [fab_cmd(host, "tail")], rank=80, details=details, why="follow it"
            )
        ]
    return [_ended_finding(host, job, facts, details, tail, failures, kernel_ok)]


def rerun(host: str, job: dict) -> list[str]:
    """The run that redoes an `extract --again` that did not end well: --again too (a plain extract
    resumes only what that run's manifest holds, or finds the earlier run's output complete)."""
    if not job.get("again"):
        return []
    name = str(job.get("name") or "extract")
    return [fab_cmd(host, "extract", *(("--job", name) if name != "extract" else ()), "--again")]


def _ended_finding(
    host: str,
    job: dict,
    facts: str,
    details: dict,
    tail: list[str],
    failures: list[str],
    kernel_ok: bool,
) -> Finding:
    """An ended job: out of GPU memory (its log says so), failed or killed, succeeded with failure
    lines in its log (each WARN, the matched line shown), or succeeded cleanly (OK)."""
    from ...plans.kernellog import sigkill_note

    why = job.get("end") or describe_end(job)
    if (job.get("exit") or {}).get("signal") == 9 and not backend_of_record(job).allocates:
        why += f" ({sigkill_note(kernel_ok)})"
    logs = [
        fab_cmd(host, "logs", "--job-id", str(job.get("id")), "--lines", "200"),
        *rerun(host, job),
    ]
    oom = next((ln for ln in reversed(tail) if GPU_OOM.search(ln)), None)
    if oom is not None:
        return Finding(
            WARN,
            "job",
            f"{facts}: {why}; out of GPU memory: {oom}",
            logs,
            rank=9,
            details={**details, "gpu_oom_line": oom},
            why=GPU_OOM_ADVICE,
        )
    verdict = verdict_of(job)
    if verdict.ok and not failures:
        return Finding(
            OK,
            "job",
            f"{facts}: {why}",
            [fab_cmd(host, "logs")],
            rank=85,
            details=details,
            why="its last lines",
        )
    if verdict.ok:
        return Finding(
            WARN,
            "job",
            f"{facts}: {why}, but its log has {len(failures)} line(s) its failures: "
            f"patterns match; last: {failures[-1]}",
            logs,
            rank=11,
            details=details,
            why="read what went wrong",
        )
    last = (
        f"; last failure line: {failures[-1]}"
        if failures
        else (f"; last log line: {tail[-1]}" if tail else "")
    )
    return Finding(
        verdict.health,
        "job",
        f"{facts}: {why}{last}",
        logs,
        rank=10,
        details=details,
        why="read why it ended",
    )


def _process_row(p: dict) -> str:
    row = f"{p['pid']} {p['state']} {p.get('cpu_pct')}% CPU {p['rss_kb'] // 1024} MiB RSS"
    if p.get("gpu_mib"):
        row += f" {p['gpu_mib']} MiB GPU"
    return row + f" {p['comm']}"


def _left_behind(host: str, job: dict, procs: list, rows: list[str]) -> Finding | None:
    """The processes an ended job left running (its wrapper aside); None when it left none."""
    left = [p for p in procs if p["pid"] != job.get("wrapper_pid")]
    if not left:
        return None
    plural = "es" if len(left) != 1 else ""
    return Finding(
        WARN,
        "processes",
        f"job {job.get('id')} ended ({job.get('state')}) but left "
        f"{len(left)} process{plural}: " + "; ".join(rows),
        [fab_cmd(host, "stop")],
        rank=15,
        details={"processes": procs},
        why="stop what the ended job left behind",
    )


def process_findings(host: str, job: dict, procs: list) -> list[Finding]:
    if not isinstance(procs, list):
        return []
    ended = job.get("state") not in ("running", "starting")
    if ended:
        # A zombie of an ended job has exited and holds nothing (its parent has not reaped it yet):
        # not a process the job left behind, and `stop` could do nothing about it.
        procs = [p for p in procs if p.get("state") != "Z"]
    if not procs:
        return []
    rows = [_process_row(p) for p in procs]
    left = _left_behind(host, job, procs, rows) if ended else None
    if left is not None:
        return [left]
    stuck = any(p["state"] in ("D", "Z") for p in procs)
    return [
        Finding(
            WARN if stuck else OK,
            "processes",
            f"job {job.get('id')}'s processes: " + "; ".join(rows),
            [run_cmd(host, f"ps -o pid,stat,etime,rss,cmd -g {quoted(job.get('pgid'))}")],
            rank=48 if stuck else 92,
            details={"processes": procs},
            why="the job's processes as ps sees them",
        )
    ]


def with_state(job: dict, now_ts: object) -> dict:
    """The latest job as the node sent it, with its state read the way `status` reads it (by the
    backend that made it: a Slurm job's from its record, squeue/sacct's lines and its exit files; an
    SSH job's is the node's own)."""
    return backend_of_record(job).read_record(job, now_ts)
