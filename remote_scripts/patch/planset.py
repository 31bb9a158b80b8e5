"""The plan of a set, before anything is written: each file read and classified (patch's plan here,
rollback's in rollbackplan.py, a script's in scriptpatch.py), then the set checked whole (drift,
writability, free space) so that one refusal stops every file. Check mode ends here. Stdlib only.
"""

from __future__ import annotations

import os

from ..core.atomicio import os_error_message
from ..core.nodeio import sha256_bytes
from ..core.protocol import (
    ALREADY_APPLIED,
    DRIFTED,
    FAILED,
    NOT_WRITTEN,
    WOULD_APPLY,
    WOULD_RESTORE,
)
from .access import check_access
from .backups import read_record
from .hunks import apply_hunks, classify, drift_report
from .setfile import SetFile, unified, written_by
from .sitelock import SiteLock

SPACE_MARGIN = 1 << 20  # free bytes left over after the set's writes, per file system


def _plan_patch(req: dict, f: SetFile, site: SiteLock | None) -> None:
    hunks = f.hunks
    cls = classify(f.lines, hunks)
    sha = sha256_bytes(f.data)
    record = read_record(req.get("state_dir"), f.path)
    ours = bool(record and record.get("patched_sha256") == sha)
    n_hunks = f"{len(hunks)} hunk{'s' * (len(hunks) != 1)}"
    if cls["overall"] == "patched":
        f.noop(
            ALREADY_APPLIED,
            f"already applied{written_by(site, f.path, sha, 'patched')}: all {n_hunks} "
            f"present; nothing to do",
        )
        return
    if (
        cls["overall"] == "pristine"
        and cls["both"]
        and (ours or written_by(site, f.path, sha, "patched"))
    ):
        # The patched form fits too (e.g. a line deleted from a run of equal lines, where the diff's
        # context cannot tell the two apart): the record that this is the very file fleetops wrote
        # settles it.
        f.noop(
            ALREADY_APPLIED,
            f"already applied{written_by(site, f.path, sha, 'patched')}: this is the file "
            f"fleetops wrote (sha256 matches its record); the {n_hunks} alone cannot "
            f"tell it from the original",
        )
        return
    if cls["overall"] == "drifted":
        f.refuse(
            DRIFTED,
            f"drifted: {f.path} matches neither the pristine nor the patched form; nothing written",
            drift=drift_report(f.lines, hunks, cls),
        )
        return
    new_text = apply_hunks(f.lines, hunks, cls)
    f.new = new_text.encode("utf-8")
    f.item["diff_text"] = unified(f.data.decode("utf-8"), new_text, f.path)
    f.would_msg = f"would apply {len(hunks)} hunk{'s' * (len(hunks) != 1)}"


def plan_set(req: dict, op: str, site: SiteLock | None, forms: bool = False) -> list[SetFile]:
    files = [SetFile(p) for p in req["patches"]]
    for f in files:
        if f.load():
            _plan_file(req, op, f, site)
        if forms:  # each file's form now, before the all-or-nothing rule below rewrites the items
            f.item["form"] = _form(op, f)
    check_only = bool(req.get("check"))
    _check_set(req, op, files, check_only)
    _all_or_nothing(op, files, check_only)
    return files


def _check_set(req: dict, op: str, files: list[SetFile], check_only: bool) -> None:
    """Before a write, room and access for the whole set; in check mode, access only (a settle
    checks nothing: it reads what an earlier run left)."""
    if check_only:
        if not req.get("settle"):
            check_access(req, op, files)
    elif not any(f.refusal for f in files):
        _check_room(req, op, files)


def _all_or_nothing(op: str, files: list[SetFile], check_only: bool) -> None:
    """A refused file stops the others; in check mode the rest say what a run would write."""
    blockers = [f for f in files if f.refusal]
    writable = [f for f in files if f.new is not None and not f.refusal]
    if blockers:
        _hold_back(writable, blockers, check_only)
    elif check_only:
        _would_write(writable, op)


def _plan_file(req: dict, op: str, f: SetFile, site: SiteLock | None) -> None:
    """One loaded file's plan, by the planner its kind of change needs (each loaded only when
    used)."""
    if f.p.get("script"):  # a script patch: scriptpatch.py plans it
        from .scriptpatch import plan_script

        plan_script(req, op, f)
    elif op == "patch":
        _plan_patch(req, f, site)
    else:  # only a rollback loads rollback's planner
        from .rollbackplan import plan_rollback

        plan_rollback(req, f, site)


def _hold_back(writable: list[SetFile], blockers: list[SetFile], check_only: bool) -> None:
    """The set is all-or-nothing: a refused file stops every other one."""
    names = ", ".join(f"{b.p['module']} ({b.item['status'].replace('_', ' ')})" for b in blockers)
    verb = "would not be written (check mode)" if check_only else "not written"
    for f in writable:
        f.new = None
        f.item.update(
            {
                "status": NOT_WRITTEN,
                "ok": False,
                "msg": f"{verb}: the set is all-or-nothing and {names} stops it",
            }
        )


def _would_write(writable: list[SetFile], op: str) -> None:
    """Check mode: each file that a run would write says so."""
    for f in writable:
        f.item.update(
            {
                "status": WOULD_APPLY if op == "patch" else WOULD_RESTORE,
                "ok": True,
                "msg": f"{f.would_msg} (check mode: nothing written)",
            }
        )


def _form(op: str, f: SetFile) -> str:
    if "drift" in f.item:
        return "drifted"
    if f.refusal:
        return "unknown"
    start, end = ("pristine", "patched") if op == "patch" else ("patched", "pristine")
    return start if f.new is not None else end


def _check_room(req: dict, op: str, files: list[SetFile]) -> None:
    """Before any write: every directory written is writable, and has room for the whole set."""
    need: dict[int, int] = {}
    for f in files:
        if f.new is None:
            continue
        dirs = [(os.path.dirname(f.path), len(f.new))]
        if op == "patch" and req.get("state_dir"):
            dirs.append((os.path.join(req["state_dir"], "backups"), len(f.data) + 4096))
        for d, size in dirs:
            if f.refusal:
                break
            probe = d if os.path.isdir(d) else os.path.dirname(d)
            try:
                st = os.stat(probe)
                vfs = os.statvfs(probe)
            except OSError as exc:
                f.refuse(
                    FAILED, os_error_message(exc, f"cannot check {probe}") + "; nothing written"
                )
                continue
            if vfs.f_flag & os.ST_RDONLY:
                f.refuse(FAILED, f"{probe} is on a read-only file system; nothing written")
                continue
            if not os.access(probe, os.W_OK | os.X_OK):
                f.refuse(FAILED, f"{probe} is not writable by this user; nothing written")
                continue
            need[st.st_dev] = need.get(st.st_dev, 0) + size
            free = vfs.f_bavail * vfs.f_frsize
            if need[st.st_dev] + SPACE_MARGIN > free:
                f.refuse(
                    FAILED,
                    f"not enough free space on the file system of {probe}: the set needs "
                    f"{need[st.st_dev]} bytes (+{SPACE_MARGIN} "
                    f"spare), {free} free; nothing written",
                )
