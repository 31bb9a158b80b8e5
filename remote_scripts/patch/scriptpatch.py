"""Script patches (a playbook's `script:` entry): `transform(text: str) -> str` run on the module's
file, with every guarantee a diff has; patching.py runs the set (requirements first, locks,
all-or-nothing, atomic write, backup, --check/--diff) and planset.py hands each script entry to
plan_script here. Stdlib only.

The script runs in a child process of the node's Python (`-I`: isolated, no user site, no
environment hooks), bounded in time, on the current text and again on its own result:
- transform(current) == current: already applied, nothing to do;
- it raises (or returns something else than str), or its result does not compile: refused, nothing
  written;
- transform(transform(x)) != transform(x): refused as not idempotent (a second `patch` would change
  the file again, and "already applied" could never be told);
- otherwise the result is what the set writes; the backup record also gets the script's sha256.
A transform cannot be reversed, so rollback restores the saved original, and only when it is proven:
its bytes are the wheel's (RECORD) or, for a file no RECORD lists, those the record saved; and only
when the file is still exactly what the script wrote (else drifted, refused unless --force, as for
diffs).
"""

from __future__ import annotations

import difflib
import json
import subprocess
import sys

from ..core.atomicio import write_json_atomic
from ..core.nodeio import sha256_bytes
from ..core.protocol import ALREADY_APPLIED, ALREADY_ORIGINAL, DRIFTED, FAILED
from ..core.statetrust import read_json
from .backups import backup_paths, bad_backup, read_backup, read_record
from .sitelock import site_root_of
from .wheelrecord import record_sha256

TIMEOUT_S = 120

RUNNER = r"""
import json, sys, traceback
req = json.loads(sys.stdin.read())
name = req["name"]
try:
    ns = {"__name__": "fleetops_patch_script", "__file__": name}
    exec(compile(req["source"], name, "exec"), ns)
    transform = ns.get("transform")
    if not callable(transform):
        raise TypeError("the script defines no transform(text) function")
    outs = []
    for text in (req["text"], None):
        out = transform(outs[-1] if text is None else text)
        if not isinstance(out, str):
            raise TypeError(f"transform returned {type(out).__name__}, not str")
        outs.append(out)
    answer = {"ok": True, "once": outs[0], "twice": outs[1]}
except BaseException as exc:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == name]
    answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
              "line": frames[-1].lineno if frames else None}
sys.stdout.write(json.dumps(answer))
"""


def run_transform(p: dict, text: str) -> dict:
    """{"ok", "once", "twice"} or {"ok": False, "error", "line"}: the script on `text`, then on its
    result."""
    request = json.dumps(
        {"name": p.get("script_name") or "script.py", "source": p["script"], "text": text}
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-c", RUNNER],
            input=request,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"transform did not finish in {TIMEOUT_S}s", "line": None}
    try:
        return json.loads(proc.stdout)
    except ValueError:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return {
            "ok": False,
            "error": f"the script's process exited {proc.returncode} without an answer: {tail}",
            "line": None,
        }


def _first_difference(a: str, b: str) -> str:
    la, lb = a.split("\n"), b.split("\n")
    k = next(
        (i for i in range(max(len(la), len(lb))) if i >= len(la) or i >= len(lb) or la[i] != lb[i]),
        None,
    )
    if k is None:
        return ""
    return (
        f"first difference at line {k + 1}: {la[k] if k < len(la) else '<end of file>'!r} then "
        f"{lb[k] if k < len(lb) else '<end of file>'!r}"
    )


def _label(p: dict) -> str:
    return f"script {p.get('script_name', '?')} (sha256 {str(p.get('script_sha256', ''))[:12]})"


def _unified(old: str, new: str, path: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            f"a{path}",
            f"b{path}",
            n=3,
        )
    )


def plan_script(req: dict, op: str, f) -> None:  # planset.SetFile (imported by it, not from it)
    if op == "patch":
        _plan_patch(f)
    else:
        _plan_rollback(req, f)


def _plan_patch(f) -> None:
    p = f.p
    text = f.data.decode("utf-8")
    label = _label(p)
    f.p["what"] = label
    got = run_transform(p, text)
    if not got["ok"]:
        where = f" (line {got['line']} of {p.get('script_name')})" if got.get("line") else ""
        f.refuse(FAILED, f"{label} failed on {f.path}: {got['error']}{where}; nothing written")
        return
    once, twice = got["once"], got["twice"]
    if once == text:
        f.noop(
            ALREADY_APPLIED,
            f"already applied: {label} changes nothing in the file (transform(current) == "
            f"current); nothing to do",
        )
        return
    if twice != once:
        f.refuse(
            FAILED,
            f"{label} is not idempotent: transform(transform(x)) != transform(x) "
            f"({_first_difference(once, twice)}); a second patch would change the file again, so "
            "it is refused; nothing written",
        )
        return
    try:
        compile(once, f.path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        f.refuse(
            FAILED,
            f"{label} produces a file that does not compile: {exc.msg} at line {exc.lineno} "
            f"({(exc.text or '').strip()!r}); nothing written",
        )
        return
    f.new = once.encode("utf-8")
    f.item["diff_text"] = _unified(text, once, f.path)
    f.item["script_sha256"] = p.get("script_sha256")
    f.would_msg = f"would apply {label}"


def note_script(state_dir: str, path: str, p: dict) -> None:
    """The script's name and sha256 join the backup record backups.save_backup just wrote."""
    record_path, _ = backup_paths(state_dir, path)
    record = read_json(record_path, on_corrupt="quarantine") or {}
    record.update({"script": p.get("script_name"), "script_sha256": p.get("script_sha256")})
    write_json_atomic(record_path, record, point="patch.script_record")


def _plan_rollback(req: dict, f) -> None:
    sha = sha256_bytes(f.data)
    wheel_sha, wheel_record = record_sha256(site_root_of(f.path), f.path)
    record = read_record(req.get("state_dir"), f.path)
    if sha == wheel_sha or (record and sha == record.get("original_sha256")):
        proof = f"the wheel's, per {wheel_record}" if sha == wheel_sha else "the saved original's"
        f.noop(ALREADY_ORIGINAL, f"already original (sha256 {sha[:12]} is {proof}); nothing to do")
        return
    if not record:
        f.refuse(
            DRIFTED,
            f"{f.path} is not the wheel's file and this node saved no original for it (a transform "
            f"cannot be reversed); nothing written. Reinstall the package to get its files back",
        )
        return
    orig_path = backup_paths(req["state_dir"], f.path)[1] if req.get("state_dir") else ""
    backup = read_backup(orig_path, record)
    bad = bad_backup(backup, orig_path, wheel_sha or record.get("original_sha256"), wheel_record)
    if bad or backup is None:
        f.refuse(FAILED, (bad or f"no saved original at {orig_path}") + f"; {f.path} is unchanged")
        return
    ours = record.get("patched_sha256") == sha
    drifted = None if ours else _drifted_refusal(req, f, sha, record, wheel_sha)
    if drifted:
        f.refuse(DRIFTED, drifted)
        return
    _restore_saved(f, backup, ours, bool(wheel_sha))


def _drifted_refusal(req: dict, f, sha: str, record: dict, wheel_sha: str | None) -> str | None:
    """Why a file edited since the transform wrote it is not restored; None: `--force`, and the
    wheel's RECORD proves the original."""
    if not req.get("force"):
        return (
            f"drifted: {f.path} is not the file {_label(f.p)} wrote (sha256 {sha[:12]}, written "
            f"{str(record.get('patched_sha256'))[:12]}): edited since; nothing written. `rollback "
            f"--force` restores the original (proven against the wheel's RECORD), discarding every "
            f"change in the file"
        )
    if not wheel_sha:
        return (
            f"drifted, and --force cannot prove an original: no RECORD lists {f.path}; "
            "nothing written"
        )
    return None


def _restore_saved(f, backup: tuple[bytes, str, dict], ours: bool, in_record: bool) -> None:
    """The saved original is the rollback: a transform cannot be reversed."""
    f.new = backup[0]
    f.item["diff_text"] = _unified(f.data.decode("utf-8"), f.new.decode("utf-8", "replace"), f.path)
    how = (
        "verified against the wheel's RECORD"
        if in_record
        else "the saved record's; no RECORD lists the file"
    )
    what = (
        f"the saved original (sha256 {backup[1][:12]}, {how}): {_label(f.p)} cannot be reversed, "
        "so its input is put back"
    )
    if not ours:
        what += " (--force over a drifted file: every change since the patch is gone)"
    f.would_msg, f.done_msg = f"would restore {what}", f"restored {what}"
