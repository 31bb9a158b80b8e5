"""patch and rollback: one agent call each; the node answers per file with a status word
(remote_scripts/protocol.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from remote_scripts.protocol import CHANGED_WORDS, NOOP_WORDS, WOULD_WORDS

from ..plans.yamlsrc import ConfigError
from ..results import Item, Result, Status, rollup
from .plan import Plan, TaskSpec, agent_error

if TYPE_CHECKING:
    from ..state import RunState


def _patch_plan(op: str) -> Callable[[RunState, dict], Plan]:
    def plan(run: RunState, kwargs: dict) -> Plan:
        book = run.playbook(kwargs.get("playbook"))
        if not book.patches:
            raise ConfigError(book.path, None, f"playbook {book.name!r} has no patches to {op}")
        check = bool(kwargs.get("check"))
        return Plan(op, book.patch_request(check), 180, book, check, options={"diff": bool(kwargs.get("diff"))})

    return plan


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
    if plan.check:
        msg += " (check mode: nothing written)"
    return Result(host, plan.op, status, msg, items, data={"check_mode": plan.check,
                                                           "playbook": plan.playbook.name if plan.playbook else None})


TASKS = [TaskSpec("patch", _patch_plan("patch"), _interpret_patch, dry="check"),
         TaskSpec("rollback", _patch_plan("rollback"), _interpret_patch, dry="check")]
