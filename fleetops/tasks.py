"""The host tasks (patch, rollback, verify, ...): plan without a network, then one agent call per host."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .invocation import Invocation
from .playbook import Playbook
from .results import EXIT_FAILED, Evidence, Item, Result, Status, rollup
from .transport import NodeConnection, TransportError

CHANGED_WORDS = {"applied", "restored"}
WOULD_WORDS = {"would_apply", "would_restore"}
NOOP_WORDS = {"already_applied", "already_original"}


@dataclass
class Plan:
    op: str
    request: dict
    timeout: float
    playbook: Playbook | None
    check: bool = False
    options: dict = field(default_factory=dict)


@dataclass
class TaskSpec:
    name: str
    plan: Callable[[Invocation, dict], Plan]
    interpret: Callable[[str, Plan, dict], Result]
    # Tasks that need more than one agent call (polling) bring their own loop.
    run: Callable[[Invocation, Plan, NodeConnection], Result] | None = None


def _patch_plan(op: str) -> Callable[[Invocation, dict], Plan]:
    def plan(inv: Invocation, kwargs: dict) -> Plan:
        book = inv.playbook(kwargs.get("playbook"))
        if not book.patches:
            from .yamlsrc import ConfigError

            raise ConfigError(book.path, None, f"playbook {book.name!r} has no patches to {op}")
        check = bool(kwargs.get("check"))
        return Plan(op, book.patch_request(check), 180, book, check)

    return plan


def _interpret_patch(host: str, plan: Plan, answer: dict) -> Result:
    if answer.get("error"):
        return Result(host, plan.op, Status.FAILED, answer["error"], code=EXIT_FAILED,
                      data={"error_kind": answer.get("error_kind")})
    items = []
    for raw in answer["items"]:
        word = raw["status"]
        if word in CHANGED_WORDS or word in WOULD_WORDS:
            status = Status.CHANGED
        elif word in NOOP_WORDS:
            status = Status.OK
        else:
            status = Status.FAILED
        details = {k: raw[k] for k in ("file", "sha256", "original_sha256", "drift", "diff_text", "notes",
                                       "requirements", "bytecode_removed") if k in raw}
        details["show_diff"] = plan.check
        items.append(Item(raw.get("module") or "requirements", status, raw["msg"], details))
    status = rollup(items)
    counts: dict[str, int] = {}
    for raw in answer["items"]:
        counts[raw["status"]] = counts.get(raw["status"], 0) + 1
    msg = ", ".join(f"{n} {word.replace('_', ' ')}" for word, n in counts.items())
    if plan.check:
        msg += " (check mode: nothing written)"
    return Result(host, plan.op, status, msg, items, data={"check_mode": plan.check,
                                                           "playbook": plan.playbook.name if plan.playbook else None})


def _verify_plan(inv: Invocation, kwargs: dict) -> Plan:
    book = inv.playbook(kwargs.get("playbook"))
    kinds = set(kwargs["kinds"].split(",")) if kwargs.get("kinds") else None
    request = book.verify_request(kinds)
    if not request["checks"]:
        from .yamlsrc import ConfigError

        raise ConfigError(book.path, None, f"playbook {book.name!r} has no checks"
                                           + (f" of kinds {sorted(kinds)}" if kinds else ""))
    return Plan("verify", request, 900, book)


def _interpret_verify(host: str, plan: Plan, answer: dict) -> Result:
    if answer.get("error"):
        return Result(host, "verify", Status.FAILED, answer["error"], code=EXIT_FAILED)
    items = []
    for raw in answer["items"]:
        keys = ("evidence", "proves", "cannot", "file", "details", "seconds") + (() if raw["ok"] else ("stderr_tail",))
        details = {k: raw[k] for k in keys if raw.get(k)}
        label = f"{raw['name']} [{raw['kind']}]"
        items.append(Item(label, Status.OK if raw["ok"] else Status.FAILED, raw["msg"], details))
    passed = sum(1 for i in items if i.status is Status.OK)
    status = Status.OK if passed == len(items) else Status.FAILED
    return Result(host, "verify", status, f"{passed}/{len(items)} checks passed", items,
                  data={"playbook": plan.playbook.name if plan.playbook else None})


def _ping_plan(inv: Invocation, kwargs: dict) -> Plan:
    return Plan("ping", {}, 60, None)


def _interpret_ping(host: str, plan: Plan, answer: dict) -> Result:
    return Result(host, "ping", Status.OK, f"agent answers: python {answer['version']} at {answer['python']}",
                  data={"python": answer["python"], "version": answer["version"]})


def _gpu_plan(inv: Invocation, kwargs: dict) -> Plan:
    from .gpu import Gate, parse_selection

    try:
        select = parse_selection(kwargs.get("gpus"))
    except ValueError as exc:
        from .yamlsrc import ConfigError

        raise ConfigError("--gpus", None, str(exc)) from None
    threshold = int(kwargs.get("threshold") or 1024)
    return Plan("gpu", {}, 60, None, options={"gate": Gate(threshold, select), "wait": float(kwargs.get("wait") or 0)})


def _interpret_gpu(host: str, plan: Plan, answer: dict) -> Result:
    from .gpu import GPU_COLUMNS, evaluate

    verdict = evaluate(answer, plan.options["gate"])
    status = Status.OK if verdict.code == 0 else Status.FAILED
    data = {"table": {"title": f"{host}: GPUs", "columns": GPU_COLUMNS, "rows": verdict.rows},
            "gpus": answer.get("gpus", []), "holders": verdict.holders, "error_kind": answer.get("error_kind")}
    return Result(host, "gpu", status, verdict.msg, verdict.items, code=verdict.code, data=data)


def _run_gpu(inv: Invocation, plan: Plan, node: NodeConnection) -> Result:
    """Poll (one exec each) until the selected GPUs are free or --wait runs out."""
    from dataclasses import replace

    from .results import EXIT_GPU_BUSY

    gate = replace(plan.options["gate"], expected=node.host.gpus)
    plan = Plan(plan.op, plan.request, plan.timeout, None, options={**plan.options, "gate": gate})
    deadline = None
    while True:
        answer, evidence = node.call("gpu", {}, timeout=plan.timeout)
        if deadline is None:  # the wait starts once the node has answered (connecting is not waiting)
            waiting_since = time.monotonic()
            deadline = waiting_since + plan.options["wait"]
        result = _interpret_gpu(node.host.name, plan, answer)
        remaining = deadline - time.monotonic()
        if result.code != EXIT_GPU_BUSY or remaining <= 0:
            break
        inv.reporter.note(f"{node.host.name} | gpu | waiting: {result.msg}; {remaining:.0f}s left")
        time.sleep(min(1.0, max(remaining, 0.01)))
        if time.monotonic() >= deadline:
            break  # the deadline came during the pause: decide on a snapshot at most 1 s old, now
    result.data["waited_s"] = round(time.monotonic() - waiting_since, 3)
    if node.host.lab:
        result.data["simulated"] = True
        result.data["table"]["title"] += " (simulated: lab replay of recorded H200 nvidia-smi output)"
    if plan.options["wait"] and result.code == EXIT_GPU_BUSY:
        result.msg = f"still busy after waiting {plan.options['wait']:.0f}s: " + "; ".join(result.data["holders"])
    if result.failed:
        result.evidence = evidence
    return result


def _trust_plan(inv: Invocation, kwargs: dict) -> Plan:
    return Plan("trust", {}, 30, None, options={"fingerprint": kwargs.get("fingerprint")})


def _run_trust(inv: Invocation, plan: Plan, node: NodeConnection) -> Result:
    from .transport import trust_host

    outcome, msg = trust_host(node.host, inv.inventory, plan.options["fingerprint"])
    status = {"trusted": Status.CHANGED, "already": Status.OK}.get(outcome, Status.FAILED)
    return Result(node.host.name, "trust", status, msg, code=EXIT_FAILED if status is Status.FAILED else 0)


def _facts_plan(inv: Invocation, kwargs: dict) -> Plan:
    return Plan("facts", {}, 60, None)


FACT_COLUMNS = ["os", "python", "vllm", "speculators", "torch", "transformers", "driver", "cuda", "gpus",
                "venv free GiB", "state free GiB"]


def fact_row(answer: dict) -> list[str]:
    pk = answer.get("packages", {})
    disk = answer.get("disk_free_gib", {})
    gpus = f"{answer.get('gpu_count')} x {', '.join(answer.get('gpu_names') or []) or '-'}"
    return [str(v) for v in (answer.get("os"), answer.get("python"), pk.get("vllm"), pk.get("speculators"),
                             pk.get("torch"), pk.get("transformers"), answer.get("driver"), answer.get("cuda"),
                             gpus, disk.get("venv"), disk.get("state_dir"))]


def _interpret_facts(host: str, plan: Plan, answer: dict) -> Result:
    row = fact_row(answer)
    return Result(host, "facts", Status.OK, ", ".join(f"{k}={v}" for k, v in zip(FACT_COLUMNS, row)),
                  data={"facts": answer, "fact_row": row})


def fleet_sections(results: list[Result]) -> list[dict]:
    """Tables that compare hosts, shown after the per-host lines."""
    sections = []
    gpu = [r for r in results if r.task == "gpu"]
    if len(gpu) > 1:
        rows = []
        for r in gpu:
            states: dict[str, int] = {}
            for item in r.items:
                states[item.details.get("state", "?")] = states.get(item.details.get("state", "?"), 0) + 1
            rows.append([r.host, r.status.value, ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or r.msg])
        sections.append({"title": "GPU fleet summary", "columns": ["host", "gate", "GPUs"], "rows": rows})
    facts = [r for r in results if r.task == "facts" and "fact_row" in r.data]
    if facts:
        # One row per fact, one column per host: reads well for a few hosts and many facts.
        rows, differ = [], []
        for i, name in enumerate(FACT_COLUMNS):
            values = [r.data["fact_row"][i] for r in facts]
            rows.append([name, *values])
            if len(set(values)) > 1:
                differ.append(len(rows) - 1)
        sections.append({"title": "facts (rows that differ between hosts are highlighted)",
                         "columns": ["fact", *[r.host for r in facts]], "rows": rows, "highlight_rows": differ})
    return sections


def _jobs_tasks() -> dict[str, TaskSpec]:
    from . import jobtasks as jt

    def unused(host: str, plan: Plan, answer: dict) -> Result:  # these tasks bring their own run()
        raise AssertionError("job tasks interpret in their run()")

    return {
        "extract": TaskSpec("extract", jt.job_plan("extract", True), unused, jt.run_extract),
        "tail": TaskSpec("tail", jt.job_plan("tail", False), unused, jt.run_tail),
        "status": TaskSpec("status", jt.job_plan("status", False), unused, jt.run_status),
        "logs": TaskSpec("logs", jt.job_plan("logs", False), unused, jt.run_logs),
        "stop": TaskSpec("stop", jt.job_plan("stop", False), unused, jt.run_stop),
    }


TASKS: dict[str, TaskSpec] = {
    "ping": TaskSpec("ping", _ping_plan, _interpret_ping),
    "gpu": TaskSpec("gpu", _gpu_plan, _interpret_gpu, _run_gpu),
    "facts": TaskSpec("facts", _facts_plan, _interpret_facts),
    "trust": TaskSpec("trust", _trust_plan, _interpret_ping, _run_trust),
    "patch": TaskSpec("patch", _patch_plan("patch"), _interpret_patch),
    "rollback": TaskSpec("rollback", _patch_plan("rollback"), _interpret_patch),
    "verify": TaskSpec("verify", _verify_plan, _interpret_verify),
}


TASKS.update(_jobs_tasks())


def plan_for(inv: Invocation, name: str, kwargs: dict) -> Plan:
    return TASKS[name].plan(inv, kwargs)


def run_on_host(inv: Invocation, name: str, plan: Plan, node: NodeConnection) -> Result:
    """One task on one host; never raises for node trouble: it becomes a failed/unreachable Result."""
    started = time.monotonic()
    host = node.host.name
    spec = TASKS[name]
    try:
        if spec.run is not None:
            result = spec.run(inv, plan, node)
        else:
            answer, evidence = node.call(plan.op, plan.request, timeout=plan.timeout)
            result = spec.interpret(host, plan, answer)
            if result.failed:
                result.evidence = evidence
    except TransportError as exc:
        status = Status.UNREACHABLE if exc.kind in ("unreachable", "hostkey", "auth", "refused") else Status.FAILED
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


def host_task(inv: Invocation, name: str, host_name: str, kwargs: dict[str, Any]) -> Result:
    plan = plan_for(inv, name, kwargs)
    host = inv.host(host_name)
    node = inv.connections().get(host)
    result = run_on_host(inv, name, plan, node)
    inv.record(result)
    return result
