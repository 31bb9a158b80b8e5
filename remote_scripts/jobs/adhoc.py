"""The `run` op: the operator's own shell command on the node (fab -H lab01 -- uname -a, fab run
"...").

The command is the operator's text, passed unchanged to /bin/sh -c; fleetops never builds it from
data. It arrives inside the JSON request on stdin, so it never travels on an SSH command line.

The agent runs as whoever logs in (often root on a GPU node), beside the jobs it must not starve: it
keeps only the first and the last KEEP_BYTES of each stream and counts the bytes in between, so `run
"yes"` costs the same memory as `run true`."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections import deque

from ..core.registry import node_op

# of each stream, both its head and its tail come back; what lies between is counted
KEEP_BYTES = 1024 * 1024
READ_BYTES = 64 * 1024


class _Kept:
    """One stream's head (the first KEEP_BYTES), its tail (at least the last KEEP_BYTES, as read)
    and its size."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_bytes = 0
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = KEEP_BYTES - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail.append(chunk)
            self.tail_bytes += len(chunk)
            while self.tail_bytes - len(self.tail[0]) >= KEEP_BYTES:
                self.tail_bytes -= len(self.tail.popleft())

    def texts(self) -> tuple[str, str, int]:
        """(head, tail, bytes dropped between them); the tail is empty when nothing was dropped. The
        cut never splits a UTF-8 character: its pieces count as dropped."""
        tail = b"".join(self.tail)
        if self.total <= 2 * KEEP_BYTES:
            return _text(bytes(self.head) + tail), "", 0
        head = _whole_head(bytes(self.head))
        tail = _whole_tail(tail[len(tail) - KEEP_BYTES :])
        return _text(head), _text(tail), self.total - len(head) - len(tail)


def _whole_head(data: bytes) -> bytes:
    """data without a UTF-8 character cut short at its end."""
    for back in range(1, min(4, len(data) + 1)):
        byte = data[-back]
        if byte < 0x80:
            return data
        if byte >= 0xC0:  # the lead byte of the last character: is the character whole?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data


def _whole_tail(data: bytes) -> bytes:
    """data without the continuation bytes of a character whose start was dropped."""
    skip = 0
    while skip < min(3, len(data)) and 0x80 <= data[skip] < 0xC0:
        skip += 1
    return data[skip:]


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _collect(proc: subprocess.Popen, deadline: float) -> tuple[_Kept, _Kept, bool]:
    """Read both pipes to their end (or the deadline), keeping head and tail of each; (stdout,
    stderr, timed out)."""
    assert proc.stdout is not None and proc.stderr is not None  # started with both pipes
    out, err = _Kept(), _Kept()
    kept = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    with selectors.DefaultSelector() as sel:
        for fd in kept:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return out, err, True
            for key, _ in sel.select(min(remaining, 1.0)):
                chunk = os.read(key.fd, READ_BYTES)
                if chunk:
                    kept[key.fd].add(chunk)
                else:
                    sel.unregister(key.fileobj)
    return out, err, False


@node_op("run", writes=True)
def run(req: dict) -> dict:
    command = req.get("command")
    if not isinstance(command, str) or not command.strip():
        return {"ok": False, "error": "run: no command given", "error_kind": "usage"}
    timeout = float(req.get("timeout") or 300)
    started = time.monotonic()
    # Its own session: a timeout or an interrupted agent kills the whole tree the command started.
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err, timed_out = _collect(proc, started + timeout)
        if timed_out:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            # both pipes closed: the shell is ending, or daemonised
            left = started + timeout - time.monotonic()
            try:
                proc.wait(max(left, 0.0))
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except BaseException:
        # Ctrl-C on the client: nothing of the command outlives us
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    stdout, stdout_tail, out_dropped = out.texts()
    stderr, stderr_tail, err_dropped = err.texts()
    return {
        "ok": not timed_out and proc.returncode == 0,
        "exit_code": proc.returncode,
        "timed_out": timed_out,
        "timeout": timeout,
        "stdout": stdout,
        "stdout_tail": stdout_tail,
        "stdout_dropped_bytes": out_dropped,
        "stderr": stderr,
        "stderr_tail": stderr_tail,
        "stderr_dropped_bytes": err_dropped,
        "run_seconds": round(time.monotonic() - started, 3),
    }
