"""Apply, check and roll back a playbook's patches on the node's installed files. Stdlib only.

A patch is a list of hunks (old block → new block). A file is *pristine* when every old block sits
where patch(1) would apply it, *patched* when every new block sits where patch -R would find it, and
*drifted* otherwise (hunks.py decides); only a pristine file is written, and a drifted one is
reported hunk by hunk with what was expected and what is there.

A playbook's files are one set, all-or-nothing per host: every file is read, classified and checked
(drift, writability, free space) under the locks before any is written; one refusal and nothing is
written. A write that fails midway puts the files already written back, and so does an interrupt
(the client went away: Ctrl-C) unless every file was already written; how the set ended is kept
under the request's token, for the client that lost the answer (settle). The locks: the node's (its
state dir), then the one beside the files (sitelock.py: every host sharing a venv serializes there,
and learns who patched it).

Rollback computes the original by reversing the hunks the client sent (the node cannot forge them)
and proves it against pip's RECORD sha256 (wheelrecord.py) when RECORD lists the file; edits made
elsewhere after the patch survive. The backup saved in the state dir is a witness, never the source,
except for `--force` on a drifted file, and then only when its bytes are the wheel's (RECORD): a
backup that does not match is refused.

This module holds the entry points (patch, rollback, settle) and the set's run under its locks and
its answer; the set's parts: setfile.py (one file of it), planset.py (the plan, and check mode),
rollbackplan.py (rollback's plan of a file), writeset.py (the writes, their undo, an interrupted
set).
"""

from __future__ import annotations

from ..core.dists import report_versions
from ..core.nodeio import NodeError
from ..core.nodelock import NodeLock
from ..core.procfs import pid_alive
from ..core.sitemodules import module_file_in_site
from .planset import plan_set
from .setfile import SetFile
from .sitelock import SiteLock, site_root_of
from .writeset import report_interrupted, write_set


# ---------------------------------------------------------------- the set
def _unapproved(req: dict) -> dict | None:
    """The client judges a playbook's pins (PEP 440) from the versions a node reports, and sends the
    versions it approved with the patch. Anything else installed now (or a first visit, with nothing
    approved yet) writes nothing: the answer reports what is installed, for the client to judge and
    send again."""
    found = report_versions(req.get("requires") or [])
    approved = req.get("versions_approved") or {}  # package -> [version strings]
    if all(
        r["found"] is not None and r["found"] in (approved.get(r["package"]) or ()) for r in found
    ):
        return None
    return {"ok": False, "needs_approval": True, "requirements": found, "items": []}


def patch(req: dict) -> dict:
    # writes nothing: the client judges the reported versions along with the plan
    if req.get("check"):
        answer = _run_set(req, "patch")
        answer["requirements"] = report_versions(req.get("requires") or [])
        return answer
    unapproved = _unapproved(req)
    if unapproved:
        return unapproved
    return _run_set(req, "patch")


def rollback(req: dict) -> dict:
    return _run_set(req, "rollback")


def _run_set(req: dict, op: str) -> dict:
    """The set under the node lock and the lock beside the files (none when only checking: nothing
    written)."""
    if req.get("check"):
        if req.get("settle"):
            return settle(req, op)
        return _answer(plan_set(req, op, None))
    with NodeLock(req["state_dir"], req.get("operator", "?"), op) as lock:
        roots = _roots(req)
        site = (
            SiteLock(roots, req.get("host") or "?", req.get("operator", "?"), op) if roots else None
        )
        answer = _answer(_plan_and_write(req, op, site))
    notes_first = [_took_over_note(lock.took_over)] if lock.took_over else []
    notes_last = [_waited_note(site.waited_for)] if site is not None and site.waited_for else []
    if notes_first or notes_last:
        for item in answer["items"]:
            notes = item.setdefault("notes", [])
            notes[:0] = notes_first
            notes.extend(notes_last)
    return answer


def _plan_and_write(req: dict, op: str, site: SiteLock | None) -> list[SetFile]:
    """The set planned, and written under the lock beside its files (no files found: nothing to
    lock, nothing written)."""
    if site is None:
        return plan_set(req, op, None)
    with site:
        files = plan_set(req, op, site)
        interrupted = site.interrupted([f.path for f in files if f.path])
        if interrupted:
            report_interrupted(files, interrupted)
        write_set(req, op, files, site)
    return files


def _took_over_note(took_over: dict) -> str:
    pid = took_over.get("pid")
    alive = str(pid).isdigit() and pid_alive(int(str(pid)))
    fate = "now belongs to another process" if alive else "is gone"
    return (
        f"took over a stale lock from {took_over.get('operator')} (pid {pid} {fate}; "
        "its lock was free, so it no longer held it)"
    )


def _waited_note(holder: dict) -> str:
    return (
        f"waited for {holder.get('host', '?')} ({holder.get('op', '?')}, pid "
        f"{holder.get('pid', '?')}), which was changing "
        "the same files (a venv shared with it)"
    )


def _roots(req: dict) -> list[str]:
    roots = []
    for p in req["patches"]:
        try:
            roots.append(site_root_of(module_file_in_site(p["module"])))
        except NodeError:
            pass  # reported by its file's load, under the lock
    return roots


def settle(req: dict, op: str) -> dict:
    """What a host ended with after its client lost the answer of a patch or rollback (Ctrl-C):
    under the lock beside the files, so the agent that was writing has finished (or put back) first,
    each file's form now, and how the set with the request's token ended (written, put back, or
    still unfinished: its writer died). Nothing is written but the lock's own record."""
    token = str(req["settle"])
    roots = _roots(req)
    if not roots:
        answer = _answer(plan_set(req, op, None, forms=True))
        answer["settled"] = {"outcome": None, "unfinished": None}
        return answer
    with SiteLock(
        roots,
        req.get("host") or "?",
        req.get("operator", "?"),
        "settle",
        wait_s=float(req.get("settle_wait_s") or 20),
    ) as site:
        outcome = site.take_outcome(token)
        unfinished = next((e for e in site.unfinished() if e.get("token") == token), None)
        files = plan_set(req, op, site, forms=True)
    answer = _answer(files)
    answer["settled"] = {"outcome": outcome, "unfinished": unfinished}
    return answer


def _answer(files: list[SetFile]) -> dict:
    items = [f.item for f in files]
    return {"ok": all(i.get("ok") for i in items), "items": items}
