"""patch and rollback: one agent call each; the node answers per file with a status word
(remote_scripts/protocol.py). A playbook's files are one set, all-or-nothing per host: the task's status, its
message, --json and the audit line all come from the same items, so they agree with the exit status."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from remote_scripts.protocol import CHANGED_WORDS, NOOP_WORDS, NOT_WRITTEN, WOULD_WORDS

from ..plans.yamlsrc import ConfigError
from ..results import EXIT_FAILED, Item, Result, Status, rollup
from ..wire.connector import Connector
from .plan import Plan, TaskSpec, agent_error

if TYPE_CHECKING:
    from ..state import RunState


def _patch_plan(op: str) -> Callable[[RunState, dict], Plan]:
    def plan(run: RunState, kwargs: dict) -> Plan:
        book = run.playbook(kwargs.get("playbook"))
        if not book.patches:
            raise ConfigError(book.path, None, f"playbook {book.name!r} has no patches to {op}")
        check = bool(kwargs.get("check"))
        request = book.patch_request(check)
        if op == "rollback" and kwargs.get("force"):
            request["force"] = True
        return Plan(op, request, 180, book, check, options={"diff": bool(kwargs.get("diff"))})

    return plan


def _run(run: RunState, plan: Plan, node: Connector) -> Result:
    """One agent call; the request names the inventory host, so a host sharing the venv can say who did it."""
    host = node.host.name
    answer, evidence = node.call(plan.op, {**plan.request, "host": host}, timeout=plan.timeout)
    result = _interpret_patch(host, plan, answer)
    if result.failed:
        result.evidence = evidence
    return result


def _interpret_patch(host: str, plan: Plan, answer: dict) -> Result:
    if answer.get("error"):
        return agent_error(host, plan.op, answer, with_kind=True)
    items = []
    for raw in answer["items"]:
        word = raw["status"]
        if word in CHANGED_WORDS or word in WOULD_WORDS:
            status = Status.CHANGED
        elif word in NOOP_WORDS:
            status = Status.OK
        elif word == NOT_WRITTEN:
            status = Status.SKIPPED
        else:
            status = Status.FAILED
        details = {k: raw[k] for k in ("file", "sha256", "original_sha256", "drift", "diff_text", "notes",
                                       "requirements", "bytecode_removed") if k in raw}
        details["show_diff"] = plan.check or plan.options.get("diff", False)
        items.append(Item(raw.get("module") or "requirements", status, raw["msg"], details))
    status = rollup(items)
    counts: dict[str, int] = {}
    for raw in answer["items"]:
        counts[raw["status"]] = counts.get(raw["status"], 0) + 1
    msg = ", ".join(f"{n} {word.replace('_', ' ')}" for word, n in counts.items())
    if status is Status.FAILED and not any(i.get("changed") for i in answer["items"]):
        msg += " (nothing written: a set is all-or-nothing)"
    if plan.check:
        msg += " (check mode: nothing written)"
    data = {"check_mode": plan.check, "playbook": plan.playbook.name if plan.playbook else None}
    return Result(host, plan.op, status, msg, items, code=EXIT_FAILED if status is Status.FAILED else 0, data=data)


TASKS = [TaskSpec("patch", _patch_plan("patch"), run=_run, dry="check"),
         TaskSpec("rollback", _patch_plan("rollback"), run=_run, dry="check")]
