"""The agent session on one channel: requests (tickets) answered in order, one JSON line each, with
memory bounded by wire.connector's caps; and the plain exec helpers (send without waiting, drain to
a deadline). A channel is anything shaped like `Channel`: a paramiko channel, or an `ssh` process's
pipes (sshproc.py)."""

from __future__ import annotations

import select
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from ..plans.inventory import Host
from ..results import Evidence
from .connector import (
    MAX_ANSWER_BYTES,
    MAX_EXEC_BYTES,
    MAX_STDERR_BYTES,
    STDERR_KEPT_BYTES,
    ExecResult,
    TransportError,
    mib,
)

if TYPE_CHECKING:
    import paramiko


class Channel(Protocol):
    """What a session reads and writes: paramiko.Channel's names for a command's stdin, stdout,
    stderr and exit status. `fileno()` is readable when any of them may have news;
    get_transport().is_active() says whether the link under it is still up."""

    @property
    def closed(self) -> bool: ...
    @property
    def eof_received(self) -> bool | int: ...
    def recv_ready(self) -> bool: ...
    def recv(self, nbytes: int, /) -> bytes: ...
    def recv_stderr_ready(self) -> bool: ...
    def recv_stderr(self, nbytes: int, /) -> bytes: ...
    def exit_status_ready(self) -> bool: ...
    def recv_exit_status(self) -> int: ...
    def sendall(self, data: bytes, /) -> None: ...
    def shutdown_write(self) -> None: ...
    def close(self) -> None: ...
    def fileno(self) -> int: ...
    def get_transport(self) -> Any: ...


class _Owner(Protocol):
    """The connection a ticket belongs to (wire.ssh.NodeConnection)."""

    def _collect(self, ticket: Ticket) -> tuple[dict, Evidence]: ...

    def _discard(self, ticket: Ticket) -> None: ...


class Ticket:
    """One request of the agent session (wire.connector.Pending): sent at once, or held to go out
    right behind the next request sent; answered in request order, its answer (or error) kept here
    until asked for."""

    def __init__(
        self, conn: _Owner, op: str, request: dict, timeout: float, ahead: bool = False
    ) -> None:
        self.conn, self.op, self.request, self.timeout = conn, op, request, timeout
        # handed over before the step it follows has its answer (Connector.submit)
        self.ahead = ahead
        self.id: int | None = None
        self.session: AgentSession | None = None
        self.sent = 0.0
        self.done = False
        self.answer: dict | None = None
        self.evidence: Evidence | None = None
        self.error: TransportError | None = None
        self.stale = False  # a request of the step before it went out after it
        self.dropped = False  # discarded: nobody reads its answer

    def result(self) -> tuple[dict, Evidence]:
        return self.conn._collect(self)  # the ticket is the connection's own

    def discard(self) -> None:
        self.conn._discard(self)


class Overflow(Exception):
    """The node sent more than a session may hold (wire.connector's caps)."""


class AgentSession:
    """The agent's channel: answers are lines on stdout, in request order (`queue`: the requests
    sent and not yet answered, oldest first); stderr is kept per answer (its last
    STDERR_KEPT_BYTES). Memory is bounded: an answer line over MAX_ANSWER_BYTES or more than
    MAX_STDERR_BYTES of stderr for one request raise Overflow, and each byte of stdout is searched
    for the newline once (`scanned`), however it arrives."""

    def __init__(self, chan: Channel, shown: str) -> None:
        self.chan = chan
        self.shown = shown
        self.out = bytearray()
        self.scanned = 0  # self.out[:scanned] holds no newline
        self.err = bytearray()
        self.err_bytes = 0  # stderr since the last answer, all of it (self.err keeps only the end)
        self.answered = 0
        self.code: int | None = None  # the agent's exit status once it ended
        self.queue: deque[Ticket] = deque()
        self.retried = False  # started again after uploading the agent
        # started with no request, before the program's start-up (wire/warmstart.py)
        self.started_early = False

    def alive(self) -> bool:
        return not self.chan.closed and not self.chan.exit_status_ready()

    def evidence(self, code: int | None, started: float) -> Evidence:
        return ExecResult(
            self.shown, code, b"", bytes(self.err), time.monotonic() - started
        ).evidence()

    def answered_one(self) -> None:
        """What the agent wrote while serving a request is that request's evidence alone."""
        self.err.clear()
        self.err_bytes = 0

    def _read_stderr(self) -> None:
        chan = self.chan
        while chan.recv_stderr_ready():
            chunk = chan.recv_stderr(65536)
            self.err_bytes += len(chunk)
            self.err += chunk
            if len(self.err) > 2 * STDERR_KEPT_BYTES:
                del self.err[:-STDERR_KEPT_BYTES]
            if self.err_bytes > MAX_STDERR_BYTES:
                raise Overflow(
                    "the node agent wrote more than "
                    f"{mib(MAX_STDERR_BYTES)} to stderr while serving "
                    "one request"
                )

    def _line(self) -> bytes | None:
        newline = self.out.find(b"\n", self.scanned)
        if newline < 0:
            self.scanned = len(self.out)
            if self.scanned > MAX_ANSWER_BYTES:
                raise Overflow(
                    "the node agent sent more than "
                    f"{mib(MAX_ANSWER_BYTES)} without ending its answer "
                    "line"
                )
            return None
        line = bytes(self.out[:newline])
        del self.out[: newline + 1]
        self.scanned = 0
        return line

    def read_line(self, deadline: float) -> bytes | None:
        """The next answer line, or None when the agent ended first (self.code: its exit status or
        None). Raises Overflow when the node sends more than the caps allow."""
        chan = self.chan
        while True:
            self._read_stderr()
            line = self._line()
            if line is not None:
                self._read_stderr()  # what the agent wrote before it answered
                return line
            if chan.recv_ready():
                self.out += chan.recv(65536)
                continue
            if chan.exit_status_ready() or chan.closed or chan.eof_received:
                if not _quiet(chan):
                    continue
                return self._last_line()
            _wait_for(chan, deadline)

    def _last_line(self) -> bytes | None:
        """The agent ended: its exit status kept, and a last line without its newline returned
        when it exited with a status."""
        chan = self.chan
        if chan.exit_status_ready() or not chan.closed:
            # after EOF the status follows at once (or -1 on close)
            code = chan.recv_exit_status()
            self.code = None if code == -1 else code
        if not self.out:
            return None
        line, self.out, self.scanned = bytes(self.out), bytearray(), 0
        return line if self.code is not None else None


def _quiet(chan: Channel) -> bool:
    """Nothing left to read on the channel, on stdout or on stderr."""
    return not chan.recv_ready() and not chan.recv_stderr_ready()


def _wait_for(chan: Channel, deadline: float) -> None:
    """Until the channel has something to read (at most a second); TimeoutError past the deadline,
    EOFError when the link under it has gone and nothing is left to read."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError
    select.select([chan], [], [], min(remaining, 1.0))
    transport = chan.get_transport()
    if (transport is None or not transport.is_active()) and _quiet(chan):
        raise EOFError("transport closed")


def session_refused(host: Host, exc: paramiko.ChannelException, shown: str) -> TransportError:
    # The login worked and sshd would not open a session (MaxSessions 0, a Match block, a restricted
    # key): nothing ran on the node, and no retry can change it.
    return TransportError(
        "refused",
        f"{host.name}: its sshd accepted the login but refused a session channel "
        f"({exc.text}, SSH code {exc.code}); nothing ran there. Check MaxSessions and "
        "any Match or ForceCommand for this user in the node's sshd_config",
        Evidence(shown, None, [], 0.0),
    )


def drain(chan: Channel, deadline: float) -> tuple[bytes, bytes, int | None]:
    out, err = bytearray(), bytearray()
    while True:
        while chan.recv_ready():
            out += chan.recv(65536)
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        if len(out) + len(err) > MAX_EXEC_BYTES:
            chan.close()
            raise Overflow(f"the command sent more than {mib(MAX_EXEC_BYTES)} of output")
        if (chan.exit_status_ready() or chan.closed) and _quiet(chan):
            break
        try:
            _wait_for(chan, deadline)
        except TimeoutError:
            chan.close()
            raise
    code = chan.recv_exit_status() if chan.exit_status_ready() else None
    if code == -1:
        code = None  # paramiko's way of saying the channel closed without an exit status
    chan.close()
    return bytes(out), bytes(err), code
