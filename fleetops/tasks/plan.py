"""What every task is made of: a Plan (built once per run, before any connection, from the task's
options) and a TaskSpec (how to plan it, how to read the agent's answer, or a run() of its own for
tasks that poll)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from shlex import quote
from typing import TYPE_CHECKING

from ..plans.host import Host
from ..plans.playbook import Playbook
from ..plans.playbookset import PlaybookSet
from ..results import EXIT_FAILED, Next, Result, Status
from ..results.refusal import AgentRefusal, DrainedRefusal, KindedRefusal
from ..wire.connector import Connector

if TYPE_CHECKING:
    from ..plans.jobspec import JobSpec
    from ..state import RunState


class UsageError(Exception):
    """The command line asks for something that cannot be done (a missing argument, --dry on a task
    with no check mode, --limit matching nothing). Exit 2; no request was sent to any node."""


@dataclass
class Plan:
    op: str
    request: dict
    timeout: float
    playbook: Playbook | None
    check: bool = False
    options: dict = field(default_factory=dict)
    # A playbook set (-p DIR): this task's plan for each playbook of the set (or why it has none),
    # by name; the host's installed versions choose one when the step runs
    # (tasks/registry.py:for_host).
    book_set: PlaybookSet | None = None
    by_playbook: dict[str, Plan | str] = field(default_factory=dict)


@dataclass
class TaskSpec:
    name: str
    plan: Callable[[RunState, dict], Plan]
    interpret: Callable[[str, Plan, dict], Result] | None = None
    # Tasks that need more than one agent call (polling) bring their own loop.
    run: Callable[[RunState, Plan, Connector], Result] | None = None
    # What --dry means for it: "check" (its check mode), "read-only" (it changes nothing: runs as
    # is), None (it changes things and has no check mode: --dry is refused, exit 2).
    dry: str | None = "read-only"


def agent_error(host: str, task: str, answer: dict, *, with_kind: bool = False) -> Result:
    """The failed result for an answer with an "error" (a NodeError or an OSError on the node)."""
    refusal = KindedRefusal(answer.get("error_kind")) if with_kind else AgentRefusal()
    return Result(host, task, Status.FAILED, answer["error"], code=EXIT_FAILED, payload=refusal)


def drained(host: str, task: str, marker: dict, doing: str) -> Result:
    """The refusal of work on a node marked drained (`fab drain`): who drained it, when and why, and
    the one command that puts it back in service."""
    why = marker.get("reason") or "no reason given"
    return Result(
        host,
        task,
        Status.FAILED,
        f"refused to {doing}: {host} is drained (by {marker.get('by', '?')} at "
        f"{marker.get('at', '?')}: {why}); undrain it once it is fixed",
        code=EXIT_FAILED,
        payload=DrainedRefusal(
            marker,
            Next("put it back in service once it is fixed", [f"fab -H {quote(host)} undrain"]),
        ),
    )


def drain_text(marker: dict | None) -> str:
    """A drained node, in the words status and facts add to their line ("" when it is not
    drained)."""
    if not marker:
        return ""
    return (
        f"DRAINED by {marker.get('by', '?')} at {marker.get('at', '?')}: "
        f"{marker.get('reason') or '?'}"
    )


def tail_start(
    run: RunState, plan: Plan, host: str
) -> tuple[str | None, int | None, bool] | Result:
    """Where a `tail` attaches, for SSH jobs and Slurm alike: (job id, last N lines, from the
    start), or the usage error of a --lines that is not a number. Right after this run's own
    `extract` it replays the job from its first line (nothing of it was shown yet); else the node
    starts at the last N lines."""
    job_id = plan.options.get("job_id")
    lines = plan.options.get("lines")
    try:
        last_lines = int(lines) if lines not in (None, "") else None
    except ValueError:
        return Result(
            host, "tail", Status.FAILED, f"tail --lines {lines!r}: not a number of lines", code=2
        )
    from_start = bool(plan.options.get("from_start"))
    launched = run.launched.get(host)
    if launched and job_id in (None, launched) and last_lines is None:
        # `extract tail`: this run launched it and has shown none of it yet
        job_id, from_start = launched, True
    elif job_id is None:
        # `extract tail` found the job already running: attach to that one
        job_id = run.attach.get(host)
    return job_id, last_lines, from_start


def job_spec(plan: Plan, node: Connector) -> JobSpec | None:
    """The playbook job the options name (`extract` when none), resolved for the node's groups; None
    when the playbook has no such job (status, logs and tail then read with the default
    patterns)."""
    # a job's module is imported by the tasks that run one (a playbook's jobs: parsed with it)
    from ..plans.jobspec import resolve

    book = plan.playbook
    name = plan.options.get("job") or "extract"
    jobs = book.jobs if book is not None else None
    if not jobs or name not in jobs:
        return None
    return resolve(name, jobs[name], node.host.groups)


def job_secrets(spec: JobSpec | None, host: Host) -> list[str]:
    """The forms of the job's secret values (the playbook's secret_env, the host's own secrets):
    what the node masks in the job's log before it cuts a long line. Never another host's
    secrets."""
    from ..redaction import forms

    values = [spec.env[k] for k in spec.secret_env if k in spec.env] if spec is not None else []
    # not .env: a missing one is not sent
    values += [v for k, v in host.env_values if k in host.secret_env]
    return sorted({f for v in values for f in forms(str(v))})


def own_playbook_secrets(run: RunState, node: Connector, answer: dict) -> list[str]:
    """The job's secrets as the playbook it was started from says (the job record names its path and
    the job): a job started with another playbook, or another job, than this run names is masked
    too. [] when the record names none, or the file is gone or no longer has the job."""
    from ..plans.yamlsrc import ConfigError

    path, name = answer.get("playbook"), answer.get("job_name")
    if not isinstance(path, str) or not isinstance(name, str):
        return []
    try:
        book = run.playbook(path)
    except (ConfigError, OSError):
        return []
    jobs = book.jobs or {}
    if name not in jobs:
        return []
    from ..plans.jobspec import resolve

    return job_secrets(resolve(name, jobs[name], node.host.groups), node.host)


def preflight_request(playbook: Playbook, spec: JobSpec) -> dict:
    """The agent's `preflight` request for the job's checks; the pins are checked only when the job
    asks."""
    request = playbook.verify_request(set(spec.preflight))
    if "requires" not in spec.preflight:
        request["requires"] = []
    return request


def skipped_note(label: str, job_id: str, skip: dict) -> str:
    """What an attaching tail leaves out (the node starts at the last N lines) and how to see it."""
    count = skip.get("skipped_lines")
    return (
        f"{label} | job {job_id}: {count if count is not None else 'the'} earlier lines not shown "
        f"({skip['skipped_bytes']} bytes); --from-start replays them"
    )


def unmet_warnings(dists: object) -> list[str]:
    """The node's installed packages checked against each other, as `pip check` would (the answer's
    `dists`, read by the agent: remote_scripts/core/dists.py): one warning per unmet requirement, []
    when all are met or the node did not say."""
    if not isinstance(dists, dict):
        return []
    from ..plans.pipcheck import Refused, unmet  # packaging, for the tasks that ask

    try:
        found = unmet(dists)
    except Refused as exc:
        return [
            f"pip check not done: {exc}; a real venv's "
            "metadata is far smaller: not a faithful node?"
        ]
    if not found:
        return []
    shown = [
        "the installed packages do not satisfy each other "
        f"({len(found)} unmet, as pip check finds them): "
        "not a faithful node; what runs here may fail in ways the checks cannot see"
    ]
    shown += [f"pip check: {u}" for u in found[:10]]
    if len(found) > 10:
        shown.append(f"pip check: and {len(found) - 10} more (--json for all)")
    return shown
