"""The host tasks whose families load on first use, declared here like every other task
(declare.py): the jobs (extract, tail, status, logs, stop, jobs) and diagnose. Their declarations
and plans are light; what they run on (the job backends, Slurm, shards; diagnose's kernel-log and
GPU-health parsers) is imported the first time a run plans or runs one of them, so a run that names
none never loads it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..plans.yamlsrc import ConfigError
from ..results import Result
from ..wire.connector import Connector
from .declare import HELP_JOB_ID, HELP_PLAYBOOK, JSON, HostTask, Option
from .plan import Plan, UsageError

if TYPE_CHECKING:
    from ..state import RunState

HELP_JOB = "the playbook's job (default: extract)"
JOB = Option("job", HELP_JOB)
JOB_ID = Option("job_id", HELP_JOB_ID)
PLAYBOOK = Option("playbook", HELP_PLAYBOOK)


def job_plan(op: str, needs_job: bool) -> Callable[[RunState, dict], Plan]:
    def plan(run: RunState, kwargs: dict) -> Plan:
        book = None
        name = kwargs.get("job") or "extract"
        try:
            book = run.playbook(kwargs.get("playbook"))
        except ConfigError:
            if needs_job:
                raise
        if needs_job and book is not None and name not in (book.jobs or {}):
            known = ", ".join(sorted(book.jobs or {})) or "none"
            raise ConfigError(
                book.path, None, f"playbook {book.name!r} has no job {name!r} (jobs: {known})"
            )
        return Plan(op, {}, 120, book, options={**kwargs, "job": name})

    return plan


def jobs_list_plan(run: RunState, kwargs: dict) -> Plan:
    try:
        limit = int(kwargs.get("last") or 0)
    except ValueError:
        raise UsageError(f"jobs --last {kwargs.get('last')!r}: not a number of jobs") from None
    if limit < 0:
        raise UsageError(f"jobs --last {limit}: must be 0 (all) or more")
    return Plan("jobs_list", {"limit": limit}, 120, None, options=dict(kwargs))


# Each runs through the host's job backend (tasks/jobs/backend.py), chosen once per host.
def _extract(run: RunState, plan: Plan, node: Connector) -> Result:
    from . import jobs

    return jobs.run_extract(run, plan, node)


def _tail(run: RunState, plan: Plan, node: Connector) -> Result:
    from . import jobs

    return jobs.run_tail(run, plan, node)


def _status(run: RunState, plan: Plan, node: Connector) -> Result:
    from . import jobs

    return jobs.run_status(run, plan, node)


def _logs(run: RunState, plan: Plan, node: Connector) -> Result:
    from . import jobs

    return jobs.run_logs(run, plan, node)


def _stop(run: RunState, plan: Plan, node: Connector) -> Result:
    from . import jobs

    return jobs.run_stop(run, plan, node)


def _jobs(run: RunState, plan: Plan, node: Connector) -> Result:
    from . import jobs

    return jobs.run_jobs_list(run, plan, node)


def interpret_jobs(host: str, plan: Plan, answer: dict) -> Result:
    from .jobs import interpret_jobs_list

    return interpret_jobs_list(host, plan, answer)


def _diagnose_plan(run: RunState, kwargs: dict) -> Plan:
    from . import diagnose

    return diagnose.plan(run, kwargs)


def _diagnose(run: RunState, plan: Plan, node: Connector) -> Result:
    from . import diagnose

    return diagnose.run_diagnose(run, plan, node)


JOB_TASKS = [
    HostTask(
        "extract",
        job_plan("extract", True),
        run=_extract,
        writes=True,
        op="job_start",
        result="fleetops.results.jobs:Launched",
        help="Run the fast checks and the GPU gate, then launch the playbook's job detached on "
        "the node. Nothing is\nlaunched on a drained node, while the same job runs (`tail` "
        "attaches to it), or when its output is complete.",
        options=(
            Option("force", "launch even if checks or the GPU gate fail (and say so)", False),
            JOB,
            PLAYBOOK,
            JSON,
            Option(
                "shards",
                "split the dataset into shards: on SSH hosts one per selected host (--shards "
                "alone, 'all', or the number of hosts; shard i of N to the i-th host by name, "
                "plan in .fleetops/shards/<job>.json); on a Slurm login node N job array "
                "tasks",
                optional=True,
            ),
            Option(
                "again",
                "redo every sample of an output that is already complete (else: nothing to do)",
                False,
            ),
        ),
    ),
    HostTask(
        "tail",
        job_plan("tail", False),
        run=_tail,
        op="job_tail",
        result="fleetops.results.jobs:TailEnded",
        help=(
            "Follow the job's log (progress bar, failures "
            "highlighted) until it ends; exit with its status."
        ),
        options=(
            JOB_ID,
            JOB,
            PLAYBOOK,
            JSON,
            Option(
                "lines",
                "start at the last N lines (default 20; right after this command's own "
                "extract: the first line)",
                numbers=(0, None),
            ),
            Option("from_start", "replay the whole log from its first line", False),
        ),
    ),
    HostTask(
        "status",
        job_plan("status", False),
        run=_status,
        op="job_status",
        result="fleetops.results.jobs:JobStatus",
        help="The job's state (running / succeeded / failed / "
        "killed), exit status, runtime, last progress, log.",
        options=(JOB_ID, JOB, PLAYBOOK, JSON),
    ),
    HostTask(
        "logs",
        job_plan("logs", False),
        run=_logs,
        op="job_logs",
        result="fleetops.results.jobs:JobLogs",
        help="The last lines of the job's log (no follow).",
        options=(
            Option("lines", "how many lines (default 50)", 50, numbers=(1, None)),
            JOB_ID,
            JOB,
            PLAYBOOK,
            JSON,
        ),
    ),
    HostTask(
        "stop",
        job_plan("stop", False),
        run=_stop,
        writes=True,
        op="job_stop",
        result="fleetops.results.jobs:Stopped",
        help="SIGTERM the job's whole process group, SIGKILL "
        "after the grace period, confirm GPU memory is free.",
        options=(
            Option(
                "grace", "seconds between SIGTERM and SIGKILL (default 10)", 10, numbers=(0, None)
            ),
            JOB_ID,
            JSON,
        ),
    ),
    HostTask(
        "jobs",
        jobs_list_plan,
        interpret_jobs,
        run=_jobs,
        op="jobs_list",
        result="fleetops.results.jobs:JobList",
        help=(
            "The node's jobs, newest first: id, job name, "
            "state, started, runtime, exit, log and output size."
        ),
        options=(
            Option("last", "only the newest N jobs (default: all)", 0, numbers=(0, None)),
            JSON,
        ),
    ),
]

DIAGNOSE_TASKS = [
    HostTask(
        "diagnose",
        _diagnose_plan,
        run=_diagnose,
        op="diagnose",
        result="fleetops.results.diagnose:Diagnosis",
        help="What is wrong with this node? One exec: reach, clock, patch state, GPUs (ECC, "
        "remapping, Xid from the\nkernel log), the latest job (OOM kills), its processes, "
        "disk, memory, load. Verdict OK / WARN / UNKNOWN /\nCRITICAL per host; exit 0 / 20 "
        "/ 21 / 22 for the worst.",
        options=(
            Option(
                "playbook", HELP_PLAYBOOK + "; its fast checks tell patched / not patched / drifted"
            ),
            JSON,
        ),
    ),
]

TASKS = [*JOB_TASKS, *DIAGNOSE_TASKS]
