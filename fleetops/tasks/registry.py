"""Every host task by name, and the one way a task runs on a host: plan (no network, once per run), then
the agent call(s), then a Result, recorded. Node trouble never raises out of here: it becomes a result."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..plans.inventory import Host
from ..results import EXIT_FAILED, Evidence, Result, Status
from ..wire.connector import Connector, TransportError
from . import checks, gpu, jobs, node, patching
from .plan import Plan, TaskSpec

if TYPE_CHECKING:
    from ..state import RunState

TASKS: dict[str, TaskSpec] = {spec.name: spec for family in (node, gpu, patching, checks)
                              for spec in family.TASKS}
TASKS.update({name: TaskSpec(name, jobs.job_plan(name, name == "extract"), run=runner)
              for name, runner in (("extract", jobs.run_extract), ("tail", jobs.run_tail),
                                   ("status", jobs.run_status), ("logs", jobs.run_logs), ("stop", jobs.run_stop))})

UNREACHABLE_KINDS = ("unreachable", "hostkey", "auth", "refused")


def plan_for(run: RunState, name: str, kwargs: dict[str, Any]) -> Plan:
    """Raises ConfigError for a bad playbook or option: before anything connects."""
    return TASKS[name].plan(run, kwargs)


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
    except TransportError as exc:
        status = Status.UNREACHABLE if exc.kind in UNREACHABLE_KINDS else Status.FAILED
        result = Result(host, name, status, str(exc), evidence=exc.evidence, code=EXIT_FAILED,
                        data={"error_kind": exc.kind})
    except Exception as exc:  # noqa: BLE001 - a bug for one host must not take the fleet down
        result = Result(host, name, Status.FAILED, f"internal error: {type(exc).__name__}: {exc}",
                        evidence=Evidence("(client)", None, []), code=EXIT_FAILED)
    result.seconds = round(time.monotonic() - started, 3)
    if plan.playbook is not None:
        result.data.setdefault("playbook", plan.playbook.name)
        result.data.setdefault("playbook_sha256", plan.playbook.sha256)
    return result


def run_task(run: RunState, name: str, plan: Plan, host: Host) -> Result:
    """The step of a host chain: the host's one connection, the task, the result recorded (and shown)."""
    result = run_on_host(run, name, plan, run.connections().get(host))
    run.record(result)
    return result
