"""/proc on the node, read one way (stdlib only). The lab's nvidia-smi stand-in (fleetops/lab/nvidia_smi.py)
keeps its own copy: it runs as a lone script on the node, outside this package."""

from __future__ import annotations

import os


def stat_fields(pid: int | str) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (which may itself hold spaces and ')'):
    [state, ppid, pgrp, session, ...], so field N of proc(5) is index N - 3. None: gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """The pid exists (a zombie counts: it still holds its pid). Another user's process counts too."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
