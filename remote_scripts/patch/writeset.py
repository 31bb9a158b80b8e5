"""Writing a planned set, all-or-nothing: the backup saved and each file written atomically under
the lock beside the files; a write that fails midway puts the files already written back, and so
does an interrupt (Ctrl-C: the client went away) unless every file was already written. How the set
ended is kept under the request's token (for settle), and a set a dead writer left unfinished is
finished here. Stdlib only.
"""

from __future__ import annotations

import signal
import sys

from ..core.atomicio import atomic_write, os_error_message
from ..core.nodeio import now_iso, sha256_bytes
from ..core.protocol import APPLIED, FAILED, NOT_WRITTEN, RESTORED
from ..core.sitemodules import remove_stale_bytecode
from .backups import save_backup
from .setfile import SetFile
from .sitelock import SiteLock

# typing.TYPE_CHECKING without importing typing: the agent's start-up imports only what it runs
TYPE_CHECKING = False


def report_interrupted(files: list[SetFile], pending: dict) -> None:
    note = (
        f"an earlier {pending.get('op', '?')} by {pending.get('host', '?')} (pid "
        f"{pending.get('pid', '?')}, {pending.get('at', '?')}) died before finishing this set; "
        "this run finishes it in its own direction"
    )
    for f in files:
        f.note(note)


def write_set(req: dict, op: str, files: list[SetFile], site: SiteLock) -> None:
    todo = [f for f in files if f.new is not None and not f.refusal]
    paths = [f.path for f in files if f.path]
    if not todo:
        if site.interrupted(paths) and not any(f.refusal for f in files):
            # whole again (nothing left to write): a dead writer's mark goes
            site.finish({}, covered=paths)
        return
    try:
        _write_all(req, op, todo, paths, site)
    # the client went away (Ctrl-C) mid-set; this agent is alive: the set ends whole
    except KeyboardInterrupt:
        held = _hold_interrupts()
        try:
            _end_interrupted(op, todo, paths, site, req.get("token"))
        finally:
            _release_interrupts(held)
        raise


def _write_all(req: dict, op: str, todo: list[SetFile], paths: list[str], site: SiteLock) -> None:
    """Mark the set begun, write each file, and mark it ended: written, or put back after a failed
    write."""
    token = req.get("token")
    intents = [
        {"path": f.path, "before": sha256_bytes(f.data), "after": sha256_bytes(f.new or b"")}
        for f in todo
    ]
    site.begin(op, intents, token)
    written: list[SetFile] = []
    for i, f in enumerate(todo):
        try:
            _write_one(req, op, f)
        except OSError as exc:
            verb = "patch" if op == "patch" else "restore"
            why = os_error_message(exc, f"cannot {verb} {f.path}")
            if _undo(written, f, why, todo[i + 1 :]):
                site.finish({}, token=token, outcome="put back")
            return
        written.append(f)
    site.finish(_mark_written(op, written), covered=paths, token=token)


def _write_one(req: dict, op: str, f: SetFile) -> None:
    """One file of the set written atomically; a patch saves the original first."""
    assert f.new is not None
    if op == "patch":
        _save_original(req, f)
    atomic_write(f.path, f.new, like=f.path, point=f"{op}.target")


def _save_original(req: dict, f: SetFile) -> None:
    """The backup a patch keeps (and the script's sha256 with it), and the message that cites it."""
    assert f.new is not None
    record = save_backup(
        req["state_dir"], f.path, f.p["module"], f.data, f.new, req.get("playbook", "?")
    )
    f.extra = {"original_sha256": record["original_sha256"]}
    what = f.p.get("what") or f"{len(f.hunks)} hunk{'s' * (len(f.hunks) != 1)}"
    f.done_msg = f"applied {what} (original saved, sha256 {record['original_sha256'][:12]})"
    # the script's sha256 joins the backup record (scriptpatch.py)
    if f.p.get("script"):
        from .scriptpatch import note_script

        note_script(req["state_dir"], f.path, f.p)


def _mark_written(op: str, written: list[SetFile]) -> dict[str, dict]:
    """Each written file's answer item, and the forms the site's log records for them."""
    status, form = (APPLIED, "patched") if op == "patch" else (RESTORED, "pristine")
    done = {}
    for f in written:
        assert f.new is not None
        f.item.update(
            {
                "status": status,
                "ok": True,
                "changed": True,
                "sha256": sha256_bytes(f.new),
                "bytecode_removed": remove_stale_bytecode(f.path),
                "msg": f.done_msg,
                **f.extra,
            }
        )
        done[f.path] = {"form": form, "sha256": sha256_bytes(f.new)}
    return done


def _end_interrupted(
    op: str, todo: list[SetFile], paths: list[str], site: SiteLock, token: str | None
) -> None:
    """After an interrupt in the middle of the set: each file is put back as it was, unless every
    one was already written (the set is whole and new: it stays, as if the interrupt had come a
    moment later). Its outcome is kept under the request's token for the client that asks
    (settle)."""
    now: dict[str, str | None] = {}
    for f in todo:
        try:
            with open(f.path, "rb") as fh:
                now[f.path] = sha256_bytes(fh.read())
        except OSError:
            now[f.path] = None
    if all(now[f.path] == sha256_bytes(f.new or b"") for f in todo):
        site.finish(
            {
                f.path: {"form": "patched" if op == "patch" else "pristine", "sha256": now[f.path]}
                for f in todo
            },
            covered=paths,
            token=token,
        )
        return
    restored, whole = [], True
    for f in todo:
        if now[f.path] == sha256_bytes(f.data):
            continue
        try:
            atomic_write(f.path, f.data, like=f.path, point="undo.target")
            remove_stale_bytecode(f.path)
            restored.append(f.path)
        except OSError as exc:
            whole = False
            print(
                f"fleetops: {os_error_message(exc, f'putting {f.path} back failed')}; "
                "the set is half-written: "
                "run rollback",
                file=sys.stderr,
            )
    if whole:  # our own mark goes; a dead writer's, if the set had one before us, stays
        site.finish({}, token=token, outcome="put back" if restored else "not written")
    elif token:
        site.record_outcome(
            token, {"outcome": "half-written", "op": op, "at": now_iso(), "files": now}
        )
        site.save()


if TYPE_CHECKING:  # the node's Python may be 3.9: the alias is for the checker only
    from collections.abc import Callable
    from types import FrameType
    from typing import Any

    # What signal.signal() returns and takes: the previous handler (None: none was held).
    _Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def _hold_interrupts() -> _Handler:
    """No second interrupt while the set is put back (the client's watchdog sends one; this is belt
    and braces against any other). Only the main thread may change it: elsewhere nothing is held."""
    try:
        return signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:
        return None


def _release_interrupts(held: _Handler) -> None:
    if held is not None:
        try:
            signal.signal(signal.SIGINT, held)
        except ValueError:
            pass


def _undo(written: list[SetFile], failed: SetFile, why: str, rest: list[SetFile]) -> bool:
    """A write failed midway: put the files already written back as they were, so the set stays
    whole. False when one could not be put back (the set is half-written and stays marked
    unfinished)."""
    failed.refuse(FAILED, f"{why}; the file is unchanged")
    whole = True
    for f in written:
        try:
            atomic_write(f.path, f.data, like=f.path, point="undo.target")
            remove_stale_bytecode(f.path)
            f.item.update(
                {
                    "status": NOT_WRITTEN,
                    "ok": False,
                    "changed": False,
                    "msg": "written, then put back as it was (sha256 "
                    f"{sha256_bytes(f.data)[:12]}): {failed.p['module']} failed, and the "
                    "set is all-or-nothing",
                }
            )
        except OSError as exc:
            whole = False
            f.item.update(
                {
                    "status": FAILED,
                    "ok": False,
                    "changed": True,
                    "msg": os_error_message(exc, f"written, and putting {f.path} back failed")
                    + "; the set is half-written: run rollback",
                }
            )
    for f in rest:
        f.item.update(
            {
                "status": NOT_WRITTEN,
                "ok": False,
                "msg": (
                    f"not written: {failed.p['module']} failed first, and the set is all-or-nothing"
                ),
            }
        )
    return whole
