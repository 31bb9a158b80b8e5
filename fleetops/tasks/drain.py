"""drain and undrain: a node taken out of service, and put back. The node keeps the mark
(<state_dir>/drain.json: who, when, why; remote_scripts/core/drainmark.py) and refuses extract and
patch while it is there; a host the inventory names as a Slurm node (`slurm_node`) is drained in
Slurm too, so the scheduler places nothing there."""

from __future__ import annotations

from dataclasses import replace
from shlex import quote
from typing import TYPE_CHECKING

from ..results import EXIT_FAILED, Item, Next, Result, Status
from ..results.drain import Drained, Undrained
from ..wire.connector import Connector
from .declare import JSON, HostTask, Option
from .plan import Plan, UsageError, agent_error

if TYPE_CHECKING:
    from ..state import RunState

REASON_MAX = 500


def _drain_plan(run: RunState, kwargs: dict) -> Plan:
    reason = str(kwargs.get("reason") or "").strip()
    if not reason:
        raise UsageError(
            "drain --reason is required: why the node is out of service (kept with who and when), "
            "e.g. --reason 'Xid 79 on GPU 3'"
        )
    if "\n" in reason or len(reason) > REASON_MAX:
        raise UsageError(f"drain --reason: one line of at most {REASON_MAX} characters")
    return Plan("drain", {"reason": reason}, 120, None)


def _undrain_plan(run: RunState, kwargs: dict) -> Plan:
    return Plan("undrain", {}, 120, None)


def _run(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host
    request = {**plan.request, "host": host.name}
    if host.slurm_node:
        request.update(
            slurm_node=host.slurm_node,
            scheduler_env={k: v for k, v in host.env_values if k.startswith("SLURM_")},
        )
    answer, evidence = node.call(plan.op, request, timeout=plan.timeout)
    if answer.get("error"):
        return agent_error(host.name, plan.op, answer, with_kind=True)
    result = _drained(host.name, answer) if plan.op == "drain" else _undrained(host.name, answer)
    return _with_slurm(result, answer.get("slurm"), plan)


def _drained(host: str, answer: dict) -> Result:
    marker = answer["drain"]
    again = f" (drained since {marker['first_at']})" if marker.get("first_at") else ""
    items = []
    job = answer.get("running_job")
    if job:  # draining stops nothing by itself: say what still runs there
        items.append(
            Item(
                "job",
                Status.OK,
                f"job {job['id']} ({job.get('name')}) still runs: drain stops nothing; "
                f"fab -H {quote(host)} stop --job-id {quote(str(job['id']))} ends it",
            )
        )
    return Result(
        host,
        "drain",
        Status.CHANGED,
        f"drained by {marker['by']} at {marker['at']}{again}: "
        f"{marker['reason']}; extract and patch refuse here until fab -H {quote(host)} undrain",
        items,
        payload=Drained(marker, job),
    )


def _undrained(host: str, answer: dict) -> Result:
    was = answer.get("was")
    if not was:
        return Result(host, "undrain", Status.OK, "was not drained", payload=Undrained(None))
    return Result(
        host,
        "undrain",
        Status.CHANGED,
        f"back in service (was drained by {was.get('by', '?')} at "
        f"{was.get('at', '?')}: {was.get('reason') or '?'})",
        payload=Undrained(was),
    )


def _with_slurm(result: Result, slurm: dict | None, plan: Plan) -> Result:
    """The Slurm side of a drain/undrain: the node's state as sinfo reports it, or the refusal and
    the command that does it by hand (fleetops' own mark stands either way)."""
    if not slurm:
        return result
    assert isinstance(result.payload, (Drained, Undrained))
    result.carry(replace(result.payload, slurm=slurm))
    done = slurm.get("command") or {}
    node = slurm.get("node")
    if done.get("rc") == 0:
        result.items.append(
            Item(
                "slurm",
                Status.CHANGED,
                f"Slurm node {node}: {slurm.get('state') or '?'}"
                + (f" ({slurm['reason']})" if slurm.get("reason") else ""),
            )
        )
        return result
    by_hand = " ".join(quote(w) for w in done.get("argv") or ["scontrol"])
    why = (done.get("stderr") or "").strip().splitlines()[-1:] or [f"exit {done.get('rc')}"]
    result.status, result.code = Status.FAILED, EXIT_FAILED
    result.msg += f"; but Slurm refused to {plan.op} node {node}: {why[0]}"
    result.carry(
        replace(
            result.payload,
            next=Next(
                "run Slurm's side by hand as its administrator (fleetops' own mark stands)",
                [by_hand],
            ),
        )
    )
    return result


TASKS = [
    HostTask(
        "drain",
        _drain_plan,
        run=_run,
        writes=True,
        op="drain",
        result=Drained,
        help="Take the node out of service: extract and patch refuse there until `undrain` "
        "(facts, status and diagnose\nsay it is drained, by whom, when, why); a host with "
        "`slurm_node` is drained in Slurm too.",
        options=(
            Option("reason", "why, on one line (e.g. 'Xid 79 on GPU 3'): kept with who and when"),
            JSON,
        ),
    ),
    HostTask(
        "undrain",
        _undrain_plan,
        run=_run,
        writes=True,
        op="undrain",
        result=Undrained,
        help=(
            "Put a drained node back in service (and its Slurm node, for a host with `slurm_node`)."
        ),
    ),
]
