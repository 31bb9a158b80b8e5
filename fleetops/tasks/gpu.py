"""gpu (the preflight gate, polled with --wait) and facts (what the node runs): read-only looks at a
node."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from ..plans.gpugate import (
    DEFAULT_THRESHOLD_MIB,
    Gate,
    Verdict,
    evaluate,
    next_action,
    parse_selection,
)
from ..plans.tables import FACT_COLUMNS, GPU_COLUMNS, fact_row, gpu_rows
from ..plans.yamlsrc import ConfigError
from ..results import EXIT_GPU_BUSY, Next, Result, Status
from ..results.events import Waiting
from ..results.gpu import Facts, GpuGate
from ..wire.connector import Connector
from .declare import JSON, HostTask, Option
from .plan import Plan, drain_text, unmet_warnings

if TYPE_CHECKING:
    from ..state import RunState


def _gpu_plan(run: RunState, kwargs: dict) -> Plan:
    try:
        select = parse_selection(kwargs.get("gpus"))
    except ValueError as exc:
        raise ConfigError("--gpus", None, str(exc)) from None
    threshold = int(kwargs.get("threshold") or DEFAULT_THRESHOLD_MIB)
    return Plan(
        "gpu",
        {},
        60,
        None,
        options={"gate": Gate(threshold, select), "wait": float(kwargs.get("wait") or 0)},
    )


def _interpret_gpu(host: str, plan: Plan, answer: dict) -> Result:
    return _judge(host, plan, answer)[0]


def _judge(host: str, plan: Plan, answer: dict) -> tuple[Result, Verdict]:
    """The gate's result, its line led by the verdict word (`WARN: 0/2 selected GPUs free; 2 busy`);
    anything but OK fails the step, so a chain `gpu extract` stops. Its `next` is the one next
    action (console.py prints it once under the result, so once per folded group)."""
    verdict = evaluate(answer, plan.options["gate"])
    status = Status.OK if verdict.code == 0 else Status.FAILED
    nxt = next_action(host, verdict)
    gate = GpuGate(
        {"title": f"{host}: GPUs", "columns": GPU_COLUMNS, "rows": gpu_rows(verdict)},
        answer.get("gpus", []),
        verdict.holders,
        answer.get("error_kind"),
        verdict.word,
        nxt,
    )
    return Result(
        host,
        "gpu",
        status,
        f"{verdict.word}: {verdict.msg}",
        verdict.items,
        code=verdict.code,
        payload=gate,
    ), verdict


def _run_gpu(run: RunState, plan: Plan, node: Connector) -> Result:
    """Poll (one exec each) until the selected GPUs are free or --wait runs out."""
    # the jobs family only for gpu's run, not for the task table
    from .jobs.backend import backend_for

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
        # the wait starts once the node has answered (connecting is not waiting)
        if deadline is None:
            waiting_since = time.monotonic()
            deadline = waiting_since + plan.options["wait"]
        result, verdict = _judge(node.host.name, plan, answer)
        remaining = deadline - time.monotonic()
        if result.code != EXIT_GPU_BUSY or remaining <= 0:
            break
        run.emit(Waiting(node.host.name, "gpu", verdict.msg, remaining))
        time.sleep(min(1.0, max(remaining, 0.01)))
        if time.monotonic() >= deadline:
            break  # the deadline came during the pause: decide on a snapshot at most 1 s old, now
    gate = result.payload
    assert isinstance(gate, GpuGate)
    gate = replace(gate, waited_s=round(time.monotonic() - waiting_since, 3))
    if node.host.lab:
        title = f"{gate.table['title']} (simulated: lab replay of recorded H200 nvidia-smi output)"
        gate = replace(gate, simulated=True, table={**gate.table, "title": title})
    result.carry(gate)
    if plan.options["wait"] and result.code == EXIT_GPU_BUSY:
        result.msg = (
            f"{verdict.word}: still busy after waiting {plan.options['wait']:.0f}s: "
            + "; ".join(gate.holders)
        )
    if result.failed:
        result.evidence = evidence
    return result


def _facts_plan(run: RunState, kwargs: dict) -> Plan:
    return Plan("facts", {"dists": True}, 60, None)


def _interpret_facts(host: str, plan: Plan, answer: dict) -> Result:
    # the op itself failed: nothing it read is a fact
    if not answer.get("ok", True) or answer.get("error"):
        why = str(answer.get("error") or "the node's facts op failed")
        row = [f"ERROR: {why}"] + ["-"] * (len(FACT_COLUMNS) - 1)
        return Result(
            host,
            "facts",
            Status.FAILED,
            f"cannot read the node's facts: {why}",
            payload=Facts(answer, row, _facts_next(host)),
        )
    answer = dict(answer)
    warnings = unmet_warnings(answer.pop("dists", None))
    errors = answer.get("errors") or {}
    row = fact_row(answer)
    for reader, why in errors.items():  # the reader's error in its own cell
        if reader in FACT_COLUMNS:
            row[FACT_COLUMNS.index(reader)] = f"ERROR: {why}"
    if errors:
        return Result(
            host,
            "facts",
            Status.FAILED,
            "cannot read all of the node's facts: "
            + "; ".join(f"{k}: {v}" for k, v in errors.items()),
            payload=Facts(answer, row, _facts_next(host)),
        )
    # first: a drained node is the fact an on-call engineer needs
    drained = drain_text(answer.get("drain"))
    notes = {"node_warnings": warnings} if warnings else {}
    return Result(
        host,
        "facts",
        Status.OK,
        (f"{drained}; " if drained else "")
        + ", ".join(f"{k}={v}" for k, v in zip(FACT_COLUMNS, row)),
        payload=Facts({**answer, "unmet_requirements": warnings}, row),
        data=notes,
    )


def _facts_next(host: str) -> Next:
    return Next(
        "give the login user read access to the venv, or set `become: sudo` for this host in the "
        "inventory, then run it again",
        [f"fab -H {host} facts"],
    )


TASKS = [
    HostTask(
        "gpu",
        _gpu_plan,
        _interpret_gpu,
        _run_gpu,
        op="gpu",
        result=GpuGate,
        help="GPU preflight: every GPU there, healthy and free? Who holds the busy ones?",
        options=(
            Option("gpus", "only these GPU indices, e.g. 0,1,2,3"),
            Option(
                "threshold",
                f"MiB above which a GPU is busy ({DEFAULT_THRESHOLD_MIB})",
                DEFAULT_THRESHOLD_MIB,
                numbers=(0, None),
            ),
            Option(
                "wait", "poll up to this many seconds for the GPUs to be free", 0, numbers=(0, None)
            ),
            JSON,
        ),
    ),
    HostTask(
        "facts",
        _facts_plan,
        _interpret_facts,
        op="facts",
        result=Facts,
        help=(
            "OS, target python, vllm/speculators/torch/transformers "
            "versions, driver, CUDA, GPUs, free disk."
        ),
    ),
]
