"""`jobs`: the node's job store as one table, every backend's jobs alike (each row read by the
backend that made it: the `read` the caller hands in), and the exit words the job tasks share."""

from __future__ import annotations

from collections.abc import Callable
from shlex import quote
from typing import TYPE_CHECKING

from ...plans.jobverdict import of as verdict_of
from ...plans.timefmt import duration
from ...results import Next, Result, Status
from ...results.jobs import JobList, JobListed
from ..plan import agent_error

if TYPE_CHECKING:
    from ..plan import Plan


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def _output_text(row: dict) -> str:
    """What of its output the job wrote (by the manifest: its own samples, not the directory every
    run on that output shares)."""
    if row.get("output_bytes") is None:
        return "-"
    samples = row.get("output_samples")
    return _size(row["output_bytes"]) + (
        f" ({samples} samples)" if isinstance(samples, int) else ""
    )


def exit_text(row: dict) -> str:
    ended = row.get("exit") or {}
    if not ended:
        return "-"
    return f"signal {ended['signal']}" if ended.get("signal") else str(ended.get("exit_code"))


Reader = Callable[[dict, object], dict]


def _listed(job: dict, now_ts: object, read: Reader) -> dict:
    """A row of the node's list with its state, read by the backend that made the job (a Slurm job's
    from its scheduler lines); the word is the verdict every reader of a job shares (a job fleetops'
    `stop` ended is `stopped`)."""
    job = read(job, now_ts)
    return {**job, "state": verdict_of(job).word}


def interpret(host: str, plan: Plan, answer: dict, read: Reader) -> Result:
    """The node's jobs (SSH and Slurm), newest first: id, job name, state, started, runtime, exit,
    log and output sizes."""
    if answer.get("error"):
        return agent_error(host, "jobs", answer)
    jobs = [_listed(j, answer.get("now_ts"), read) for j in answer["jobs"]]
    if not jobs:
        where = answer["jobs_dir"] + (
            f" or {answer['slurm_dir']}" if answer.get("slurm_dir") else ""
        )
        return Result(
            host,
            "jobs",
            Status.OK,
            f"no jobs on this node (none under {where}); start one with: fab -H {host} extract",
            payload=JobList([], 0),
        )
    rows = [
        [
            j["id"],
            j.get("name") or "-",
            j["state"],
            (j.get("started") or "-").replace("T", " ").rstrip("Z"),
            duration(j.get("runtime_s")),
            exit_text(j),
            _size(j.get("log_bytes")),
            _output_text(j),
        ]
        for j in jobs
    ]
    shown = "" if len(jobs) == answer["total"] else f" (the newest {len(jobs)} shown)"
    running = [j["id"] for j in jobs if j["state"] in ("running", "starting", "pending")]
    msg = f"{answer['total']} jobs{shown}, newest first; " + (
        f"running: {', '.join(running)}" if running else "none running"
    )
    nxt = Next(
        "one job's state, exit and last progress (the newest here; any id above the same way):",
        [f"fab -H {quote(host)} status --job-id {quote(jobs[0]['id'])}"],
    )
    return Result(
        host,
        "jobs",
        Status.OK,
        msg,
        payload=JobListed(
            jobs,
            answer["total"],
            answer.get("latest"),
            nxt,
            {
                "title": f"{host}: jobs (started in UTC)",
                "columns": ["job", "name", "state", "started", "runtime", "exit", "log", "output"],
                "rows": rows,
            },
        ),
    )
