"""patch and rollback: one agent call each; the node answers per file with a status word
(remote_scripts/core/protocol.py). A playbook's files are one set, all-or-nothing per host: the
task's status, its message, --json and the audit line all come from the same items, so they agree
with the exit status.

Before the call that may write, the audit log gets an intent line (the run may never get to record
the result: a second Ctrl-C exits at once). When the run is interrupted (Ctrl-C) while the node
works on the set, the answer is lost with the link; the node's agent puts back what it wrote (or
keeps a set it had written whole), and the task then asks the node, over a fresh connection, what
the host ended with (settle): the console and the audit line say that, file by file, never a
guess."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import replace
from shlex import quote
from typing import TYPE_CHECKING, Any

from .. import audit
from ..agent.core.protocol import (
    CHANGED_WORDS,
    DRIFTED,
    NOOP_WORDS,
    NOT_WRITTEN,
    REFUSED,
    WOULD_WORDS,
)
from ..plans.versions import judged_patch
from ..plans.yamlsrc import ConfigError
from ..results import EXIT_FAILED, EXIT_INTERRUPTED, Evidence, Item, Next, Result, Status, rollup
from ..results.patching import Interrupted, JobRunningRefusal, PatchSet, VersionsChanged
from ..wire.connector import Connector, TransportError
from .declare import HELP_PLAYBOOK, JSON, HostTask, Option
from .plan import Plan, agent_error, drained

if TYPE_CHECKING:
    from ..plans.host import Host
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
        if kwargs.get("while_running"):
            request["while_running"] = True
        return Plan(
            op,
            request,
            180,
            book,
            check,
            options={"diff": bool(kwargs.get("diff")), "playbook": kwargs.get("playbook")},
        )

    return plan


# After Ctrl-C: how long asking the node what it ended with may take (a connection, then the wait
# for the lock beside the files, which the interrupted agent holds while it puts the set back).
SETTLE_S = 20.0
# Kinds of TransportError raised before the request could reach the agent: nothing to ask the node
# about.
NEVER_SENT = ("unreachable", "hostkey", "auth", "refused", "untrusted", "interrupted")


def _run(run: RunState, plan: Plan, node: Connector) -> Result:
    """One agent call; the request names the inventory host, so a host sharing the venv can say who
    did it."""
    host = node.host.name
    token = secrets.token_hex(8)
    request = {**plan.request, "host": host, "token": token}
    if not plan.check:
        refused = _versions_first(plan, node, request) if plan.op == "patch" else None
        if refused is not None:
            return refused
        _intent(run, plan, node)
    try:
        answer, evidence = node.call(plan.op, request, timeout=plan.timeout)
        # installed otherwise than the exact pins say: judged, then sent again
        if answer.get("needs_approval"):
            refused = _approve(plan, request, answer.get("requirements") or [], evidence)
            if refused is not None:
                return refused
            answer, evidence = node.call(plan.op, request, timeout=plan.timeout)
    except TransportError as exc:
        if plan.check or not run.interrupted.is_set() or exc.kind in NEVER_SENT:
            raise
        return _settle(run, plan, node, token, exc)
    result = _interpret_patch(host, plan, answer)
    # a refusal says it all
    if result.failed and result.data.get("error_kind") not in ("drained", "job_running"):
        result.evidence = evidence
    return result


def _versions_first(plan: Plan, node: Connector, request: dict) -> Result | None:
    """A patch writes only on versions the client approved (PEP 440 is judged here, not on the
    node). The plan approves the versions its pins make likely (versions.approvable); a pin that
    approves none has the node's installed version asked for first (read-only, on the same
    connection, ahead of the requests the next steps hold back). The refused result, or None with
    request["versions_approved"] set."""
    pins = request.get("requires") or []
    if all(p["package"] in (request.get("versions_approved") or {}) for p in pins):
        return None
    # a connector without ask: the held requests go along
    ask = getattr(node, "ask", None) or node.call
    answer, evidence = ask("facts", {"packages_only": True, "requires": pins}, timeout=60)
    if answer.get("error"):
        return agent_error(node.host.name, plan.op, answer, with_kind=True)
    return _approve(plan, request, answer.get("requirements") or [], evidence)


def _approve(plan: Plan, request: dict, reported: list[dict], evidence: Evidence) -> Result | None:
    book = plan.playbook
    judged = judged_patch(
        {"requirements": reported},
        bool(book and book.allow_prereleases),
        book.requires_hint if book else "",
    )
    if judged.get("items"):
        result = _interpret_patch(request["host"], plan, judged)
        result.evidence = evidence
        return result
    request["versions_approved"] = {r["package"]: [r["found"]] for r in reported}
    return None


def _intent(run: RunState, plan: Plan, node: Connector) -> None:
    """The audit line written before the node may change anything: `result: started`, no exit status
    yet."""
    book = plan.playbook
    record = audit.entry(
        Result(
            node.host.name,
            plan.op,
            Status.OK,
            f"{plan.op} of {book.name if book else '?'} "
            "sent to the node; the line with its result follows",
        ),
        book.name if book else None,
        book.sha256 if book else None,
        node.host,
        run.root,
    )
    record.update(result="started", changed=None, exit_status=None, duration_s=None)
    try:
        audit.append(record, run.root)
    # the run goes on, as for any audit line, and exits with EXIT_AUDIT (run.execute)
    except OSError as exc:
        text = (
            f"audit log {audit.log_path(run.root)}: "
            f"{node.host.name} {plan.op} intent not recorded: {exc}"
        )
        run.audit_error(text)


def _settle(run: RunState, plan: Plan, node: Connector, token: str, lost: TransportError) -> Result:
    """Ctrl-C cut the link while the node worked on the set: ask it (a connection of its own: the
    run's links stay closed) what each file is now, and how the set with this request's token
    ended."""
    host = node.host
    interrupted: dict[str, Any] = {
        "code": EXIT_INTERRUPTED,
        "payload": Interrupted(),
        "evidence": lost.evidence,
    }
    try:
        answer = _ask_settled(run, plan, host, token)
    except Exception as exc:  # whatever it is, the outcome stays unknown and is said so
        return Result(
            host.name,
            plan.op,
            Status.FAILED,
            "interrupted (Ctrl-C) while the node was working on the set, and asking it "
            f"afterwards what each file is failed ({exc}); what {host.name} ended with is "
            f"unknown: see it with fab -H {host.name} {plan.op} --check",
            **interrupted,
        )
    if answer.get("error") or "settled" not in answer:
        return Result(
            host.name,
            plan.op,
            Status.FAILED,
            f"interrupted (Ctrl-C) while the node was working on the set; what {host.name} ended "
            f"with is unknown ({answer.get('error') or 'the node did not say'}): see it with fab "
            f"-H {host.name} {plan.op} --check",
            **interrupted,
        )
    return _settled(host.name, plan, answer, lost)


def _ask_settled(run: RunState, plan: Plan, host: Host, token: str) -> dict[str, Any]:
    """The node's answer to "what is each file now, and how did the set with `token` end", within
    SETTLE_S."""
    pool = run.connections()
    asker = pool.factory(host, pool.inventory)
    # closing it ends a connect or a read in progress
    timer = threading.Timer(SETTLE_S, asker.close)
    timer.daemon = True
    timer.start()
    try:
        answer, _ = asker.call(
            plan.op,
            {
                **plan.request,
                "host": host.name,
                "check": True,
                "settle": token,
                "settle_wait_s": SETTLE_S - 5,
            },
            timeout=SETTLE_S,
        )
    finally:
        timer.cancel()
        asker.close()
    return answer


def _settled(name: str, plan: Plan, answer: dict[str, Any], lost: TransportError) -> Result:
    """The interrupted set as the node settled it: written whole, put back or never written, or
    half-written."""
    forms = [
        (raw.get("module") or "?", raw.get("form") or "unknown")
        for raw in answer.get("items") or ()
    ]
    now = ", ".join(f"{module.rsplit('.', 1)[-1]} {form}" for module, form in forms)
    items = [Item(module, Status.OK, f"now {form}", {"form": form}) for module, form in forms]
    settled = answer["settled"]
    outcome = (settled.get("outcome") or {}).get("outcome")
    how = Interrupted(
        settled=outcome or ("unfinished" if settled.get("unfinished") else "none"),
        forms=dict(forms),
    )
    if outcome == "written":  # the set was whole and written before the interrupt reached the agent
        return Result(
            name,
            plan.op,
            Status.CHANGED,
            f"interrupted (Ctrl-C) after the node had written the whole set: {now}",
            items,
            payload=replace(how, error_kind=None),
        )
    if outcome in ("put back", "not written") or (
        outcome is None and not settled.get("unfinished")
    ):
        what = (
            "the node put back every file it had written"
            if outcome == "put back"
            else "the node had written nothing"
        )
        return Result(
            name,
            plan.op,
            Status.FAILED,
            f"interrupted (Ctrl-C): {what}; every file is as it was before this {plan.op}: {now}",
            items,
            code=EXIT_INTERRUPTED,
            payload=how,
            evidence=lost.evidence,
        )
    return Result(
        name,
        plan.op,
        Status.FAILED,
        "interrupted (Ctrl-C), and the set is half-written (the agent could not finish or put "
        f"it back): {now}; run fab -H {name} {plan.op} (or rollback) to make it whole",
        items,
        code=EXIT_INTERRUPTED,
        payload=how,
        evidence=lost.evidence,
    )


def _refused(host: str, plan: Plan, answer: dict) -> Result:
    """The node refused before writing: drained, or a job of the node runs from the files; else its
    error."""
    details = answer.get("details") or {}
    if answer.get("error_kind") == "drained":
        return drained(host, plan.op, details.get("drain") or {}, plan.op)
    job = details.get("job") or {}
    if answer.get("error_kind") == "job_running" and job.get("id"):
        jid = quote(str(job["id"]))
        return Result(
            host,
            plan.op,
            Status.FAILED,
            f"refused: {answer['error']}. Wait for it (fab -H {quote(host)} "
            f"tail --job-id {jid}), stop it (fab -H "
            f"{quote(host)} stop --job-id {jid}), or {plan.op} "
            "--while-running",
            code=EXIT_FAILED,
            payload=JobRunningRefusal(
                job=job,
                next=Next(
                    "follow the job until it ends, then run it again",
                    [f"fab -H {quote(host)} tail --job-id {jid}"],
                ),
            ),
        )
    return agent_error(host, plan.op, answer, with_kind=True)


def _interpret_patch(host: str, plan: Plan, answer: dict) -> Result:
    if answer.get("error"):
        return _refused(host, plan, answer)
    if answer.get("needs_approval"):
        return Result(
            host,
            plan.op,
            Status.FAILED,
            "the installed versions changed while this patch was being "
            "approved; nothing written: run it again",
            code=EXIT_FAILED,
            payload=VersionsChanged(answer.get("requirements")),
        )
    book = plan.playbook
    answer = judged_patch(
        answer, bool(book and book.allow_prereleases), book.requires_hint if book else ""
    )
    items = [_patch_item(plan, raw) for raw in answer["items"]]
    status = rollup(items)
    nxt = None
    if status is Status.FAILED:
        nxt = _failed_next(host, plan, {raw["status"] for raw in answer["items"]})
    return Result(
        host,
        plan.op,
        status,
        _patch_msg(plan, answer["items"], status),
        items,
        code=EXIT_FAILED if status is Status.FAILED else 0,
        payload=PatchSet(plan.check, plan.playbook.name if plan.playbook else None, nxt),
    )


# What the node said of a file (its status word) → the item's status; any other word failed.
_ITEM_STATUS = {
    **dict.fromkeys(CHANGED_WORDS, Status.CHANGED),
    **dict.fromkeys(WOULD_WORDS, Status.CHANGED),
    **dict.fromkeys(NOOP_WORDS, Status.OK),
    NOT_WRITTEN: Status.SKIPPED,
}
# The fields of a node's file entry a patch item carries.
_ITEM_DETAILS = (
    "file",
    "sha256",
    "original_sha256",
    "drift",
    "diff_text",
    "notes",
    "requirements",
    "bytecode_removed",
)


def _patch_item(plan: Plan, raw: dict) -> Item:
    """One file of the set, as the node answered for it."""
    word = raw["status"]
    status = _ITEM_STATUS.get(word, Status.FAILED)
    details = {k: raw[k] for k in _ITEM_DETAILS if k in raw}
    # the node's word for the file (applied, already_applied, drifted...): --metrics
    details["state"] = word
    # a forced restore over a drifted file says the diff shows what it discarded: it is shown,
    # --diff or not
    forced = (
        plan.op == "rollback"
        and plan.request.get("force")
        and "drift" in raw
        and status is Status.CHANGED
    )
    details["show_diff"] = plan.check or plan.options.get("diff", False) or bool(forced)
    return Item(raw.get("module") or "requirements", status, raw["msg"], details)


def _patch_msg(plan: Plan, raw_items: list[dict], status: Status) -> str:
    """How many files in each of the node's states; whether anything was written."""
    counts: dict[str, int] = {}
    for raw in raw_items:
        counts[raw["status"]] = counts.get(raw["status"], 0) + 1
    msg = ", ".join(f"{n} {word.replace('_', ' ')}" for word, n in counts.items())
    if status is Status.FAILED and not any(i.get("changed") for i in raw_items):
        msg += " (nothing written: a set is all-or-nothing)"
    if plan.check:
        msg += " (check mode: nothing written)"
    return msg


def _failed_next(host: str, plan: Plan, words: set[str]) -> Next:
    """What to do about the set's refusal, by the node's status words (runbooks node-drifted and
    new-version-landed say the same)."""
    fab = f"fab -H {quote(host)}"
    book = (
        f" --playbook {quote(str(plan.options['playbook']))}"
        if plan.options.get("playbook")
        else ""
    )
    if DRIFTED in words:
        again = [] if plan.op == "rollback" else [f"{fab} patch verify{book}"]
        return Next(
            "a file was edited after the patch: see who changed it and ask whether the edit is "
            "still needed; rollback --force then puts the "
            "installed original back (the edit is lost)"
            + ("" if plan.op == "rollback" else ", and patch again")
            + " (runbook node-drifted)",
            [f"fab history --host {quote(host)}", f"{fab} rollback --force{book}", *again],
        )
    if REFUSED in words:
        return Next(
            "the installed versions are not the ones the playbook is for: see what is installed "
            "(runbook new-version-landed)",
            [f"{fab} facts"],
        )
    return Next(
        "see what the node says of each file, then run it again", [f"{fab} {plan.op} --check{book}"]
    )


HELP_DIFF = "show each file's diff also when applying"
WHILE_RUNNING = Option(
    "while_running",
    "write even while a job of this node runs from these files (it keeps the code "
    "it imported; what it imports later is the new code)",
    False,
)

TASKS = [
    HostTask(
        "patch",
        _patch_plan("patch"),
        run=_run,
        writes=True,
        op="patch",
        playbook_set=True,
        result=PatchSet,
        help="Apply the playbook's patches (atomic, backed up, locked; already-applied is a "
        "no-op). Refused on a drained\nnode, and while a job of the node runs from the "
        "files (--while-running overrides).",
        options=(
            Option("check", "show the diff that would be applied; write nothing", False),
            Option("playbook", HELP_PLAYBOOK),
            JSON,
            Option("diff", HELP_DIFF, False),
            WHILE_RUNNING,
        ),
    ),
    HostTask(
        "rollback",
        _patch_plan("rollback"),
        run=_run,
        writes=True,
        op="rollback",
        playbook_set=True,
        result=PatchSet,
        help="Reverse the patch (later edits elsewhere kept; the result checked against the "
        "wheel's RECORD). Refused while\na job of the node runs from the files "
        "(--while-running overrides).",
        options=(
            Option("check", "show what would be restored; write nothing", False),
            Option("playbook", HELP_PLAYBOOK),
            JSON,
            Option("diff", HELP_DIFF, False),
            Option(
                "force",
                "a drifted file too: restore the saved original (proven by the wheel's "
                "RECORD), discarding every change in it",
                False,
            ),
            WHILE_RUNNING,
        ),
    ),
]
