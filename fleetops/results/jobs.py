"""The jobs family's answers, whichever backend ran the job (the node itself over SSH, or Slurm): a
launch, a job's state, the end of a tail, its last log lines, a stop, the node's list of jobs.
Fields one backend has and the other not are optional (left out of --json while None); a payload
whose key --json always writes, even as null, is a field without a default. The results both
backends give alike are built here, once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import Next, Payload, Result, Status, declare, optional
from .table import Table

# the node's record of a job (plans/jobspec.py, remote_scripts/jobs/store.py)
JobRecord = dict[str, Any]


@declare
@dataclass(frozen=True)
class Launched(Payload):
    """extract launched (SSH: `forced` past failing checks) or submitted (Slurm: its job id and task
    count)."""

    of_tasks = ("extract",)
    job: JobRecord
    forced: bool | None = optional()
    slurm_job_id: str | None = optional()
    shards: int | None = optional()


@dataclass(frozen=True)
class AlreadyRunning(Payload):
    """The same job already runs there: nothing launched, `tail` attaches to it."""

    job: JobRecord
    already_running: bool = True


@dataclass(frozen=True)
class AlreadyComplete(Payload):
    """Its output already holds every sample (`complete`: the node's word on it, per task for
    Slurm)."""

    complete: Any
    job: None = None
    shards: int | None = optional()
    next: Next | None = optional()


@dataclass(frozen=True)
class LaunchRefused(Payload):
    """Refused before launching: what stood in the way (an output in use, an unreadable dataset) and
    what next."""

    output_busy: dict[str, Any] | None = optional()
    dataset: dict[str, Any] | None = optional()
    next: Next | None = optional()


@declare
@dataclass(frozen=True)
class JobStatus(Payload):
    """A job on a node (SSH): its record, state, exit, runtime, last progress, how it ended, what is
    left."""

    of_tasks = ("status",)
    job: JobRecord
    state: str
    exit: dict[str, Any] | None
    drain: dict[str, Any] | None
    runtime_s: float | None
    last_progress: str | None
    cause: str | None
    tagged: Any
    left: Any
    oom: dict[str, Any] | None
    next: Next | None
    table: Table


@dataclass(frozen=True)
class SlurmJobStatus(Payload):
    """A job in Slurm: one row per task of its array, the nodes it runs on, the controller's trouble
    if any."""

    job: JobRecord
    state: str
    controller: str
    next: Next | None
    cancelled_by: Any
    scheduler: str
    tasks: list[dict[str, Any]]
    nodes: list[str]
    last_progress: list[str]
    reused: bool
    table: Table


@dataclass(frozen=True)
class SshTailDetached(Payload):
    """Ctrl-C detached the tail: the job goes on. SSH keeps the byte `offset`, Slurm each task's
    `offsets`."""

    job_id: str | None
    offset: int
    detached: bool
    next: Next


@dataclass(frozen=True)
class SlurmTailDetached(Payload):
    job_id: str | None
    offsets: list[int] | None
    detached: bool = True


@declare
@dataclass(frozen=True)
class TailEnded(Payload):
    """The job ended while followed (SSH): how, the bytes read, the failures seen, the reconnections
    needed."""

    of_tasks = ("tail",)
    job_id: str
    exit: dict[str, Any] | None
    state: str
    bytes: int
    failures: list[str]
    reconnects: int
    cause: str | None
    # the bar of its last progress line; None (or an empty reading) when it had none
    last_progress: Any


@dataclass(frozen=True)
class SlurmTailEnded(Payload):
    """The job ended while followed (Slurm): each task's row, the states it went through, bytes per
    task."""

    job_id: str
    state: str
    tasks: list[dict[str, Any]]
    states_seen: list[str]
    bytes: list[int]
    failures: list[str]
    last_progress: dict[int, str]


@declare
@dataclass(frozen=True)
class JobLogs(Payload):
    """A job's last lines (SSH: one list; Slurm: one per task), already printed as the node masked
    them."""

    of_tasks = ("logs",)
    lines: list[Any]
    state: str


@declare
@dataclass(frozen=True)
class Stopped(Payload):
    """stop's answer (SSH): the job, and what of it was left running (None: nothing)."""

    of_tasks = ("stop",)
    job_id: str
    left: Any


@dataclass(frozen=True)
class SlurmStopped(Payload):
    """stop's answer (Slurm): each task's row, the job's state, and the controller's trouble when it
    had some."""

    job_id: str
    tasks: list[dict[str, Any]]
    state: str
    controller: str | None = optional()
    next: Next | None = optional()
    reused: bool | None = optional()


@declare
@dataclass(frozen=True)
class JobList(Payload):
    """The node's jobs, newest first, SSH and Slurm alike (none: an empty list)."""

    of_tasks = ("jobs",)
    jobs: list[JobRecord]
    total: int


@dataclass(frozen=True)
class JobListed(JobList):
    """At least one job: the newest's record as the node keeps it (`latest`), the table, what to run
    next."""

    latest: Any = None
    next: Next | None = None
    table: Table | None = None


def logs_result(
    host: str, job_id: str, state: str, count: int, where: str, lines: list[Any]
) -> Result:
    """logs' result, either backend: `where` names the log file(s) the `count` lines were read
    from."""
    return Result(
        host,
        "logs",
        Status.OK,
        f"job {job_id} ({state}): last {count} lines of {where}",
        payload=JobLogs(lines, state),
    )


def already_running(host: str, job: JobRecord, msg: str) -> Result:
    return Result(host, "extract", Status.OK, msg, payload=AlreadyRunning(job))


def launched(host: str, msg: str, items: list[Any], payload: Launched) -> Result:
    """extract's launch (SSH) or submission (Slurm): changed, with its notes as items."""
    return Result(host, "extract", Status.CHANGED, msg, items, payload=payload)


def tail_end(host: str, code: int, msg: str, payload: TailEnded | SlurmTailEnded) -> Result:
    """The end of a tail, either backend: ok only when the job succeeded; the job's own exit status
    asks."""
    return Result(
        host, "tail", Status.OK if code == 0 else Status.FAILED, msg, code=code, payload=payload
    )


def detached(host: str, msg: str, payload: SshTailDetached | SlurmTailDetached) -> Result:
    """Ctrl-C detached the tail, either backend: done (the job runs on), but not finished: 130."""
    return Result(host, "tail", Status.OK, msg, code=130, payload=payload)
