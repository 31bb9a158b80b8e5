"""Apply, check and roll back a playbook's patches on the node's installed files. Stdlib only.

A patch is a list of hunks (old block → new block). A file is *pristine* when every old block is found,
*patched* when every new block is found, and *drifted* otherwise; only a pristine file is written, and a
drifted one is reported hunk by hunk with what was expected and what is there.
"""

from __future__ import annotations

import difflib
import hashlib
import os

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


def split_lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _strip(line: str) -> str:
    return line.rstrip("\r\n")


def find_block(lines: list[str], block: list[str], expected: int) -> int | None:
    """Index where `block` occurs in `lines`, the occurrence nearest `expected` (like patch(1) offsets)."""
    if not block:
        return None
    n = len(block)
    first = block[0]
    best = None
    for p in range(len(lines) - n + 1):
        if _strip(lines[p]) != first:
            continue
        if all(_strip(lines[p + k]) == block[k] for k in range(1, n)):
            if best is None or abs(p - expected) < abs(best - expected):
                best = p
    return best


def closest_window(lines: list[str], block: list[str], expected: int) -> int:
    """Where the file looks most like `block`, to show an operator what drifted."""
    n = len(block)
    best, best_score = max(0, min(expected, len(lines) - 1)), -1
    for p in range(max(1, len(lines) - n + 1)):
        score = sum(1 for k in range(min(n, len(lines) - p)) if _strip(lines[p + k]) == block[k])
        if score > best_score or (score == best_score and abs(p - expected) < abs(best - expected)):
            best, best_score = p, score
    return best


def classify(lines: list[str], hunks: list[dict]) -> dict:
    """Per hunk: where its old and new blocks are. The whole file: pristine / patched / drifted."""
    states = []
    offset = 0
    for h in hunks:
        expected = h["old_start"] - 1 + offset
        at_old = find_block(lines, h["old"], expected)
        at_new = find_block(lines, h["new"], expected)
        if at_old is not None and at_new is None:
            state = "pristine"
            offset = at_old - (h["old_start"] - 1)
        elif at_new is not None and at_old is None:
            state = "patched"
            offset = at_new - (h["old_start"] - 1)
        elif at_old is None:
            state = "missing"
        else:
            state = "ambiguous"
        states.append({"index": h["index"], "header": h["header"], "state": state, "at_old": at_old,
                       "at_new": at_new, "expected": expected})
    kinds = {s["state"] for s in states}
    overall = kinds.pop() if len(kinds) == 1 and kinds <= {"pristine", "patched"} else "drifted"
    return {"overall": overall, "hunks": states}


def drift_report(lines: list[str], hunks: list[dict], cls: dict) -> list[dict]:
    out = []
    applied = [s["index"] + 1 for s in cls["hunks"] if s["state"] == "patched"]
    pending = [s["index"] + 1 for s in cls["hunks"] if s["state"] == "pristine"]
    for h, s in zip(hunks, cls["hunks"]):
        if s["state"] in ("pristine", "patched"):
            continue
        block = h["old"]
        p = closest_window(lines, block, s["expected"])
        found = [_strip(x) for x in lines[p: p + len(block)]]
        mismatch = next((k for k in range(len(block)) if k >= len(found) or found[k] != block[k]), None)
        item = {"hunk": s["index"] + 1, "header": h["header"], "state": s["state"], "near_line": p + 1,
                "expected": block, "found": found}
        if mismatch is not None:
            item["first_difference"] = {"line": p + mismatch + 1, "expected": block[mismatch],
                                        "found": found[mismatch] if mismatch < len(found) else "<end of file>"}
        out.append(item)
    if not out and applied and pending:
        out.append({"hunk": None, "state": "partial",
                    "message": f"partially patched: hunks {applied} applied, hunks {pending} not"})
    return out


def apply_hunks(lines: list[str], hunks: list[dict], cls: dict, reverse: bool = False) -> str:
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    out = list(lines)
    pairs = sorted(zip(hunks, cls["hunks"]), key=lambda hs: hs[1]["at_new" if reverse else "at_old"],
                   reverse=True)
    for h, s in pairs:
        src, dst = (h["new"], h["old"]) if reverse else (h["old"], h["new"])
        at = s["at_new"] if reverse else s["at_old"]
        tail_newline = out[at + len(src) - 1].endswith(("\n", "\r")) if src else True
        replacement = [x + newline for x in dst]
        if replacement and not tail_newline:
            replacement[-1] = replacement[-1].rstrip("\r\n")
        out[at: at + len(src)] = replacement
    return "".join(out)


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


# ---------------------------------------------------------------- operations
def _load_item(p: dict) -> tuple[dict, tuple[str, bytes, list[str]] | None]:
    item: dict = {"module": p["module"], "diff": p.get("diff_name"), "changed": False}
    try:
        loaded = _load(p["module"])
    except NodeError as exc:
        return {**item, "status": "refused", "ok": False, "msg": str(exc)}, None
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
    return [{"module": None, "status": "refused", "changed": False, "ok": False, "msg": msg,
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
        return {**item, "status": "already_applied", "ok": True, "sha256": sha256_bytes(data),
                "msg": f"already applied: all {len(hunks)} hunks present; nothing to do"}
    if cls["overall"] == "drifted":
        drift = drift_report(lines, hunks, cls)
        return {**item, "status": "drifted", "ok": False, "drift": drift,
                "msg": f"drifted: {path} matches neither the pristine nor the patched form; nothing written"}
    new_text = apply_hunks(lines, hunks, cls)
    new_data = new_text.encode("utf-8")
    diff = unified(data.decode("utf-8"), new_text, path)
    if check_only:
        return {**item, "status": "would_apply", "ok": True, "diff_text": diff,
                "msg": f"would apply {len(hunks)} hunks (check mode: nothing written)"}
    try:
        record = save_backup(req["state_dir"], path, module, data, new_data, req.get("playbook", "?"))
        atomic_write(path, new_data, like=path, point="patch.target")
    except OSError as exc:
        return {**item, "status": "failed", "ok": False, "msg": os_error_message(exc, f"cannot patch {path}")
                + "; the file is unchanged"}
    removed = remove_stale_bytecode(path)
    return {**item, "status": "applied", "ok": True, "changed": True, "diff_text": diff,
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
        return {**item, "status": "already_original", "ok": True, "sha256": current_sha,
                "msg": "already original (sha256 matches the saved original); nothing to do"}
    if not record and cls["overall"] == "pristine":
        return {**item, "status": "already_original", "ok": True, "sha256": current_sha,
                "msg": "not patched (file has the pristine form); nothing to do"}
    if record and (current_sha == record.get("patched_sha256") or cls["overall"] == "patched"):
        try:
            with open(orig_path, "rb") as f:
                original = f.read()
        except OSError as exc:
            return {**item, "status": "failed", "ok": False, "msg": os_error_message(exc, "backup unreadable")}
        if sha256_bytes(original) != record["original_sha256"]:
            return {**item, "status": "failed", "ok": False,
                    "msg": f"backup {orig_path} does not match its recorded sha256; refusing to restore it"}
        how = f"restored the saved original (sha256 {record['original_sha256'][:12]} verified)"
        new_data = original
    elif cls["overall"] == "patched":
        new_data = apply_hunks(lines, hunks, cls, reverse=True).encode("utf-8")
        how = "reversed the patch's hunks (no saved original on this node)"
    else:
        drift = drift_report(lines, hunks, cls) if cls["overall"] == "drifted" else []
        return {**item, "status": "drifted", "ok": False, "drift": drift,
                "msg": f"drifted: {path} is neither the saved original nor the patched form; nothing written"}
    diff = unified(data.decode("utf-8"), new_data.decode("utf-8"), path)
    if check_only:
        return {**item, "status": "would_restore", "ok": True, "diff_text": diff,
                "msg": f"would restore: {how} (check mode: nothing written)"}
    try:
        atomic_write(path, new_data, like=path, point="rollback.target")
    except OSError as exc:
        return {**item, "status": "failed", "ok": False,
                "msg": os_error_message(exc, f"cannot restore {path}") + "; the file is unchanged"}
    remove_stale_bytecode(path)
    return {**item, "status": "restored", "ok": True, "changed": True, "sha256": sha256_bytes(new_data),
            "diff_text": diff, "msg": how}
