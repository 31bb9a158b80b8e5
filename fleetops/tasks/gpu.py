"""gpu (the preflight gate, polled with --wait) and facts (what the node runs): read-only looks at a node."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from ..plans.gpugate import DEFAULT_THRESHOLD_MIB, Gate, Verdict, evaluate, next_action, parse_selection
from ..plans.tables import FACT_COLUMNS, GPU_COLUMNS, fact_row, gpu_rows
from ..plans.yamlsrc import ConfigError
from ..results import EXIT_GPU_BUSY, Next, Result, Status
from ..wire.connector import Connector
from .jobs.backend import backend_for
from .plan import Plan, TaskSpec, drain_text, unmet_warnings

if TYPE_CHECKING:
    from ..state import RunState


def _gpu_plan(run: RunState, kwargs: dict) -> Plan:
    try:
        select = parse_selection(kwargs.get("gpus"))
    except ValueError as exc:
        raise ConfigError("--gpus", None, str(exc)) from None
    threshold = int(kwargs.get("threshold") or DEFAULT_THRESHOLD_MIB)
    return Plan("gpu", {}, 60, None, options={"gate": Gate(threshold, select), "wait": float(kwargs.get("wait") or 0)})


def _interpret_gpu(host: str, plan: Plan, answer: dict) -> Result:
    return _judge(host, plan, answer)[0]


def _judge(host: str, plan: Plan, answer: dict) -> tuple[Result, Verdict]:
    """The gate's result, its line led by the verdict word (`WARN: 0/2 selected GPUs free; 2 busy`); anything but
    OK fails the step, so a chain `gpu extract` stops. data["next"] is the one next action (console.py prints it
    once under the result, so once per folded group)."""
    verdict = evaluate(answer, plan.options["gate"])
    status = Status.OK if verdict.code == 0 else Status.FAILED
    nxt = next_action(host, verdict)
    data = {"table": {"title": f"{host}: GPUs", "columns": GPU_COLUMNS, "rows": gpu_rows(verdict)},
            "gpus": answer.get("gpus", []), "holders": verdict.holders, "error_kind": answer.get("error_kind"),
            "verdict": verdict.word, "next": nxt.to_data() if nxt else None}
    return Result(host, "gpu", status, f"{verdict.word}: {verdict.msg}", verdict.items, code=verdict.code,
                  data=data), verdict


def _run_gpu(run: RunState, plan: Plan, node: Connector) -> Result:
    """Poll (one exec each) until the selected GPUs are free or --wait runs out."""
    backend = backend_for(node.host)
    if backend.allocates:  # a login node: the GPUs are those of our job's allocation
        allocated = backend.allocation_gpus(run, plan, node)
        if allocated is not None:
            return allocated
    gate = replace(plan.options["gate"], expected=node.host.gpus)
    plan = Plan(plan.op, plan.request, plan.timeout, None, options={**plan.options, "gate": gate})
    deadline = None
    while True:
        answer, evidence = node.call("gpu", {}, timeout=plan.timeout)
        if deadline is None:  # the wait starts once the node has answered (connecting is not waiting)
            waiting_since = time.monotonic()
            deadline = waiting_since + plan.options["wait"]
        result, verdict = _judge(node.host.name, plan, answer)
        remaining = deadline - time.monotonic()
        if result.code != EXIT_GPU_BUSY or remaining <= 0:
            break
        run.reporter.waiting(node.host.name, "gpu", verdict.msg, remaining)
        time.sleep(min(1.0, max(remaining, 0.01)))
        if time.monotonic() >= deadline:
            break  # the deadline came during the pause: decide on a snapshot at most 1 s old, now
    result.data["waited_s"] = round(time.monotonic() - waiting_since, 3)
    if node.host.lab:
        result.data["simulated"] = True
        result.data["table"]["title"] += " (simulated: lab replay of recorded H200 nvidia-smi output)"
    if plan.options["wait"] and result.code == EXIT_GPU_BUSY:
        result.msg = (f"{verdict.word}: still busy after waiting {plan.options['wait']:.0f}s: "
                      + "; ".join(result.data["holders"]))
    if result.failed:
        result.evidence = evidence
    return result


def _facts_plan(run: RunState, kwargs: dict) -> Plan:
    return Plan("facts", {"dists": True}, 60, None)


def _interpret_facts(host: str, plan: Plan, answer: dict) -> Result:
    if not answer.get("ok", True) or answer.get("error"):  # the op itself failed: nothing it read is a fact
        why = str(answer.get("error") or "the node's facts op failed")
        row = [f"ERROR: {why}"] + ["-"] * (len(FACT_COLUMNS) - 1)
        return Result(host, "facts", Status.FAILED, f"cannot read the node's facts: {why}",
                      data={"facts": answer, "fact_row": row, "next": _facts_next(host)})
    answer = dict(answer)
    warnings = unmet_warnings(answer.pop("dists", None))
    errors = answer.get("errors") or {}
    row = fact_row(answer)
    for reader, why in errors.items():  # the reader's error in its own cell
        if reader in FACT_COLUMNS:
            row[FACT_COLUMNS.index(reader)] = f"ERROR: {why}"
    if errors:
        data = {"facts": answer, "fact_row": row, "next": _facts_next(host)}
        return Result(host, "facts", Status.FAILED, "cannot read all of the node's facts: "
                      + "; ".join(f"{k}: {v}" for k, v in errors.items()), data=data)
    drained = drain_text(answer.get("drain"))  # first: a drained node is the fact an on-call engineer needs
    data = {"facts": {**answer, "unmet_requirements": warnings}, "fact_row": row}
    if warnings:
        data["node_warnings"] = warnings
    return Result(host, "facts", Status.OK, (f"{drained}; " if drained else "")
                  + ", ".join(f"{k}={v}" for k, v in zip(FACT_COLUMNS, row)), data=data)


def _facts_next(host: str) -> dict:
    return Next("give the login user read access to the venv, or set `become: sudo` for this host in the "
                "inventory, then run it again", [f"fab -H {host} facts"]).to_data()


TASKS = [TaskSpec("gpu", _gpu_plan, _interpret_gpu, _run_gpu),
         TaskSpec("facts", _facts_plan, _interpret_facts)]
