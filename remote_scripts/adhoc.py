"""The `run` op: the operator's own shell command on the node (fab -H lab01 -- uname -a, fab run "...").

The command is the operator's text, passed unchanged to /bin/sh -c; fleetops never builds it from data.
It arrives inside the JSON request on stdin, so it never travels on an SSH command line."""

from __future__ import annotations

import os
import signal
import subprocess
import time

TAIL_BYTES = 64 * 1024  # what comes back of each stream; the rest is counted, not sent


def _tail(data: bytes) -> tuple[str, int]:
    dropped = max(0, len(data) - TAIL_BYTES)
    return data[dropped:].decode("utf-8", "replace"), dropped


def run(req: dict) -> dict:
    command = req.get("command")
    if not isinstance(command, str) or not command.strip():
        return {"ok": False, "error": "run: no command given", "error_kind": "usage"}
    timeout = float(req.get("timeout") or 300)
    started = time.monotonic()
    # Its own session: a timeout or an interrupted agent kills the whole tree the command started.
    proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)  # Ctrl-C on the client: nothing of the command outlives us
        proc.wait()
        raise
    stdout, out_dropped = _tail(out)
    stderr, err_dropped = _tail(err)
    return {"ok": not timed_out and proc.returncode == 0, "exit_code": proc.returncode, "timed_out": timed_out,
            "timeout": timeout, "stdout": stdout, "stderr": stderr, "stdout_dropped_bytes": out_dropped,
            "stderr_dropped_bytes": err_dropped, "run_seconds": round(time.monotonic() - started, 3)}
