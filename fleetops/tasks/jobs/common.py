"""What the SSH and Slurm backends do alike before and after the node's own work: the job's spec as
a launch takes it, the start request, the secrets of the playbook a job came from, the logs request
and the printing of its lines, where a tail attaches and how it ends, and a backend's five tasks as
its module's functions; and, named once here, the helpers of tasks/plan.py, reconnect.py and
backend.py both use (each backend reaches them as `common.X`). The results they give alike are
results/jobs.py's."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from ...plans.jobspec import JobSpec, LogWatch, is_failure
from ...plans.jobsummary import job_summary
from ...plans.tables import bar
from ...plans.versions import judged_checks
from ...results import Result
from ...results.events import JobLine, LinesSkipped, TailEnd
from ...results.jobs import SlurmTailEnded, TailEnded, tail_end
from ...wire.connector import Connector
from ..plan import (
    agent_error,
    drained,
    job_secrets,
    job_spec,
    own_playbook_secrets,
    preflight_request,
    tail_start,
)
from ..reconnect import TAIL_WAIT_S, Reconnect, tail_request
from .backend import JobBackend, TailFollower, register

__all__ = [
    "TAIL_WAIT_S",
    "Attach",
    "BackendTasks",
    "JobBackend",
    "TaskBackend",
    "LogWatch",
    "Reconnect",
    "TailFollower",
    "agent_error",
    "bar",
    "drained",
    "job_secrets",
    "job_spec",
    "job_summary",
    "judged_checks",
    "launch_spec",
    "logs_request",
    "own_secrets",
    "preflight_request",
    "print_lines",
    "register",
    "skipped",
    "start_request",
    "tail_attach",
    "tail_ended",
    "tail_request",
    "tail_start",
]

if TYPE_CHECKING:
    from ...plans.playbook import Playbook
    from ...state import RunState
    from ..plan import Plan


def launch_spec(plan: Plan, node: Connector) -> JobSpec:
    """The job extract launches: the playbook's, redone from its first sample with --again, with the
    inventory's environment (tokens, SLURM_CONF) over the playbook's and the host's secrets among
    the job's."""
    spec = job_spec(plan, node)
    # extract's plan found the job in the playbook
    assert spec is not None and plan.playbook is not None
    if spec.extract is not None and plan.options.get("again"):
        spec.extract["again"] = True  # the driver starts a new manifest: every sample done again
    spec.env.update(dict(node.host.env))
    spec.secret_env |= set(node.host.secret_env)
    return spec


def start_request(spec: JobSpec, playbook: Playbook) -> dict[str, Any]:
    request = spec.start_request()
    # tail, logs and status mask its secrets, whatever -p
    request["job"]["playbook"] = str(playbook.path)
    return request


def own_secrets(run: RunState, node: Connector, job: dict) -> list[str]:
    """The secrets of the playbook the job was launched from (its record names it): loading it
    registers them, so what the job printed shows them masked."""
    return own_playbook_secrets(
        run, node, {"playbook": job.get("playbook"), "job_name": job.get("name")}
    )


def logs_request(plan: Plan, node: Connector) -> tuple[dict[str, Any], LogWatch]:
    """logs' request (which job, how many lines, what to mask) and the job's watch for failure
    lines."""
    spec = job_spec(plan, node)
    request: dict[str, Any] = {
        "job_id": plan.options.get("job_id"),
        "lines": int(plan.options.get("lines") or 50),
        "mask": job_secrets(spec, node.host),
    }
    return request, LogWatch.of(spec)


def skipped(label: str, job_id: str, skip: dict) -> LinesSkipped:
    """What an attaching tail leaves out (the node starts at the last N lines)."""
    return LinesSkipped(label, job_id, skip.get("skipped_lines"), skip["skipped_bytes"])


def print_lines(run: RunState, label: str, lines: list[str], watch: LogWatch) -> None:
    for line in lines:
        run.emit(JobLine(label, line, is_failure(line, watch.failure)))


class Attach(NamedTuple):
    """Where a tail attaches: the job's watch for progress and failure lines, which job (None: the
    latest), how many of its last lines (None: the node's default), whether from its first byte,
    and the secrets masked in what it printed."""

    watch: LogWatch
    job_id: str | None
    last_lines: int | None
    from_start: bool
    secrets: list[str]


def tail_attach(run: RunState, plan: Plan, node: Connector) -> Attach | Result:
    """Attach, for either backend; a Result is tail's usage error (a --lines that is no number)."""
    spec = job_spec(plan, node)
    watch = LogWatch.of(spec)
    start = tail_start(run, plan, node.host.name)
    if isinstance(start, Result):
        return start
    job_id, last_lines, from_start = start
    return Attach(watch, job_id, last_lines, from_start, job_secrets(spec, node.host))


def tail_ended(
    run: RunState,
    host: str,
    job_id: str | None,
    end: str,
    code: int,
    progress: Iterable[dict[str, Any] | None],
    payload: TailEnded | SlurmTailEnded,
) -> Result:
    """A tail's end, either backend: how the job ended, said on the console, and the result's line
    with what the job did too (its last progress, every task's summed), not only how it ended."""
    run.emit(TailEnd(host, job_id, end))
    summary = job_summary(progress)
    msg = f"job {job_id} {end}" + (f"; {summary}" if summary else "")
    return tail_end(host, code, msg, payload)


Task = Callable[["RunState", "Plan", Connector], Result]


class BackendTasks(NamedTuple):
    """A backend's five tasks, its module's functions."""

    launch: Task
    status: Task
    tail: Callable[[RunState, Plan, Connector, TailFollower | None], Result]
    logs: Task
    stop: Task


class TaskBackend(JobBackend):
    """A backend whose five tasks are functions of its module (`tasks`), named once."""

    tasks: ClassVar[BackendTasks]

    def launch(self, run: RunState, plan: Plan, node: Connector) -> Result:
        return self.tasks.launch(run, plan, node)

    def status(self, run: RunState, plan: Plan, node: Connector) -> Result:
        return self.tasks.status(run, plan, node)

    def tail(
        self, run: RunState, plan: Plan, node: Connector, follow: TailFollower | None = None
    ) -> Result:
        return self.tasks.tail(run, plan, node, follow)

    def logs(self, run: RunState, plan: Plan, node: Connector) -> Result:
        return self.tasks.logs(run, plan, node)

    def stop(self, run: RunState, plan: Plan, node: Connector) -> Result:
        return self.tasks.stop(run, plan, node)
