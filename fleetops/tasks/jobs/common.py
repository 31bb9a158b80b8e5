"""What the SSH and Slurm backends do alike before and after the node's own work: the job's spec as
a launch takes it, the start request, the secrets of the playbook a job came from, the logs request
and the printing of its lines; and, named once here, the helpers of tasks/plan.py, reconnect.py and
backend.py both import. The results they give alike are results/jobs.py's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...plans.jobspec import JobSpec, LogWatch, is_failure
from ...plans.jobsummary import job_summary
from ...plans.tables import bar
from ...plans.versions import judged_checks
from ...wire.connector import Connector
from ..plan import (
    agent_error,
    drained,
    job_secrets,
    job_spec,
    own_playbook_secrets,
    preflight_request,
    skipped_note,
    tail_start,
)
from ..reconnect import TAIL_WAIT_S, Reconnect, tail_request
from .backend import JobBackend, TailFollower, register

__all__ = [
    "TAIL_WAIT_S",
    "JobBackend",
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
    "skipped_note",
    "start_request",
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


def print_lines(run: RunState, label: str, lines: list[str], watch: LogWatch) -> None:
    for line in lines:
        run.reporter.job_line(label, line, is_failure(line, watch.failure), None)
