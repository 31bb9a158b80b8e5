"""/proc on the node, read one way (stdlib only). The lab's nvidia-smi stand-in
(fleetops/lab/nvidia_smi.py) keeps its own copy: it runs as a lone script on the node, outside this
package."""

from __future__ import annotations

import os


def pids() -> list[int]:
    """The pids /proc lists now; each may be gone by the time it is read."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def read(pid: int | str, name: str) -> bytes | None:
    """/proc/PID/NAME as bytes (cmdline, environ, comm: NUL-separated or not text at all). None:
    gone or unreadable."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return None


def uptime() -> float:
    """Seconds since boot (/proc/uptime): the clock that /proc/PID/stat's start times count on.
    OSError when /proc is not readable."""
    with open("/proc/uptime", encoding="utf-8") as f:
        return float(f.read().split()[0])


def stat_fields(pid: int | str) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (which may itself hold spaces and ')'):
    [state, ppid, pgrp, session, ...], so field N of proc(5) is index N - 3. None: gone or
    unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """The pid exists (a zombie counts: it still holds its pid). Another user's process counts
    too."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_ticks(pid: int | str) -> int | None:
    """When the process started (clock ticks since boot, proc(5) field 22): with the pid, its
    identity; a pid reused by a later process has another. None: gone or unreadable."""
    fields = stat_fields(pid)
    try:
        return int(fields[19]) if fields is not None else None
    except (IndexError, ValueError):
        return None


def uids(pid: int | str) -> tuple[int, int] | None:
    """The process's real and effective uid (/proc/PID/status). None: gone or unreadable."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("Uid:"):
                    real, effective = line.split()[1:3]
                    return int(real), int(effective)
    except (OSError, ValueError):
        return None
    return None
