"""What check mode promises: the login user may write everything a real run writes (each file's
directory, the patch lock beside the venv's files, the state dir with its lock and backups). Stdlib
only."""

from __future__ import annotations

import os

from ..core.atomicio import UnsafeTarget, check_target
from ..core.nodeio import NodeError
from .sitelock import LOCK_NAME, site_root_of

FAILED = "failed"


def user_name() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return f"uid {os.geteuid()}"


def _nearest(path: str) -> str:
    """path, or its nearest existing ancestor (a run makes the rest)."""
    while path and not os.path.lexists(path):
        parent = os.path.dirname(path.rstrip("/"))
        if parent == path:
            break
        path = parent
    return path or "."


def unwritable(paths: list[str]) -> str | None:
    """The first of paths (directories, or files that exist) this user cannot write, or None."""
    for path in paths:
        probe = _nearest(path)
        mode = os.W_OK | (os.X_OK if os.path.isdir(probe) else 0)
        if not os.access(probe, mode):
            return probe
    return None


def check_access(req: dict, op: str, files: list) -> None:
    """Refuse (check mode) every file whose run would fail for want of write access, naming what and
    who."""
    state_dir = req.get("state_dir") or ""
    for f in files:
        if f.new is None or f.refusal or not f.path:
            continue
        paths = [os.path.dirname(f.path)]
        try:
            root = site_root_of(f.path)
        except NodeError:  # outside site-packages: the file's own load refuses it
            root = ""
        if root:
            paths += [root, os.path.join(root, LOCK_NAME)]
        if state_dir:
            paths += [state_dir, os.path.join(state_dir, "lock")]
            if op == "patch":
                paths.append(os.path.join(state_dir, "backups"))
        denied = unwritable(paths)
        if denied is not None:
            f.refuse(
                FAILED,
                f"cannot write {denied} as {user_name()}; set `become: sudo` for this host in the "
                "inventory (the agent then runs as root "
                "through sudo) or give that user write access "
                "(check mode: nothing written)",
            )
            continue
        try:
            check_target(f.path)
        except UnsafeTarget as exc:
            f.refuse(FAILED, f"{exc} (check mode: nothing written)")
        except OSError:  # a path that does not exist yet: the run's own load names it
            pass
