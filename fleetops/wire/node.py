"""NodeConnection: one node, one paramiko SSH connection per run, many agent calls
(wire.connector.Connector; the agent's side is agentclient.AgentClient)."""

from __future__ import annotations

import errno
import shlex
import socket
import time

import paramiko
from fabric import Connection

from .. import compat
from ..plans.inventory import Host, Inventory
from ..results import Evidence
from .agentclient import AgentClient
from .bundle import agent_bundle, launch_words
from .connector import (
    COUNTERS,
    ExecResult,
    TransportError,
    step_ended_unsaid,
    step_lost,
    step_overflow,
    step_timeout,
    upload_refused,
)
from .errors import connect_error
from .hops import close_quietly, fabric_connection, slow_idle_checks
from .pythonpath import check_interpreter
from .session import Overflow, drain, session_refused
from .sftp import (
    ReadPathSeen,
    check_read_path,
    copy_range,
    denied_hint,
    sftp_failed,
    write_atomically,
)


class NodeConnection(AgentClient):
    """One node, one SSH connection, many agent calls."""

    LINK_ERRORS = (OSError, EOFError, paramiko.SSHException)

    def __init__(self, host: Host, inventory: Inventory | None = None) -> None:
        super().__init__(host, inventory)
        self.cxn: Connection | None = None
        # The connection being opened, and its sockets, so that close() from another thread (Ctrl-C)
        # ends a connect or a handshake in progress at once instead of after connect_timeout.
        self._opening: Connection | None = None
        self._sockets: list[socket.socket] = []
        self._aborted = False
        # become: the connection `python:` was checked on
        self._python_checked: Connection | None = None
        # become: the login user's uid and the directories of fetched paths (sftp.check_read_path)
        self._read_paths = ReadPathSeen()

    # -- connecting
    def open(self) -> None:
        if self.cxn is not None and self.cxn.is_connected:
            return
        host = self.host
        cxn = fabric_connection(host, self.inventory)
        self._aborted = False
        self._opening = cxn
        try:
            if not cxn.gateway and "sock" not in cxn.connect_kwargs:
                cxn.connect_kwargs["sock"] = self._tcp_connect(cxn)
            cxn.open()
        except Exception as exc:  # connect_error names host, cause, next step for every failure
            error = (
                TransportError(
                    "interrupted",
                    f"{host.name}: connecting was stopped (the run was interrupted) "
                    "before the SSH login finished; nothing ran there",
                )
                if self._aborted
                else connect_error(exc, host, cxn)
            )
            close_quietly(cxn)
            raise error from None
        finally:
            self._opening = None
            self._sockets = []
        self.cxn = cxn
        slow_idle_checks(cxn)
        COUNTERS.bump(host.name, "connections")

    def _tcp_connect(self, cxn: Connection) -> socket.socket:
        """The TCP connection paramiko's SSHClient.connect would make (every address of the name in
        turn, the same errors), on sockets close() can reach while it waits."""
        timeout = cxn.connect_timeout
        infos = socket.getaddrinfo(cxn.host, cxn.port, socket.AF_UNSPEC, socket.SOCK_STREAM)
        to_try = [(i[0], i[4]) for i in infos if i[1] == socket.SOCK_STREAM] or [
            (i[0], i[4]) for i in infos
        ]
        errors: dict = {}
        for family, addr in to_try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            self._sockets.append(sock)
            if self._aborted:
                raise ConnectionAbortedError(errno.ECONNABORTED, "interrupted")
            try:
                sock.settimeout(timeout)
                sock.connect(addr)
                return sock
            except OSError as exc:
                sock.close()
                if exc.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH):
                    raise
                errors[addr] = exc
        raise paramiko.ssh_exception.NoValidConnectionsError(errors)

    @staticmethod
    def prepare() -> None:
        """Build (or read from its cache) the agent bundle and the bootstrap's launch words every
        connection's first request needs."""
        agent_bundle()
        launch_words()

    def close(self) -> None:
        """End the agent (its stdin closes: it exits) and the connection, or stop a connect in
        progress. Safe from another thread (Ctrl-C)."""
        opening = self._opening
        if opening is not None:
            self._aborted = True
            for sock in list(self._sockets):
                try:
                    # a connect() waiting for its SYN-ACK ends at once
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            # a handshake waiting for the banner, on this hop or a jump host's
            close_quietly(opening)
        session, self.session = self.session, None
        self.held = []  # never sent: nothing to undo
        if session is not None:
            try:
                session.chan.shutdown_write()
            except (OSError, EOFError, paramiko.SSHException):
                pass
            self._end_session(session)
        if self.cxn is not None:
            close_quietly(self.cxn)
            self.cxn = None
            COUNTERS.event(self.host.name, "closed")

    # -- raw exec
    def exec(
        self, argv: list[str], stdin: bytes = b"", timeout: float = 300, shown: str | None = None
    ) -> ExecResult:
        """Run argv (quoted word by word: no value ever becomes shell syntax) with stdin, collect
        all. `shown`: how the evidence names the command (the agent's bootstrap is long; its text is
        bundle.BOOTSTRAP)."""
        self.open()
        assert self.cxn is not None
        command = shlex.join(argv)
        started = time.monotonic()
        COUNTERS.bump(self.host.name, "execs")
        try:
            chan = self.cxn.transport.open_session(timeout=self.host.connect_timeout)
            chan.exec_command(command)
            command = shown or command
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err, code = drain(chan, started + timeout)
        except paramiko.ChannelException as exc:
            self.close()
            raise session_refused(self.host, exc, shown or command) from None
        except Overflow as exc:
            raise step_overflow(self.host.name, exc, command, started) from None
        except TimeoutError:
            raise step_timeout(self.host.name, timeout, command, started) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.close()
            raise step_lost(self.host.name, exc, command, started) from None
        result = ExecResult(command, code, out, err, time.monotonic() - started)
        if code is None:
            self.close()
            raise step_ended_unsaid(self.host.name, result)
        return result

    # -- the agent
    def upload(self, path: str, data: bytes) -> None:
        """Write path atomically over SFTP (temp name, then rename), making its missing
        folders 0700."""
        self.open()
        try:
            assert self.cxn is not None
            write_atomically(self._sftp(), path, data)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise upload_refused(self.host, path, exc) from None

    def _sftp(self) -> paramiko.SFTPClient:
        """The connection's SFTP session; a subsystem that does not start is named as such."""
        assert self.cxn is not None
        try:
            return self.cxn.sftp()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise TransportError("remote", sftp_failed(self.host, exc)) from None

    def download(self, path: str) -> bytes:
        self.open()
        assert self.cxn is not None
        with self._sftp().open(path, "rb") as f:
            return f.read()

    def download_to(
        self, remote: str, local_path: str, offset: int, end: int, progress: object = None
    ) -> int:
        """Bytes [offset, end) of remote, over SFTP, into local_path at offset (truncated there
        first, so a partial copy resumes). progress(n) is called with the bytes written so far.
        Returns them."""
        self.open()
        assert self.cxn is not None
        if self.host.become:
            check_read_path(self._sftp(), self.host, remote, self._read_paths)
        return copy_range(
            self._sftp,
            remote,
            local_path,
            offset,
            end,
            progress,
            self.host.name,
            lambda: self.cxn is not None and self.cxn.is_connected,
            denied_hint(self.host),
            read_ahead=compat.quiet_prefetch_thread(),
        )

    def _open_channel(self, argv: list[str], shown: str) -> paramiko.Channel:
        self.open()
        assert self.cxn is not None
        if self.host.become:
            self._check_python_before_sudo(shown)
        COUNTERS.bump(self.host.name, "execs")
        try:
            chan = self.cxn.transport.open_session(timeout=self.host.connect_timeout)
            chan.exec_command(shlex.join(argv))
        except paramiko.ChannelException as exc:
            self.close()
            raise session_refused(self.host, exc, shown) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.close()
            raise TransportError(
                "lost",
                f"connection to {self.host.name} lost while starting the agent ({exc or 'EOF'})",
                Evidence(shown, None, [], 0.0),
            ) from None
        return chan

    def _check_python_before_sudo(self, shown: str) -> None:
        """become: sudo would run `python:` as root before any check on the node could; the login
        user checks the path first, over SFTP (wire/pythonpath.py)."""
        cxn = self.cxn
        assert cxn is not None
        # once per connection: only root and the login user could change it since
        if self._python_checked is cxn:
            return
        check_interpreter(cxn.sftp, self.host, shown)
        self._python_checked = cxn
