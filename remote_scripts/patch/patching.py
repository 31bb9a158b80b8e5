"""Apply, check and roll back a playbook's patches on the node's installed files. Stdlib only.

A patch is a list of hunks (old block → new block). A file is *pristine* when every old block sits where
patch(1) would apply it, *patched* when every new block sits where patch -R would find it, and *drifted*
otherwise (hunks.py decides); only a pristine file is written, and a drifted one is reported hunk by hunk with
what was expected and what is there.

A playbook's files are one set, all-or-nothing per host: every file is read, classified and checked (drift,
writability, free space) under the locks before any is written; one refusal and nothing is written. A write
that fails midway puts the files already written back, and so does an interrupt (the client went away: Ctrl-C)
unless every file was already written; how the set ended is kept under the request's token, for the client
that lost the answer (settle). The locks: the node's (its state dir), then the one
beside the files (sitelock.py: every host sharing a venv serializes there, and learns who patched it).

Rollback computes the original by reversing the hunks the client sent (the node cannot forge them) and proves
it against pip's RECORD sha256 (wheelrecord.py) when RECORD lists the file; edits made elsewhere after the
patch survive. The backup saved in the state dir is a witness, never the source, except for `--force` on a
drifted file, and then only when its bytes are the wheel's (RECORD): a backup that does not match is refused.
"""

from __future__ import annotations

import os
import signal
import sys

from ..core.nodeio import (
    NodeError,
    NodeLock,
    atomic_write,
    module_file_in_site,
    now_iso,
    os_error_message,
    remove_stale_bytecode,
    report_versions,
    sha256_bytes,
)
from ..core.procfs import pid_alive
from ..core.protocol import (
    ALREADY_APPLIED,
    ALREADY_ORIGINAL,
    APPLIED,
    DRIFTED,
    FAILED,
    NOT_WRITTEN,
    REFUSED,
    RESTORED,
    WOULD_APPLY,
    WOULD_RESTORE,
)
from .access import check_access
from .backups import backup_paths, bad_backup, read_backup, read_record, save_backup
from .hunks import apply_hunks, classify, closest_window, drift_report, split_lines
from .sitelock import SiteLock, site_root_of
from .wheelrecord import record_sha256

SPACE_MARGIN = 1 << 20  # free bytes left over after the set's writes, per file system


def unified(old: str, new: str, path: str) -> str:
    import difflib  # only a change (or a refusal) shows a diff: not imported by a steady-state run

    return "".join(difflib.unified_diff(split_lines(old), split_lines(new), f"a{path}", f"b{path}", n=3))


# ---------------------------------------------------------------- one file of the set
class _File:
    """One file of the set: what is there, what to write (if anything), and the item for the answer."""

    def __init__(self, p: dict) -> None:
        self.p = p
        self.hunks: list[dict] = p["hunks"]
        self.item: dict = {"module": p["module"], "diff": p.get("diff_name"), "changed": False}
        self.path = ""
        self.data = b""
        self.lines: list[str] = []
        self.new: bytes | None = None  # the bytes to write; None: nothing to write
        self.refusal = False  # this file stops the whole set
        self.done_msg = ""
        self.would_msg = ""
        self.extra: dict = {}  # what the answer item gets once written

    def load(self) -> bool:
        try:
            self.path = module_file_in_site(self.p["module"])
            with open(self.path, "rb") as f:
                self.data = f.read()
            try:
                text = self.data.decode("utf-8")
            except UnicodeDecodeError:
                raise NodeError(f"{self.path} is not UTF-8 text; refusing to touch it") from None
        except NodeError as exc:
            self.refuse(REFUSED, str(exc))
            return False
        except OSError as exc:
            self.refuse(FAILED, os_error_message(exc, f"cannot read {self.p['module']}"))
            return False
        self.item["file"] = self.path
        self.lines = split_lines(text)
        return True

    def refuse(self, status: str, msg: str, **extra: object) -> None:
        self.refusal = True
        self.item.update({"status": status, "ok": False, "msg": msg, **extra})

    def noop(self, status: str, msg: str, **extra: object) -> None:
        self.item.update({"status": status, "ok": True, "msg": msg, "sha256": sha256_bytes(self.data), **extra})

    def note(self, text: str) -> None:
        self.item.setdefault("notes", []).append(text)


def _by(site: SiteLock | None, path: str, sha: str, form: str) -> str:
    info = site.last_writer(path, sha) if site else None
    if not info or info.get("form") != form:
        return ""
    return f" (by {info.get('host', '?')}, {info.get('operator', '?')}, at {info.get('at', '?')})"


def _plan_patch(req: dict, f: _File, site: SiteLock | None) -> None:
    hunks = f.hunks
    cls = classify(f.lines, hunks)
    sha = sha256_bytes(f.data)
    record = read_record(req.get("state_dir"), f.path)
    ours = bool(record) and record.get("patched_sha256") == sha
    if cls["overall"] == "patched":
        f.noop(ALREADY_APPLIED, f"already applied{_by(site, f.path, sha, 'patched')}: all {len(hunks)} hunks "
                                f"present; nothing to do")
        return
    if cls["overall"] == "pristine" and cls["both"] and (ours or _by(site, f.path, sha, "patched")):
        # The patched form fits too (e.g. a line deleted from a run of equal lines, where the diff's context
        # cannot tell the two apart): the record that this is the very file fleetops wrote settles it.
        f.noop(ALREADY_APPLIED, f"already applied{_by(site, f.path, sha, 'patched')}: this is the file "
                                f"fleetops wrote (sha256 matches its record); the {len(hunks)} hunks alone cannot "
                                f"tell it from the original")
        return
    if cls["overall"] == "drifted":
        f.refuse(DRIFTED, f"drifted: {f.path} matches neither the pristine nor the patched form; nothing written",
                 drift=drift_report(f.lines, hunks, cls))
        return
    new_text = apply_hunks(f.lines, hunks, cls)
    f.new = new_text.encode("utf-8")
    f.item["diff_text"] = unified(f.data.decode("utf-8"), new_text, f.path)
    f.would_msg = f"would apply {len(hunks)} hunks"


def _plan_rollback(req: dict, f: _File, site: SiteLock | None) -> None:
    hunks, n = f.hunks, len(f.hunks)
    cls = classify(f.lines, hunks)
    sha = sha256_bytes(f.data)
    record = read_record(req.get("state_dir"), f.path)
    _, orig_path = backup_paths(req["state_dir"], f.path) if req.get("state_dir") else ("", "")
    wheel_sha, wheel_record = record_sha256(site_root_of(f.path), f.path)
    wrote_patched = (bool(record) and record.get("patched_sha256") == sha) or bool(_by(site, f.path, sha,
                                                                                       "patched"))
    overall = cls["overall"]
    if overall == "pristine" and cls["both"] and wrote_patched:
        overall = "patched"  # the tie (see hunks.classify): this is the file fleetops wrote; reverse it
        cls = {**cls, "hunks": [{**s, "state": "patched", "at_old": None, "at_new": at}
                                for s, at in zip(cls["hunks"], cls["reverse_at"])]}
    if overall == "pristine":
        _rollback_pristine(f, site, sha, record, wheel_sha == sha, wheel_record)
        return
    backup = read_backup(orig_path, record)
    if overall == "patched":
        reversed_text = apply_hunks(f.lines, hunks, cls, reverse=True)
        new = reversed_text.encode("utf-8")
        rsha = sha256_bytes(new)
        proof = wheel_sha or (rsha if wrote_patched else None)  # the bytes an untouched rollback must give
        bad = bad_backup(backup, orig_path, proof, wheel_record)
        if bad:
            f.refuse(FAILED, bad + f"; refusing to restore it; {f.path} is unchanged. The hunks alone can roll it "
                                   f"back: move {orig_path} and its .json aside and run rollback again")
            return
        if wheel_sha and rsha == wheel_sha:
            if backup:
                what = (f"the saved original (sha256 {rsha[:12]} verified: the hunks reversed, the saved backup and "
                        f"the wheel's RECORD agree)")
            else:
                what = (f"the original by reversing the {n} hunks (sha256 {rsha[:12]} verified against the wheel's "
                        f"RECORD)")
        elif not wrote_patched and record and record.get("patched_sha256"):
            what = (f"the original by reversing the {n} hunks; edits made after the patch, outside the hunks, are "
                    f"kept (the file was not the one fleetops wrote)")
        elif wheel_sha and backup and backup[1] == wheel_sha:
            # exactly the file fleetops wrote, yet the hunks reversed do not give the wheel's bytes (hunks
            # placed ambiguously): the saved original, proven by RECORD, is the answer.
            new, rsha = backup[0], backup[1]
            what = f"the saved original (sha256 {rsha[:12]} verified against the wheel's RECORD)"
        elif wheel_sha:
            what = (f"the original by reversing the {n} hunks (sha256 {rsha[:12]}; not the wheel's RECORD sha256 "
                    f"{wheel_sha[:12]}: the file was edited before or after the patch, outside the hunks; kept)")
        else:
            what = (f"the original by reversing the {n} hunks (sha256 {rsha[:12]}; the file is not in any RECORD"
                    f"{', the saved backup agrees' if backup and backup[1] == rsha else ''})")
        f.new = new
        f.item["diff_text"] = unified(f.data.decode("utf-8"), new.decode("utf-8"), f.path)
        f.would_msg, f.done_msg = f"would restore {what}", f"restored {what}"
        return
    # drifted: the patched form is not all there
    drift = _rollback_drift(f.lines, hunks, cls)
    if not req.get("force"):
        f.refuse(DRIFTED, f"drifted: {f.path} has neither the patched nor the pristine form of every hunk (edited "
                          f"after the patch?); nothing written. `rollback --force` restores the original (proven "
                          f"against the wheel's RECORD), discarding every change in the file", drift=drift)
        return
    if not wheel_sha:
        f.refuse(DRIFTED, f"drifted, and --force cannot prove an original: no RECORD lists {f.path}, so the saved "
                          f"backup cannot be checked; nothing written", drift=drift)
        return
    bad = bad_backup(backup, orig_path, wheel_sha, wheel_record)
    if bad or not backup:
        f.refuse(FAILED, (bad or f"drifted, and no saved original on this node ({orig_path})") + "; --force has "
                 f"nothing proven to restore; {f.path} is unchanged. Reinstall the package to get its files back",
                 drift=drift)
        return
    f.new = backup[0]
    f.item["diff_text"] = unified(f.data.decode("utf-8"), f.new.decode("utf-8", "replace"), f.path)
    what = (f"the saved original over a drifted file (--force; sha256 {wheel_sha[:12]} verified against the "
            f"wheel's RECORD): every change since the patch is gone (the diff shows them)")
    f.item["drift"] = drift
    f.would_msg, f.done_msg = f"would restore {what}", f"restored {what}"


def _rollback_pristine(f: _File, site: SiteLock | None, sha: str, record: dict | None, wheels: bool,
                       wheel_record: str | None) -> None:
    """Nothing to roll back: say why (restored earlier, the saved original, or never patched), and whether a
    saved backup of other bytes is being ignored. `wheels`: the file's sha256 is its wheel's RECORD's."""
    if _by(site, f.path, sha, "pristine"):
        restored_by = _by(site, f.path, sha, "pristine").replace(" (by ", " (restored by ", 1)
        why = f"already original{restored_by}; nothing to do"
    elif record and record.get("original_sha256") == sha:
        why = "already original (sha256 matches the saved original); nothing to do"
    else:
        proof = f"; sha256 {sha[:12]} is the wheel's, per {wheel_record}" if wheels else ""
        why = f"not patched by fleetops; nothing to do (all {len(f.hunks)} hunks have their pristine form{proof})"
    f.noop(ALREADY_ORIGINAL, why)
    if record and record.get("original_sha256") not in (sha, None):
        f.note(f"the saved backup from {record.get('created', '?')} (sha256 "
               f"{str(record.get('original_sha256'))[:12]}) is of other bytes than this file; not used")


def _rollback_drift(lines: list[str], hunks: list[dict], cls: dict) -> list[dict]:
    """Hunk by hunk, where the patched form is not there: the patched lines expected, the lines found where
    the file looks most like them, and the first line that differs."""
    out: list[dict] = []
    for h, s in zip(hunks, cls["hunks"]):
        if s["state"] == "patched":
            continue
        item = {"hunk": s["index"] + 1, "header": h["header"], "state": s["state"]}
        if s["state"] == "pristine":
            item["message"] = f"hunk {s['index'] + 1} still has its pristine form: the file is only partly patched"
        else:
            block = h["new"]
            p = closest_window(lines, block, s["expected"])
            found = [x[:-1].removesuffix("\r") if x.endswith("\n") else x for x in lines[p: p + len(block)]]
            k = next((k for k in range(len(block)) if k >= len(found) or found[k] != block[k]), None)
            item.update({"near_line": p + 1, "expected": block, "found": found})
            if k is not None:
                item["first_difference"] = {"line": p + k + 1, "expected": block[k],
                                            "found": found[k] if k < len(found) else "<end of file>"}
        out.append(item)
    return out


# ---------------------------------------------------------------- the set
def _unapproved(req: dict) -> dict | None:
    """The client judges a playbook's pins (PEP 440) from the versions a node reports, and sends the versions it
    approved with the patch. Anything else installed now (or a first visit, with nothing approved yet) writes
    nothing: the answer reports what is installed, for the client to judge and send again."""
    found = report_versions(req.get("requires") or [])
    approved = req.get("versions_approved") or {}  # package -> [version strings]
    if all(r["found"] is not None and r["found"] in (approved.get(r["package"]) or ()) for r in found):
        return None
    return {"ok": False, "needs_approval": True, "requirements": found, "items": []}


def patch(req: dict) -> dict:
    if req.get("check"):  # writes nothing: the client judges the reported versions along with the plan
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
    """The set under the node lock and the lock beside the files (none when only checking: nothing written)."""
    if req.get("check"):
        if req.get("settle"):
            return settle(req, op)
        files = _plan_set(req, op, None)
        return _answer(files)
    with NodeLock(req["state_dir"], req.get("operator", "?"), op) as lock:
        roots = _roots(req)
        site = SiteLock(roots, req.get("host") or "?", req.get("operator", "?"), op) if roots else None
        if site is None:
            files = _plan_set(req, op, None)
            answer = _answer(files)
        else:
            with site:
                files = _plan_set(req, op, site)
                interrupted = site.interrupted([f.path for f in files if f.path])
                if interrupted:
                    _report_interrupted(files, interrupted)
                _write_set(req, op, files, site)
                answer = _answer(files)
    if lock.took_over:
        pid = lock.took_over.get("pid")
        fate = ("now belongs to another process" if str(pid).isdigit() and pid_alive(int(pid)) else "is gone")
        note = (f"took over a stale lock from {lock.took_over.get('operator')} (pid {pid} {fate}; its lock was "
                f"free, so it no longer held it)")
        for item in answer["items"]:
            item.setdefault("notes", []).insert(0, note)
    if site is not None and site.waited_for:
        holder = site.waited_for
        for item in answer["items"]:
            item.setdefault("notes", []).append(
                f"waited for {holder.get('host', '?')} ({holder.get('op', '?')}, pid {holder.get('pid', '?')}), "
                f"which was changing the same files (a venv shared with it)")
    return answer


def _roots(req: dict) -> list[str]:
    roots = []
    for p in req["patches"]:
        try:
            roots.append(site_root_of(module_file_in_site(p["module"])))
        except NodeError:
            pass  # reported by its file's load, under the lock
    return roots


def settle(req: dict, op: str) -> dict:
    """What a host ended with after its client lost the answer of a patch or rollback (Ctrl-C): under the lock
    beside the files, so the agent that was writing has finished (or put back) first, each file's form now, and
    how the set with the request's token ended (written, put back, or still unfinished: its writer died).
    Nothing is written but the lock's own record."""
    token = str(req["settle"])
    roots = _roots(req)
    if not roots:
        answer = _answer(_plan_set(req, op, None, forms=True))
        answer["settled"] = {"outcome": None, "unfinished": None}
        return answer
    with SiteLock(roots, req.get("host") or "?", req.get("operator", "?"), "settle",
                  wait_s=float(req.get("settle_wait_s") or 20)) as site:
        outcome = site.take_outcome(token)
        unfinished = next((e for e in site.unfinished() if e.get("token") == token), None)
        files = _plan_set(req, op, site, forms=True)
    answer = _answer(files)
    answer["settled"] = {"outcome": outcome, "unfinished": unfinished}
    return answer


def _plan_set(req: dict, op: str, site: SiteLock | None, forms: bool = False) -> list[_File]:
    files = [_File(p) for p in req["patches"]]
    for f in files:
        if f.load():
            if f.p.get("script"):  # a script patch: scriptpatch.py plans it
                from .scriptpatch import plan_script

                plan_script(req, op, f)
            else:
                (_plan_patch if op == "patch" else _plan_rollback)(req, f, site)
        if forms:  # each file's form now, before the all-or-nothing rule below rewrites the items
            f.item["form"] = _form(op, f)
    check_only = bool(req.get("check"))
    if not any(f.refusal for f in files) and not check_only:
        _check_room(req, op, files)
    elif check_only and not req.get("settle"):
        check_access(req, op, files)
    blockers = [f for f in files if f.refusal]
    for f in files:
        if f.new is None or f.refusal:
            continue
        if blockers:
            names = ", ".join(f"{b.p['module']} ({b.item['status'].replace('_', ' ')})" for b in blockers)
            f.new = None
            verb = "would not be written (check mode)" if check_only else "not written"
            f.item.update({"status": NOT_WRITTEN, "ok": False, "msg": f"{verb}: the set is all-or-nothing and "
                                                                       f"{names} stops it"})
        elif check_only:
            f.item.update({"status": WOULD_APPLY if op == "patch" else WOULD_RESTORE, "ok": True,
                           "msg": f"{f.would_msg} (check mode: nothing written)"})
    return files


def _form(op: str, f: _File) -> str:
    if "drift" in f.item:
        return "drifted"
    if f.refusal:
        return "unknown"
    start, end = ("pristine", "patched") if op == "patch" else ("patched", "pristine")
    return start if f.new is not None else end


def _check_room(req: dict, op: str, files: list[_File]) -> None:
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
                f.refuse(FAILED, os_error_message(exc, f"cannot check {probe}") + "; nothing written")
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
                f.refuse(FAILED, f"not enough free space on the file system of {probe}: the set needs "
                                 f"{need[st.st_dev]} bytes (+{SPACE_MARGIN} spare), {free} free; nothing written")


def _report_interrupted(files: list[_File], pending: dict) -> None:
    note = (f"an earlier {pending.get('op', '?')} by {pending.get('host', '?')} (pid {pending.get('pid', '?')}, "
            f"{pending.get('at', '?')}) died before finishing this set; this run finishes it in its own direction")
    for f in files:
        f.note(note)


def _write_set(req: dict, op: str, files: list[_File], site: SiteLock) -> None:
    todo = [f for f in files if f.new is not None and not f.refusal]
    paths = [f.path for f in files if f.path]
    token = req.get("token")
    if not todo:
        if site.interrupted(paths) and not any(f.refusal for f in files):
            site.finish({}, covered=paths)  # whole again (nothing left to write): a dead writer's mark goes
        return
    try:
        site.begin(op, [{"path": f.path, "before": sha256_bytes(f.data), "after": sha256_bytes(f.new or b"")}
                        for f in todo], token)
        written: list[_File] = []
        for i, f in enumerate(todo):
            assert f.new is not None
            try:
                if op == "patch":
                    record = save_backup(req["state_dir"], f.path, f.p["module"], f.data, f.new,
                                         req.get("playbook", "?"))
                    f.extra = {"original_sha256": record["original_sha256"]}
                    f.done_msg = f"applied {f.p.get('what') or f'{len(f.hunks)} hunks'} (original saved, sha256 " \
                                 f"{record['original_sha256'][:12]})"
                    if f.p.get("script"):  # the script's sha256 joins the backup record (scriptpatch.py)
                        from .scriptpatch import note_script

                        note_script(req["state_dir"], f.path, f.p)
                atomic_write(f.path, f.new, like=f.path, point=f"{op}.target")
            except OSError as exc:
                why = os_error_message(exc, f"cannot {'patch' if op == 'patch' else 'restore'} {f.path}")
                if _undo(written, f, why, todo[i + 1:]):
                    site.finish({}, token=token, outcome="put back")
                return
            written.append(f)
        done = {}
        for f in written:
            assert f.new is not None
            f.item.update({"status": APPLIED if op == "patch" else RESTORED, "ok": True, "changed": True,
                           "sha256": sha256_bytes(f.new), "bytecode_removed": remove_stale_bytecode(f.path),
                           "msg": f.done_msg, **f.extra})
            done[f.path] = {"form": "patched" if op == "patch" else "pristine", "sha256": sha256_bytes(f.new)}
        site.finish(done, covered=paths, token=token)
    except KeyboardInterrupt:  # the client went away (Ctrl-C) mid-set; this agent is alive: the set ends whole
        held = _hold_interrupts()
        try:
            _end_interrupted(op, todo, paths, site, token)
        finally:
            _release_interrupts(held)
        raise


def _end_interrupted(op: str, todo: list[_File], paths: list[str], site: SiteLock, token: str | None) -> None:
    """After an interrupt in the middle of the set: each file is put back as it was, unless every one was
    already written (the set is whole and new: it stays, as if the interrupt had come a moment later). Its
    outcome is kept under the request's token for the client that asks (settle)."""
    now: dict[str, str | None] = {}
    for f in todo:
        try:
            with open(f.path, "rb") as fh:
                now[f.path] = sha256_bytes(fh.read())
        except OSError:
            now[f.path] = None
    if all(now[f.path] == sha256_bytes(f.new or b"") for f in todo):
        site.finish({f.path: {"form": "patched" if op == "patch" else "pristine", "sha256": now[f.path]}
                     for f in todo}, covered=paths, token=token)
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
            print(f"fleetops: {os_error_message(exc, f'putting {f.path} back failed')}; the set is half-written: "
                  "run rollback", file=sys.stderr)
    if whole:  # our own mark goes; a dead writer's, if the set had one before us, stays
        site.finish({}, token=token, outcome="put back" if restored else "not written")
    elif token:
        site.record_outcome(token, {"outcome": "half-written", "op": op, "at": now_iso(), "files": now})
        site.save()


def _hold_interrupts() -> object:
    """No second interrupt while the set is put back (the client's watchdog sends one; this is belt and braces
    against any other). Only the main thread may change it: elsewhere nothing is held."""
    try:
        return signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:
        return None


def _release_interrupts(held: object) -> None:
    if held is not None:
        try:
            signal.signal(signal.SIGINT, held)
        except ValueError:
            pass


def _undo(written: list[_File], failed: _File, why: str, rest: list[_File]) -> bool:
    """A write failed midway: put the files already written back as they were, so the set stays whole.
    False when one could not be put back (the set is half-written and stays marked unfinished)."""
    failed.refuse(FAILED, f"{why}; the file is unchanged")
    whole = True
    for f in written:
        try:
            atomic_write(f.path, f.data, like=f.path, point="undo.target")
            remove_stale_bytecode(f.path)
            f.item.update({"status": NOT_WRITTEN, "ok": False, "changed": False,
                           "msg": f"written, then put back as it was (sha256 {sha256_bytes(f.data)[:12]}): "
                                  f"{failed.p['module']} failed, and the set is all-or-nothing"})
        except OSError as exc:
            whole = False
            f.item.update({"status": FAILED, "ok": False, "changed": True,
                           "msg": os_error_message(exc, f"written, and putting {f.path} back failed") +
                           "; the set is half-written: run rollback"})
    for f in rest:
        f.item.update({"status": NOT_WRITTEN, "ok": False,
                       "msg": f"not written: {failed.p['module']} failed first, and the set is all-or-nothing"})
    return whole


def _answer(files: list[_File]) -> dict:
    items = [f.item for f in files]
    return {"ok": all(i.get("ok") for i in items), "items": items}
