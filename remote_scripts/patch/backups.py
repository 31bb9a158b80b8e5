"""The witness a patch leaves in the node's state dir: the original bytes and a record of what was
written, and whether a saved original may still be trusted. Stdlib only."""

from __future__ import annotations

import os

from ..core.atomicio import atomic_write, ensure_dir, write_json_atomic
from ..core.failpoints import failpoint
from ..core.nodeio import NodeError, now_iso, sha256_bytes
from ..core.statetrust import read_json


def backup_paths(state_dir: str, path: str) -> tuple[str, str]:
    key = sha256_bytes(path.encode())[:16] + "-" + os.path.basename(path)
    base = os.path.join(state_dir, "backups")
    return os.path.join(base, key + ".json"), os.path.join(base, key + ".orig")


def save_backup(
    state_dir: str, path: str, module: str, original: bytes, patched: bytes, playbook: str
) -> dict:
    record_path, orig_path = backup_paths(state_dir, path)
    ensure_dir(os.path.dirname(record_path))
    original_sha = sha256_bytes(original)
    record = read_json(record_path, on_corrupt="quarantine")
    if not (record and record.get("original_sha256") == original_sha and os.path.exists(orig_path)):
        atomic_write(orig_path, original, mode=0o600, point="patch.backup")
        record = {
            "path": path,
            "module": module,
            "original_sha256": original_sha,
            "created": now_iso(),
        }
    record.update(
        {"patched_sha256": sha256_bytes(patched), "playbook": playbook, "patched_at": now_iso()}
    )
    write_json_atomic(record_path, record, point="patch.record")
    failpoint("patch.after_backup")
    return record


def read_record(state_dir: str | None, path: str) -> dict | None:
    """This node's backup record of `path`; a corrupt one is moved aside (reported) and counts as
    none."""
    if not state_dir:
        return None
    try:
        return read_json(backup_paths(state_dir, path)[0], on_corrupt="quarantine")
    except (NodeError, OSError):
        return None


def read_backup(orig_path: str, record: dict | None) -> tuple[bytes, str, dict] | None:
    if not record or not orig_path:
        return None
    try:
        fd = os.open(orig_path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data, sha256_bytes(data), record


def bad_backup(
    backup: tuple[bytes, str, dict] | None,
    orig_path: str,
    proof: str | None,
    wheel_record: str | None,
) -> str:
    """Why the saved backup must not be trusted (its own record, or the proven original,
    disagrees)."""
    if backup is None:
        return ""
    data, sha, record = backup
    if sha != record.get("original_sha256"):
        return (
            f"backup {orig_path} does not match its recorded sha256 (record "
            f"{str(record.get('original_sha256'))[:12]}, file {sha[:12]})"
        )
    if proof and sha != proof:
        source = f"the wheel's RECORD ({wheel_record})" if wheel_record else "the hunks reversed"
        return (
            f"backup {orig_path} (sha256 {sha[:12]}) is not the original: {source} says "
            f"{proof[:12]}; tampered or stale"
        )
    return ""
