"""A node taken out of service (`fab drain`): <state_dir>/drain.json says who drained it, when and
why. While it is there the node launches no job (jobs/start.py, the Slurm submit) and takes no patch
(health/guard.py); `fab undrain` removes it. facts, status and diagnose show it. Stdlib only.

A marker that cannot be read (not JSON, planted by another user) still counts as drained: what it
guards against must not start because the file that says "stop" is damaged."""

from __future__ import annotations

import os

from .atomicio import write_json_atomic
from .nodeio import NodeError, now_iso
from .statetrust import read_json

DRAIN = "drain.json"


def path_of(state_dir: str) -> str:
    return os.path.join(state_dir, DRAIN)


def read(state_dir: str) -> dict | None:
    """The marker ({by, at, reason, host, ...}), None when the node is not drained."""
    path = path_of(state_dir)
    try:
        marker = read_json(path)
    except NodeError as exc:
        return {
            "by": "?",
            "at": "?",
            "reason": f"the drain marker cannot be read ({exc})",
            "path": path,
        }
    if marker is None:
        return None
    return {**marker, "path": path}


def describe(marker: dict) -> str:
    return (
        f"drained by {marker.get('by', '?')} at {marker.get('at', '?')}: "
        f"{marker.get('reason') or 'no reason given'}"
    )


def mark(state_dir: str, operator: str, reason: str, host: str) -> dict:
    """Drain the node: the marker written atomically (a second drain replaces the first, keeping its
    time)."""
    old = read(state_dir)
    marker: dict[str, object] = {"by": operator, "at": now_iso(), "reason": reason, "host": host}
    if old and old.get("at") not in (None, "?"):
        marker.update(
            first_at=old.get("first_at") or old["at"], first_by=old.get("first_by") or old.get("by")
        )
    write_json_atomic(path_of(state_dir), marker, point="drain.write")
    return {**marker, "path": path_of(state_dir)}


def clear(state_dir: str) -> dict | None:
    """Undrain: the marker removed; the one removed, or None when the node was not drained."""
    old = read(state_dir)
    try:
        os.unlink(path_of(state_dir))
    except FileNotFoundError:
        return None
    return old


def refuse_if_drained(state_dir: str, doing: str) -> None:
    """NodeError (kind `drained`) naming who drained the node and why, when it is drained."""
    marker = read(state_dir)
    if marker is not None:
        raise NodeError(
            f"this node is {describe(marker)}; {doing} refused until it is undrained",
            kind="drained",
            drain=marker,
        )
