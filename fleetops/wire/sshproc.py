"""An `ssh` process as a session channel (session.Channel): its stdin, stdout, stderr and exit
status under the names a paramiko channel gives them (the pipes in PipeChannel, which a session
opened on a master's control socket shares: muxclient.py), so the agent session, become's
handshake and drain() read an OpenSSH transport's command exactly as they read paramiko's. Reads
never block (each pipe is read only when select says so); `fileno()` is one descriptor that is
readable when either output pipe is (an epoll set where there is one), so a reader waiting on it
wakes for stderr as well as stdout.

The process runs in its own session (start_new_session): a Ctrl-C at the terminal reaches fleetops,
which closes its connectors, and never half of the ssh children on its own. close() ends the process
and reaps it: none is left behind. And where the system can say so (Linux), it dies with its parent:
a client killed outright must not leave its ssh holding a session open through a master that lives
on, or the node's agent, which stops when its client goes away (its channel closes), would wait for
a client that is gone."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable

READ_CHUNK = 65536
END_GRACE = 2.0  # seconds an ssh child has to exit once told to, before it is killed


PR_SET_PDEATHSIG = 1
_LIFELINE: list[Callable[[], None] | None] = []


def lifeline() -> Callable[[], None] | None:
    """What a child runs before exec to get SIGTERM when the thread that started it ends (Linux's
    PR_SET_PDEATHSIG; run in the child, it is one C call resolved beforehand). None elsewhere."""
    if not _LIFELINE:
        found: Callable[[], None] | None = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                prctl = ctypes.CDLL(None, use_errno=True).prctl

                def found() -> None:
                    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            except (OSError, AttributeError):
                found = None
        _LIFELINE.append(found)
    return _LIFELINE[0]


def start(argv: list[str], **kwargs: object) -> subprocess.Popen:
    """argv started in its own session, tied to this process's life where the system allows."""
    return subprocess.Popen(
        argv,
        start_new_session=True,
        close_fds=True,
        preexec_fn=lifeline(),  # type: ignore[call-overload]
        **kwargs,
    )


class PipeChannel:
    """A remote command's stdin, stdout and stderr as pipes of this process, under
    paramiko.Channel's reading and writing names; what holds the other ends (an `ssh` process, or a
    master that got them over its control socket) says how the command ends (exit_status_ready,
    recv_exit_status, close). stderr_fd None: the command's stderr goes elsewhere, and reads as
    ended."""

    def __init__(self, stdin_fd: int, stdout_fd: int, stderr_fd: int | None) -> None:
        self._in: int | None = stdin_fd
        self._fds = {"out": stdout_fd}
        if stderr_fd is not None:
            self._fds["err"] = stderr_fd
        self._buf = {"out": bytearray(), "err": bytearray()}
        self._eof = {"out": False, "err": stderr_fd is None}
        self.closed = False
        self._poll = select.epoll() if hasattr(select, "epoll") else None
        for fd in self._fds.values():
            self._watch(fd)

    # -- paramiko.Channel's names
    @property
    def eof_received(self) -> bool:
        return self._eof["out"]

    def fileno(self) -> int:
        if self._poll is not None:
            return self._poll.fileno()
        return (
            self._fds["out"] if not self._eof["out"] or "err" not in self._fds else self._fds["err"]
        )

    def get_transport(self) -> PipeChannel:
        return self  # the link is what holds the other ends: seen ending via exit_status_ready()

    def is_active(self) -> bool:
        return not self.closed

    def recv_ready(self) -> bool:
        return self._ready("out")

    def recv_stderr_ready(self) -> bool:
        return self._ready("err")

    def recv(self, nbytes: int) -> bytes:
        return self._take("out", nbytes)

    def recv_stderr(self, nbytes: int) -> bytes:
        return self._take("err", nbytes)

    def sendall(self, data: bytes) -> None:
        if self._in is None:
            raise OSError("stdin is closed")
        view = memoryview(data)
        while view:
            written = os.write(self._in, view)
            view = view[written:]

    def shutdown_write(self) -> None:
        fd, self._in = self._in, None
        if fd is not None:
            self._close_stdin(fd)

    def exit_status_ready(self) -> bool:
        raise NotImplementedError

    def recv_exit_status(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # -- the pipes
    def _close_stdin(self, fd: int) -> None:
        with contextlib.suppress(OSError):
            os.close(fd)

    def _close_outputs(self) -> None:
        if self._poll is not None:
            self._poll.close()
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)

    def _watch(self, fd: int) -> None:
        if self._poll is not None:
            self._poll.register(fd, select.EPOLLIN | select.EPOLLHUP)

    def _unwatch(self, fd: int) -> None:
        if self._poll is not None:
            with contextlib.suppress(OSError, ValueError):
                self._poll.unregister(fd)  # an ended pipe would keep the set readable for ever

    def _ready(self, which: str) -> bool:
        if not self._buf[which] and not self._eof[which]:
            self._fill(which, 0)
        return bool(self._buf[which])

    def _take(self, which: str, nbytes: int) -> bytes:
        if not self._buf[which] and not self._eof[which]:
            self._fill(which, None)  # paramiko's recv() waits for data too
        buf = self._buf[which]
        chunk = bytes(buf[:nbytes])
        del buf[:nbytes]
        return chunk

    def _fill(self, which: str, timeout: float | None) -> None:
        fd = self._fds[which]
        if self.closed:
            return
        readable, _, _ = select.select([fd], [], [], timeout)
        if not readable:
            return
        try:
            chunk = os.read(fd, READ_CHUNK)
        except OSError:
            chunk = b""
        if chunk:
            self._buf[which] += chunk
            return
        self._eof[which] = True
        self._unwatch(fd)

    def _discard_output(self, timeout: float) -> None:
        """While waiting for the other end to go: read what it still writes (a full pipe would
        block it)."""
        fds = [fd for which, fd in self._fds.items() if not self._eof[which]]
        if not fds:
            time.sleep(timeout)
            return
        readable, _, _ = select.select(fds, [], [], timeout)
        for which, fd in self._fds.items():
            if fd in readable:
                try:
                    chunk = os.read(fd, READ_CHUNK)
                except OSError:
                    chunk = b""
                if not chunk:
                    self._eof[which] = True


class ProcessChannel(PipeChannel):
    """argv (a list: no local shell) run with pipes; paramiko.Channel's reading and writing
    names."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.proc = start(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        assert (
            self.proc.stdin is not None
            and self.proc.stdout is not None
            and self.proc.stderr is not None
        )
        super().__init__(
            self.proc.stdin.fileno(), self.proc.stdout.fileno(), self.proc.stderr.fileno()
        )
        # The process's end wakes a reader too: it may close its pipes a while before it exits,
        # and a reader waiting on the then empty set would sleep out its whole poll
        self._pidfd: int | None = None
        if self._poll is not None and hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                self._pidfd = os.pidfd_open(self.proc.pid)
                self._watch(self._pidfd)

    def exit_status_ready(self) -> bool:
        if self.proc.poll() is None:
            return False
        self._forget_pidfd()  # readable for ever once the process has ended
        return True

    def _forget_pidfd(self) -> None:
        fd, self._pidfd = self._pidfd, None
        if fd is not None:
            self._unwatch(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def recv_exit_status(self) -> int:
        """The process's exit status (waiting for it); -1 when it was ended by a signal (paramiko's
        "none")."""
        code = self.proc.wait()
        return code if code >= 0 else -1

    def _close_stdin(self, fd: int) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def close(self) -> None:
        """Close stdin (the node's command sees EOF) and end ssh at once, as paramiko closes a
        channel without waiting for the node's answer: a session on a master is closed by the
        master, which the node's side sees as its channel closing; ssh gets END_GRACE to go, then is
        killed; reaped either way."""
        if self.closed:
            return
        self.closed = True
        self.shutdown_write()
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.terminate()
        deadline = time.monotonic() + END_GRACE
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._discard_output(0.01)
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=END_GRACE)
        self._forget_pidfd()
        if self._poll is not None:
            self._poll.close()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
