"""The kernel log as this user may read it: dmesg, else `journalctl -k`, no shell. Only the lines
worth sending (NVIDIA's driver, Xid, the OOM killer) come back; the client parses them
(fleetops/plans/kernellog.py). Read by `diagnose` and by a job's `status` when the job died by
SIGKILL or was lost (was it the OOM killer?)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time

from .procfs import uptime

KERNEL_TIMEOUT_S = 20
KERNEL_KEEP_LINES = 400  # the newest relevant lines sent back
# Lines of the kernel log worth sending: NVIDIA's driver (Xid), the OOM killer, cgroup OOMs.
KERNEL_RELEVANT = re.compile(
    r"NVRM|Xid|nvidia|oom[-_ ]kill|invoked oom-killer|Out of memory|Killed process|"
    r"Memory cgroup out of memory|oom_reaper",
    re.I,
)
# The readers tried in order (no shell; the first readable one wins).
KERNEL_READERS = (
    ["dmesg"],
    ["journalctl", "-k", "-b", "--no-pager", "-o", "short-iso", "-n", "50000"],
)
_UNREADABLE = re.compile(
    r"Operation not permitted|Permission denied|not seeing messages from other users|"
    r"No journal files were found|read kernel buffer failed",
    re.I,
)


def kernel_log() -> dict:
    """{source, path, total_lines, lines (the relevant ones), dropped, first, tried, boot_time}, or
    {error, ...} naming every reader tried and why it could not be read."""
    tried = []
    for argv in KERNEL_READERS:
        exe = shutil.which(argv[0])
        if exe is None:
            tried.append(f"{argv[0]}: not installed")
            continue
        try:
            proc = subprocess.run(
                [exe, *argv[1:]],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=KERNEL_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            tried.append(f"{' '.join(argv)}: timed out after {KERNEL_TIMEOUT_S}s")
            continue
        err = proc.stderr.strip()
        if proc.returncode != 0 or _UNREADABLE.search(err):
            tried.append(
                f"{' '.join(argv)}: exit {proc.returncode}: "
                f"{err.splitlines()[0] if err else 'no output'}"
            )
            continue
        lines = proc.stdout.splitlines()
        relevant = [ln for ln in lines if KERNEL_RELEVANT.search(ln)]
        return {
            "source": " ".join(argv),
            "path": exe,
            "total_lines": len(lines),
            "lines": relevant[-KERNEL_KEEP_LINES:],
            "dropped": max(0, len(relevant) - KERNEL_KEEP_LINES),
            "first": lines[0][:200] if lines else None,
            "tried": tried,
            "boot_time": time.time() - uptime(),
        }
    return {
        "error": "the kernel log is not readable here: " + "; ".join(tried),
        "error_kind": "kernel_log_unreadable",
        "tried": tried,
    }
