"""A session on a live ssh master, opened by this process itself through the master's control
socket (OpenSSH's multiplexing protocol, PROTOCOL.mux, version 4) instead of by an `ssh` mux client
process: no fork, no exec, no ssh_config read and no OpenSSL start per session, which cost ~5 ms of
CPU each.

The exchange is the one `ssh` makes as a mux client (mux.c): HELLO both ways, then
MUX_C_NEW_SESSION (no tty, no X11, no agent, escape char none, the command or subsystem name), then
the command's stdin, stdout and stderr as three descriptors, each sent on its own one-byte message
(SCM_RIGHTS: the master takes exactly one per message). The master answers MUX_S_SESSION_OPENED
once the node opened the channel, and later MUX_S_EXIT_MESSAGE with the exit status; it closes the
control socket when the session channel is gone, by which time everything the command wrote is in
our pipes. A socket that closes without an exit message: no exit status (SSH_FAILED, as ssh says).

Closing our ends and the control socket makes the master close the session channel, as when an `ssh`
mux client dies: the node's command sees its channel close. Anything unexpected before the session
is open (nothing listening, another protocol version, a refusal) is MuxUnavailable, and the caller
starts `ssh` as before; `ssh` itself does the same (it then logs in without the master)."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import stat
import struct
from dataclasses import dataclass
from typing import BinaryIO

from .sshproc import PipeChannel

MUX_MSG_HELLO = 0x00000001
MUX_C_NEW_SESSION = 0x10000002
MUX_S_OK = 0x80000001
MUX_S_PERMISSION_DENIED = 0x80000002
MUX_S_FAILURE = 0x80000003
MUX_S_EXIT_MESSAGE = 0x80000004
MUX_S_SESSION_OPENED = 0x80000006
MUX_S_TTY_ALLOC_FAIL = 0x80000008
VERSION = 4
NO_ESCAPE = 0xFFFFFFFF
MAX_PACKET = 256 * 1024  # mux.c's own bound on a control message
NO_STATUS = 255  # the status `ssh` exits with when the master closes without an exit message
# seconds for HELLO and the session's opening: past the master's own ServerAlive limit (15 s x 4),
# after which it would have given up on the node and closed the socket itself
OPEN_TIMEOUT = 75.0
CLOSE_CHECK = 0.5  # seconds between looks at `closed` while waiting for the exit status


class MuxUnavailable(Exception):
    """No session was opened through the master (nothing was started on the node for it): start
    `ssh` instead."""


# -- the messages
def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def string(data: bytes) -> bytes:
    return u32(len(data)) + data


def packet(body: bytes) -> bytes:
    return u32(len(body)) + body


def hello() -> bytes:
    return packet(u32(MUX_MSG_HELLO) + u32(VERSION))


def new_session(
    request_id: int, command: str, subsystem: bool = False, env: tuple[str, ...] = ()
) -> bytes:
    """MUX_C_NEW_SESSION as `ssh -T -x -a -e none` sends it: the command (for a subsystem, its
    name) and the environment strings SendEnv lets through (the master filters them again)."""
    body = (
        u32(MUX_C_NEW_SESSION)
        + u32(request_id)
        + string(b"")  # reserved
        + u32(0)  # tty
        + u32(0)  # X11
        + u32(0)  # agent
        + u32(1 if subsystem else 0)
        + u32(NO_ESCAPE)
        + string(b"")  # terminal type: no tty
        + string(command.encode())
    )
    for entry in env:
        body += string(entry.encode())
    return packet(body)


class Reader:
    """A message body read field by field; a short one is a protocol surprise."""

    def __init__(self, body: bytes) -> None:
        self.body, self.at = body, 0

    def u32(self) -> int:
        if self.at + 4 > len(self.body):
            raise MuxUnavailable("a control message ended early")
        (value,) = struct.unpack_from(">I", self.body, self.at)
        self.at += 4
        return int(value)

    def string(self) -> bytes:
        size = self.u32()
        if self.at + size > len(self.body):
            raise MuxUnavailable("a control message ended early")
        data = self.body[self.at : self.at + size]
        self.at += size
        return data

    def left(self) -> int:
        return len(self.body) - self.at


def check_hello(body: bytes) -> None:
    """The master's HELLO: version 4 (its extensions, none defined, skipped)."""
    reader = Reader(body)
    kind = reader.u32()
    if kind != MUX_MSG_HELLO:
        raise MuxUnavailable(f"the master sent message {kind:#x} for HELLO")
    version = reader.u32()
    if version != VERSION:
        raise MuxUnavailable(f"the master speaks multiplexing version {version}, not {VERSION}")
    while reader.left():
        reader.string()
        reader.string()


def session_id(body: bytes, request_id: int) -> int:
    """The master's answer to MUX_C_NEW_SESSION: the session's id, or MuxUnavailable with the
    master's words for a refusal."""
    reader = Reader(body)
    kind = reader.u32()
    answered = reader.u32()
    if answered != request_id:
        raise MuxUnavailable(f"the master answered request {answered}, not {request_id}")
    if kind == MUX_S_SESSION_OPENED:
        return reader.u32()
    if kind in (MUX_S_PERMISSION_DENIED, MUX_S_FAILURE):
        words = reader.string().decode("utf-8", "replace")
        raise MuxUnavailable(f"the master refused the session: {words}")
    raise MuxUnavailable(f"the master sent message {kind:#x} for the session")


@dataclass(frozen=True)
class Exit:
    """A message about an open session: its exit status (None: a tty note, which has none)."""

    session: int
    status: int | None


def session_message(body: bytes) -> Exit:
    reader = Reader(body)
    kind = reader.u32()
    if kind == MUX_S_EXIT_MESSAGE:
        return Exit(reader.u32(), reader.u32())
    if kind == MUX_S_TTY_ALLOC_FAIL:
        return Exit(reader.u32(), None)
    raise MuxUnavailable(f"the master sent message {kind:#x} during the session")


class Packets:
    """Control-socket bytes in, whole message bodies out."""

    def __init__(self) -> None:
        self.data = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        self.data += chunk
        bodies = []
        while len(self.data) >= 4:
            (size,) = struct.unpack_from(">I", self.data)
            if size > MAX_PACKET:
                raise MuxUnavailable(f"the master sent a {size}-byte control message")
            if len(self.data) < 4 + size:
                break
            bodies.append(bytes(self.data[4 : 4 + size]))
            del self.data[: 4 + size]
        return bodies


# -- the socket
def connect(directory: str, name: str, timeout: float = OPEN_TIMEOUT) -> socket.socket:
    """The master's control socket `name` in the control directory, reached through the
    directory's descriptor (opened without following a symlink) where /proc allows; refused unless
    it is a socket of this user's (never through a symlink)."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise MuxUnavailable(f"the control directory cannot be opened ({exc.strerror})") from None
    try:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as exc:
            raise MuxUnavailable(f"no control socket ({exc.strerror})") from None
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
            raise MuxUnavailable("the control path is not a socket of this user's")
        via = f"/proc/self/fd/{dir_fd}"
        path = f"{via}/{name}" if os.path.isdir(via) else os.path.join(directory, name)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise MuxUnavailable(f"the master does not answer ({exc.strerror or exc})") from None
        return sock
    finally:
        os.close(dir_fd)


def read_body(sock: socket.socket) -> bytes:
    """One whole control message (blocking, under the socket's timeout); EOF is a surprise."""
    head = _exactly(sock, 4)
    (size,) = struct.unpack(">I", head)
    if size > MAX_PACKET:
        raise MuxUnavailable(f"the master sent a {size}-byte control message")
    return _exactly(sock, size)


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        try:
            chunk = sock.recv(size - len(data))
        except OSError as exc:
            raise MuxUnavailable(f"the control socket failed ({exc.strerror or exc})") from None
        if not chunk:
            raise MuxUnavailable("the master closed the control socket")
        data += chunk
    return bytes(data)


def open_session(
    directory: str,
    name: str,
    command: str,
    subsystem: bool = False,
    env: tuple[str, ...] = (),
    stderr: bool = True,
    wait: bool = True,
    local_timeout: float = OPEN_TIMEOUT,
) -> MuxChannel:
    """A session of the master at directory/name running `command` (or the subsystem so named),
    its stdin, stdout and (unless stderr is False: then /dev/null) stderr our pipes. `wait=False`:
    returned once the master has the request, without waiting the round trip to the node for
    MUX_S_SESSION_OPENED; the channel reads that answer with the master's later messages (a refusal
    then ends the session without an exit status, as a lost link does). `local_timeout`: how long
    the master itself may take to accept the socket and answer its hello (no round trip to the node:
    a master that takes longer is stuck)."""
    sock = connect(directory, name, local_timeout)
    ours: list[int] = []
    theirs: list[int] = []
    try:
        sock.sendall(hello())
        check_hello(read_body(sock))
        sock.settimeout(OPEN_TIMEOUT)
        for reading_end_is_theirs in (True, False, False) if stderr else (True, False):
            read, write = os.pipe()
            theirs.append(read if reading_end_is_theirs else write)
            ours.append(write if reading_end_is_theirs else read)
        if not stderr:
            theirs.append(os.open(os.devnull, os.O_WRONLY))
        sock.sendall(new_session(1, command, subsystem, env))
        for fd in theirs:
            socket.send_fds(sock, [b"\0"], [fd])
        opened = session_id(read_body(sock), 1) if wait else None
    except BaseException as exc:
        sock.close()
        for fd in ours:
            os.close(fd)
        if isinstance(exc, OSError):  # a pipe or the socket: no session opened, ssh may try
            raise MuxUnavailable(f"the control socket failed ({exc.strerror or exc})") from None
        raise
    finally:
        for fd in theirs:
            os.close(fd)  # the master holds its own copies now
    return MuxChannel(sock, opened, ours[0], ours[1], ours[2] if stderr else None)


class MuxChannel(PipeChannel):
    """A session opened through the master's control socket: the pipes are the command's stdin,
    stdout and stderr, the socket brings its exit status and closes when the session is gone (it is
    one of the descriptors fileno() watches, so a reader wakes for that too)."""

    def __init__(
        self,
        control: socket.socket,
        session: int | None,
        stdin_fd: int,
        stdout_fd: int,
        stderr_fd: int | None,
    ) -> None:
        super().__init__(stdin_fd, stdout_fd, stderr_fd)
        self.session = session  # None: MUX_S_SESSION_OPENED not read yet (open_session's wait)
        self._control: socket.socket | None = control
        self._packets = Packets()
        self._status: int | None = None
        self.ended = False  # the master closed the control socket: the session is over
        control.setblocking(False)
        self._watch(control.fileno())

    def exit_status_ready(self) -> bool:
        # all the master has said so far: its end may wait behind a message not read yet
        while self._read_control(0):
            pass
        return self.ended

    def ended_by_node(self) -> bool:
        """Whether the session is over with the node's exit status passed on (its command ended on
        its own); False while it runs, and for one whose master or link ended under it."""
        return self.exit_status_ready() and self._status is not None

    def recv_exit_status(self) -> int:
        """The exit status (waiting for the session to end); SSH_FAILED's 255 when the master closed
        without one, as `ssh` exits then; -1 once closed here before the end (paramiko's "none")."""
        while not self.ended and not self.closed:
            self._read_control(CLOSE_CHECK)  # close() from another thread ends the wait
        if not self.ended:
            return -1
        return NO_STATUS if self._status is None else self._status

    def files(self) -> tuple[BinaryIO, BinaryIO]:
        """stdin and stdout as blocking files (an SFTP client's); the descriptors stay the
        channel's, closed by close()."""
        assert self._in is not None
        return (
            os.fdopen(self._in, "wb", closefd=False),
            os.fdopen(self._fds["out"], "rb", closefd=False),
        )

    def close(self) -> None:
        """Our pipe ends and the control socket closed: the master closes the session channel (the
        node's command sees it close), as it does when an `ssh` mux client dies."""
        if self.closed:
            return
        self.closed = True
        self.shutdown_write()
        self._close_outputs()
        self._drop_control()

    def _drop_control(self) -> None:
        control, self._control = self._control, None
        if control is not None:
            self._unwatch(control.fileno())
            control.close()

    def _read_control(self, timeout: float | None) -> bool:
        """What the master said since (waiting up to `timeout` for something): the exit status
        kept, the end of the socket noted. True when it read a message's bytes, which more may
        follow."""
        control = self._control
        if control is None:
            return False
        try:
            readable, _, _ = select.select([control], [], [], timeout)
            chunk = control.recv(65536) if readable else None
        except BlockingIOError:
            return False
        except (OSError, ValueError):
            if self.closed:
                return False  # closed under us by close() in another thread: no status, not an end
            chunk = b""
        if chunk is None:
            return False
        if not chunk:
            self.ended = True
            self._drop_control()
            return False
        try:
            bodies = self._packets.feed(chunk)
        except MuxUnavailable:
            return False
        for body in bodies:
            if self.session is None:
                try:
                    self.session = session_id(body, 1)
                except MuxUnavailable:  # refused: no session, so no status to wait for
                    self.ended = True
                    self._drop_control()
                    return False
                continue
            with contextlib.suppress(MuxUnavailable):
                message = session_message(body)
                if message.session == self.session and message.status is not None:
                    self._status = message.status
        return True
