"""Apply, check and roll back a playbook's patches on the node's installed files. Stdlib only.

A patch is a list of hunks (old block → new block). A file is *pristine* when every old block sits where
patch(1) would apply it, *patched* when every new block sits where patch -R would find it, and *drifted*
otherwise (hunks.py decides); only a pristine file is written, and a drifted one is reported hunk by hunk with
what was expected and what is there.
"""

from __future__ import annotations

import difflib
import hashlib
import os

from .hunks import apply_hunks, classify, drift_report, split_lines
from .nodeio import (
    NodeError,
    NodeLock,
    atomic_write,
    check_requirements,
    ensure_dir,
    failpoint,
    module_file_in_site,
    now_iso,
    os_error_message,
    read_json,
    remove_stale_bytecode,
    sha256_bytes,
    write_json_atomic,
)
from .protocol import (
    ALREADY_APPLIED,
    ALREADY_ORIGINAL,
    APPLIED,
    DRIFTED,
    FAILED,
    REFUSED,
    RESTORED,
    WOULD_APPLY,
    WOULD_RESTORE,
)


def unified(old: str, new: str, path: str) -> str:
    return "".join(difflib.unified_diff(split_lines(old), split_lines(new), f"a{path}", f"b{path}", n=3))


# ---------------------------------------------------------------- backups
def _backup_paths(state_dir: str, path: str) -> tuple[str, str]:
    key = hashlib.sha256(path.encode()).hexdigest()[:16] + "-" + os.path.basename(path)
    base = os.path.join(state_dir, "backups")
    return os.path.join(base, key + ".json"), os.path.join(base, key + ".orig")


def save_backup(state_dir: str, path: str, module: str, original: bytes, patched: bytes, playbook: str) -> dict:
    record_path, orig_path = _backup_paths(state_dir, path)
    ensure_dir(os.path.dirname(record_path))
    original_sha = sha256_bytes(original)
    record = read_json(record_path)
    if not (record and record.get("original_sha256") == original_sha and os.path.exists(orig_path)):
        atomic_write(orig_path, original, mode=0o600, point="patch.backup")
        record = {"path": path, "module": module, "original_sha256": original_sha, "created": now_iso()}
    record.update({"patched_sha256": sha256_bytes(patched), "playbook": playbook, "patched_at": now_iso()})
    write_json_atomic(record_path, record, point="patch.record")
    failpoint("patch.after_backup")
    return record


def _we_wrote(state_dir: str | None, path: str, data: bytes) -> bool:
    if not state_dir:
        return False
    try:
        record = read_json(_backup_paths(state_dir, path)[0])
    except NodeError:
        return False  # a corrupt record proves nothing; the hunks' own verdict stands
    return bool(record) and record.get("patched_sha256") == sha256_bytes(data)


# ---------------------------------------------------------------- operations
def _load_item(p: dict) -> tuple[dict, tuple[str, bytes, list[str]] | None]:
    item: dict = {"module": p["module"], "diff": p.get("diff_name"), "changed": False}
    try:
        loaded = _load(p["module"])
    except NodeError as exc:
        return {**item, "status": REFUSED, "ok": False, "msg": str(exc)}, None
    item["file"] = loaded[0]
    return item, loaded


def _load(module: str) -> tuple[str, bytes, list[str]]:
    path = module_file_in_site(module)
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise NodeError(f"{path} is not UTF-8 text; refusing to patch it") from None
    return path, data, split_lines(text)


def _refuse_on_requirements(req: dict) -> list[dict] | None:
    checks = check_requirements(req.get("requires", []))
    bad = [c for c in checks if not c["ok"]]
    if not bad:
        return None
    found = ", ".join(f"{c['package']} {c['found'] or 'not installed'}" for c in checks)
    wanted = ", ".join(c["requirement"] for c in bad)
    msg = f"requirements not met: need {wanted}; found {found}"
    if req.get("requires_hint"):
        msg += f". {req['requires_hint']}"
    return [{"module": None, "status": REFUSED, "changed": False, "ok": False, "msg": msg,
             "requirements": checks}]


def patch(req: dict) -> dict:
    refused = _refuse_on_requirements(req)
    if refused:
        return {"ok": False, "items": refused}
    return _each_file(req, "patch", _patch_one)


def _each_file(req: dict, op: str, one) -> dict:
    """Run `one` on every patched file: under the node lock, unless only checking (which writes nothing)."""
    check_only = bool(req.get("check"))
    if check_only:
        items = [one(req, p, True) for p in req["patches"]]
    else:
        with NodeLock(req["state_dir"], req.get("operator", "?"), op) as lock:
            items = [one(req, p, False) for p in req["patches"]]
        if lock.took_over:
            for item in items:
                item.setdefault("notes", []).append(
                    f"took over a stale lock from {lock.took_over.get('operator')} (pid "
                    f"{lock.took_over.get('pid')} is gone)")
    return {"ok": all(i["ok"] for i in items), "items": items}


def _patch_one(req: dict, p: dict, check_only: bool) -> dict:
    module, hunks = p["module"], p["hunks"]
    item, loaded = _load_item(p)
    if loaded is None:
        return item
    path, data, lines = loaded
    cls = classify(lines, hunks)
    if cls["overall"] == "patched":
        return {**item, "status": ALREADY_APPLIED, "ok": True, "sha256": sha256_bytes(data),
                "msg": f"already applied: all {len(hunks)} hunks present; nothing to do"}
    if cls["overall"] == "pristine" and cls["both"] and _we_wrote(req.get("state_dir"), path, data):
        # The patched form fits too (e.g. a line deleted from a run of equal lines, where the diff's context
        # cannot tell the two apart): the node's record that this is the very file it wrote settles it.
        return {**item, "status": ALREADY_APPLIED, "ok": True, "sha256": sha256_bytes(data),
                "msg": f"already applied: this is the file fleetops wrote (sha256 matches its record); the "
                       f"{len(hunks)} hunks alone cannot tell it from the original"}
    if cls["overall"] == "drifted":
        drift = drift_report(lines, hunks, cls)
        return {**item, "status": DRIFTED, "ok": False, "drift": drift,
                "msg": f"drifted: {path} matches neither the pristine nor the patched form; nothing written"}
    new_text = apply_hunks(lines, hunks, cls)
    new_data = new_text.encode("utf-8")
    diff = unified(data.decode("utf-8"), new_text, path)
    if check_only:
        return {**item, "status": WOULD_APPLY, "ok": True, "diff_text": diff,
                "msg": f"would apply {len(hunks)} hunks (check mode: nothing written)"}
    try:
        record = save_backup(req["state_dir"], path, module, data, new_data, req.get("playbook", "?"))
        atomic_write(path, new_data, like=path, point="patch.target")
    except OSError as exc:
        return {**item, "status": FAILED, "ok": False, "msg": os_error_message(exc, f"cannot patch {path}")
                + "; the file is unchanged"}
    removed = remove_stale_bytecode(path)
    return {**item, "status": APPLIED, "ok": True, "changed": True, "diff_text": diff,
            "sha256": record["patched_sha256"], "original_sha256": record["original_sha256"],
            "bytecode_removed": removed, "msg": f"applied {len(hunks)} hunks (original saved, sha256 "
                                                f"{record['original_sha256'][:12]})"}


def rollback(req: dict) -> dict:
    return _each_file(req, "rollback", _rollback_one)


def _rollback_one(req: dict, p: dict, check_only: bool) -> dict:
    hunks = p["hunks"]
    item, loaded = _load_item(p)
    if loaded is None:
        return item
    path, data, lines = loaded
    current_sha = sha256_bytes(data)
    record_path, orig_path = _backup_paths(req["state_dir"], path)
    record = read_json(record_path)
    cls = classify(lines, hunks)
    if record and current_sha == record.get("original_sha256"):
        return {**item, "status": ALREADY_ORIGINAL, "ok": True, "sha256": current_sha,
                "msg": "already original (sha256 matches the saved original); nothing to do"}
    if not record and cls["overall"] == "pristine":
        return {**item, "status": ALREADY_ORIGINAL, "ok": True, "sha256": current_sha,
                "msg": "not patched (file has the pristine form); nothing to do"}
    if record and (current_sha == record.get("patched_sha256") or cls["overall"] == "patched"):
        try:
            with open(orig_path, "rb") as f:
                original = f.read()
        except OSError as exc:
            return {**item, "status": FAILED, "ok": False, "msg": os_error_message(exc, "backup unreadable")}
        if sha256_bytes(original) != record["original_sha256"]:
            return {**item, "status": FAILED, "ok": False,
                    "msg": f"backup {orig_path} does not match its recorded sha256; refusing to restore it"}
        what = f"the saved original (sha256 {record['original_sha256'][:12]} verified)"
        would, done = f"would restore {what}", f"restored {what}"
        new_data = original
    elif cls["overall"] == "patched":
        new_data = apply_hunks(lines, hunks, cls, reverse=True).encode("utf-8")
        what = "the patch's hunks (no saved original on this node)"
        would, done = f"would reverse {what}", f"reversed {what}"
    else:
        drift = drift_report(lines, hunks, cls) if cls["overall"] == "drifted" else []
        return {**item, "status": DRIFTED, "ok": False, "drift": drift,
                "msg": f"drifted: {path} is neither the saved original nor the patched form; nothing written"}
    diff = unified(data.decode("utf-8"), new_data.decode("utf-8"), path)
    if check_only:
        return {**item, "status": WOULD_RESTORE, "ok": True, "diff_text": diff,
                "msg": f"{would} (check mode: nothing written)"}
    try:
        atomic_write(path, new_data, like=path, point="rollback.target")
    except OSError as exc:
        return {**item, "status": FAILED, "ok": False,
                "msg": os_error_message(exc, f"cannot restore {path}") + "; the file is unchanged"}
    removed = remove_stale_bytecode(path)
    return {**item, "status": RESTORED, "ok": True, "changed": True, "sha256": sha256_bytes(new_data),
            "diff_text": diff, "bytecode_removed": removed, "msg": done}
