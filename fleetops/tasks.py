"""The host tasks (patch, rollback, verify, ...): plan without a network, then one agent call per host."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass
class TaskSpec:
    name: str
    plan: Callable[[Invocation, dict], Plan]
    interpret: Callable[[str, Plan, dict], Result]


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


TASKS: dict[str, TaskSpec] = {
    "ping": TaskSpec("ping", _ping_plan, _interpret_ping),
    "patch": TaskSpec("patch", _patch_plan("patch"), _interpret_patch),
    "rollback": TaskSpec("rollback", _patch_plan("rollback"), _interpret_patch),
    "verify": TaskSpec("verify", _verify_plan, _interpret_verify),
}


def plan_for(inv: Invocation, name: str, kwargs: dict) -> Plan:
    return TASKS[name].plan(inv, kwargs)


def run_on_host(inv: Invocation, name: str, plan: Plan, node: NodeConnection) -> Result:
    """One task on one host; never raises for node trouble: it becomes a failed/unreachable Result."""
    started = time.monotonic()
    host = node.host.name
    try:
        answer, evidence = node.call(plan.op, plan.request, timeout=plan.timeout)
        result = TASKS[name].interpret(host, plan, answer)
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
        result.data.setdefault("playbook_sha256", plan.playbook.sha256)
    return result


def host_task(inv: Invocation, name: str, host_name: str, kwargs: dict[str, Any]) -> Result:
    plan = plan_for(inv, name, kwargs)
    host = inv.host(host_name)
    node = inv.connections().get(host)
    result = run_on_host(inv, name, plan, node)
    inv.record(result)
    return result
