"""Every host task by name, and the one way a task runs on a host: plan (no network, once per run), then
the agent call(s), then a Result, recorded. Node trouble never raises out of here: it becomes a result."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..plans.inventory import Host, MissingSecret
from ..results import EXIT_FAILED, EXIT_INTERRUPTED, Evidence, Result, Status
from ..wire.connector import Connector, TransportError
from . import adhoc, authoring, checks, diagnose, gpu, jobs, node, oncall, patching, shards
from .plan import Plan, TaskSpec, UsageError

if TYPE_CHECKING:
    from ..state import RunState

TASKS: dict[str, TaskSpec] = {spec.name: spec for family in (node, gpu, patching, checks, adhoc, oncall, diagnose,
                                                                  authoring)
                              for spec in family.TASKS}
TASKS.update({name: TaskSpec(name, jobs.job_plan(name, name == "extract"), run=runner,
                                       dry=None if name in ("extract", "stop") else "read-only")
              for name, runner in (("extract", jobs.run_extract), ("tail", jobs.run_tail),
                                   ("status", jobs.run_status), ("logs", jobs.run_logs), ("stop", jobs.run_stop))})
TASKS["jobs"] = TaskSpec("jobs", jobs.jobs_list_plan, jobs.interpret_jobs_list)
for _name in ("extract", "status", "tail"):  # extract --shards across SSH hosts, and its fleet view
    TASKS[_name] = replace(TASKS[_name], run=shards.wrap(_name, TASKS[_name].run))  # type: ignore[arg-type]

UNREACHABLE_KINDS = ("unreachable", "hostkey", "auth", "refused")


def plan_for(run: RunState, name: str, kwargs: dict[str, Any], *, dry: bool = False) -> Plan:
    """Raises ConfigError for a bad playbook or option, UsageError for --dry on a task without a check
    mode: before anything connects."""
    spec = TASKS[name]
    if dry:
        if spec.dry is None:
            raise UsageError(f"{name} has no check mode, so --dry cannot be honoured; nothing was run")
        if spec.dry == "check":
            kwargs = {**kwargs, "check": True}
    return spec.plan(run, kwargs)


def run_on_host(run: RunState, name: str, plan: Plan, node: Connector) -> Result:
    """One task on one host; never raises for node trouble: it becomes a failed/unreachable Result."""
    started = time.monotonic()
    host = node.host.name
    spec = TASKS[name]
    try:
        if spec.run is not None:
            result = spec.run(run, plan, node)
        else:
            answer, evidence = node.call(plan.op, plan.request, timeout=plan.timeout)
            result = spec.interpret(host, plan, answer)
            if result.failed:
                result.evidence = evidence
    except Exception as exc:  # noqa: BLE001 - a bug for one host must not take the fleet down
        result = _failure(run, host, name, exc)
    result.seconds = round(time.monotonic() - started, 3)
    if plan.playbook is not None:
        result.data.setdefault("playbook", plan.playbook.name)
        result.data.setdefault("playbook_sha256", plan.playbook.sha256)
    return result


def _failure(run: RunState, host: str, name: str, exc: Exception) -> Result:
    if run.interrupted.is_set():  # our own Ctrl-C closed the link under the call: say so, not "lost"
        return Result(host, name, Status.FAILED, "interrupted (Ctrl-C) while running; the node stops it cleanly "
                      "(every file whole, old or new; its lock released)",
                      evidence=getattr(exc, "evidence", None), code=EXIT_INTERRUPTED,
                      data={"error_kind": "interrupted"})
    if isinstance(exc, TransportError):
        status = Status.UNREACHABLE if exc.kind in UNREACHABLE_KINDS else Status.FAILED
        return Result(host, name, status, str(exc), evidence=exc.evidence, code=EXIT_FAILED,
                      data={"error_kind": exc.kind})
    if isinstance(exc, MissingSecret):  # this host's secret_from_env is unset: only its tasks that need it fail
        return Result(host, name, Status.FAILED, str(exc), code=EXIT_FAILED, data={"error_kind": "secret"})
    return Result(host, name, Status.FAILED, f"internal error: {type(exc).__name__}: {exc}",
                  evidence=Evidence("(client)", None, []), code=EXIT_FAILED)


def run_task(run: RunState, name: str, plan: Plan, host: Host) -> Result:
    """The step of a host chain: the host's one connection, the task, the result recorded (and shown)."""
    try:
        node = run.connections().get(host)
    except Exception as exc:  # noqa: BLE001 - e.g. a bad ssh_config for this host: its result, not a crash
        result = _failure(run, host.name, name, exc)
    else:
        result = run_on_host(run, name, plan, node)
    run.record(result)
    return result
