"""OpenSSH's multiplexing messages as muxclient writes and reads them (PROTOCOL.mux, version 4),
byte for byte, and the control socket's checks before a connect: a symlink, another kind of file, a
missing or stale socket are each MuxUnavailable (the caller then starts `ssh`)."""

from __future__ import annotations

import os
import socket
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.wire import muxclient
from fleetops.wire.muxclient import MuxUnavailable, Packets, Reader
from fleetops.wire.session import drain
from fleetops.wire.sshproc import ProcessChannel


def _fields(body: bytes) -> tuple[int, ...]:
    return struct.unpack(f">{len(body) // 4}I", body)


def test_hello_is_the_version_4_message_with_no_extensions():
    assert muxclient.hello() == bytes.fromhex("000000080000000100000004")


def test_new_session_carries_no_tty_x11_agent_or_escape_and_the_command_word_for_word():
    raw = muxclient.new_session(7, "sh -c 'echo é'", env=("LANG=C.UTF-8", "LC_ALL=C"))
    (size,) = struct.unpack_from(">I", raw)
    assert size == len(raw) - 4
    reader = Reader(raw[4:])
    assert reader.u32() == muxclient.MUX_C_NEW_SESSION and reader.u32() == 7
    assert reader.string() == b""  # reserved
    assert [reader.u32() for _ in range(4)] == [0, 0, 0, 0]  # tty, X11, agent, subsystem
    assert reader.u32() == 0xFFFFFFFF  # no escape character
    assert reader.string() == b""  # no terminal type
    assert reader.string() == "sh -c 'echo é'".encode()
    assert [reader.string(), reader.string()] == [b"LANG=C.UTF-8", b"LC_ALL=C"]
    assert reader.left() == 0


def test_a_subsystem_session_sets_its_flag_and_names_the_subsystem():
    reader = Reader(muxclient.new_session(1, "sftp", subsystem=True)[4:])
    reader.u32(), reader.u32(), reader.string()
    assert [reader.u32() for _ in range(4)] == [0, 0, 0, 1]
    reader.u32(), reader.string()
    assert reader.string() == b"sftp" and reader.left() == 0


def _body(*parts: int | bytes) -> bytes:
    return b"".join(muxclient.u32(p) if isinstance(p, int) else muxclient.string(p) for p in parts)


def test_the_masters_hello_of_version_4_is_accepted_with_extensions_skipped():
    muxclient.check_hello(_body(muxclient.MUX_MSG_HELLO, 4))
    muxclient.check_hello(_body(muxclient.MUX_MSG_HELLO, 4, b"ext@example", b"value"))


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (_body(muxclient.MUX_MSG_HELLO, 3), "version 3, not 4"),
        (_body(muxclient.MUX_MSG_HELLO, 5), "version 5, not 4"),
        (_body(muxclient.MUX_S_OK, 4), "for HELLO"),
        (_body(muxclient.MUX_MSG_HELLO), "ended early"),
        (_body(muxclient.MUX_MSG_HELLO, 4, b"name-without-value"), "ended early"),
    ],
)
def test_any_other_hello_is_a_surprise(body, words):
    with pytest.raises(MuxUnavailable, match=words):
        muxclient.check_hello(body)


def test_session_opened_gives_the_session_id():
    assert muxclient.session_id(_body(muxclient.MUX_S_SESSION_OPENED, 1, 42), 1) == 42


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (_body(muxclient.MUX_S_PERMISSION_DENIED, 1, b"Permission denied"), "Permission denied"),
        (_body(muxclient.MUX_S_FAILURE, 1, b"Session open refused by peer"), "refused by peer"),
        (_body(muxclient.MUX_S_SESSION_OPENED, 2, 42), "answered request 2, not 1"),
        (_body(muxclient.MUX_S_OK, 1), "message 0x80000001 for the session"),
        (_body(muxclient.MUX_S_SESSION_OPENED, 1), "ended early"),
    ],
)
def test_a_refusal_or_an_unexpected_answer_to_the_session_is_a_surprise(body, words):
    with pytest.raises(MuxUnavailable, match=words):
        muxclient.session_id(body, 1)


def test_the_exit_message_and_the_tty_note_are_read():
    assert muxclient.session_message(_body(muxclient.MUX_S_EXIT_MESSAGE, 3, 7)) == muxclient.Exit(
        3, 7
    )
    assert muxclient.session_message(_body(muxclient.MUX_S_TTY_ALLOC_FAIL, 3)).status is None
    with pytest.raises(MuxUnavailable):
        muxclient.session_message(_body(muxclient.MUX_S_OK, 3))


def test_packets_come_out_whole_however_the_bytes_arrive():
    one = muxclient.packet(_body(muxclient.MUX_S_EXIT_MESSAGE, 3, 0))
    two = muxclient.packet(_body(muxclient.MUX_S_TTY_ALLOC_FAIL, 3))
    stream = one + two
    packets = Packets()
    bodies = []
    for i in range(len(stream)):
        bodies += packets.feed(stream[i : i + 1])
    assert bodies == [one[4:], two[4:]] and not packets.data
    assert Packets().feed(stream) == [one[4:], two[4:]]


def test_an_oversized_control_message_is_refused_before_it_is_buffered():
    with pytest.raises(MuxUnavailable, match="byte control message"):
        Packets().feed(muxclient.u32(muxclient.MAX_PACKET + 1))


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mx", dir="/tmp"))  # short: a socket path holds 108 bytes
    path.chmod(0o700)
    yield path
    for entry in path.iterdir():
        entry.unlink()
    path.rmdir()


def _listening(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    return server


def test_a_listening_socket_of_ours_is_connected_through_the_directory(folder):
    server = _listening(folder / "m")
    try:
        sock = muxclient.connect(str(folder), "m")
        peer, _ = server.accept()
        sock.sendall(b"x")
        assert peer.recv(1) == b"x"
        peer.close()
        sock.close()
    finally:
        server.close()


def test_a_symlink_to_a_listening_socket_is_never_followed(folder, tmp_path):
    server = _listening(folder / "real")
    os.symlink(folder / "real", folder / "link")
    try:
        with pytest.raises(MuxUnavailable, match="not a socket"):
            muxclient.connect(str(folder), "link")
    finally:
        server.close()


def test_a_symlinked_control_directory_is_never_followed(folder):
    server = _listening(folder / "m")
    link = Path(str(folder) + "L")
    os.symlink(folder, link)
    try:
        with pytest.raises(MuxUnavailable, match="control directory"):
            muxclient.connect(str(link), "m")
    finally:
        link.unlink()
        server.close()


def test_a_plain_file_a_missing_socket_and_a_stale_one_are_each_unavailable(folder):
    (folder / "file").write_bytes(b"")
    with pytest.raises(MuxUnavailable, match="not a socket"):
        muxclient.connect(str(folder), "file")
    with pytest.raises(MuxUnavailable, match="no control socket"):
        muxclient.connect(str(folder), "absent")
    _listening(folder / "stale").close()  # the file stays, nothing listens: a killed master's
    with pytest.raises(MuxUnavailable, match="does not answer"):
        muxclient.connect(str(folder), "stale")


def test_a_process_channel_is_drained_as_soon_as_its_process_ends_after_its_pipes_closed(deferred):
    """The pipes both channels share: a command that closes stdout and stderr, then exits a moment
    later. A reader waiting on fileno() wakes when the process ends (the same wake-up the mux
    channel gets from its control socket), not after its one-second poll."""
    chan = ProcessChannel(["sh", "-c", "exec >&- 2>&-; sleep 0.3; exit 4"])
    started = time.monotonic()
    out, err, code = drain(chan, started + 10)
    took = time.monotonic() - started
    assert (out, err, code) == (b"", b"", 4)
    assert took < 0.8, f"drained {took:.2f} s after the start of a 0.3 s command"


@pytest.fixture
def deferred() -> Iterator[tuple[muxclient.MuxChannel, socket.socket]]:
    """A channel opened without waiting for MUX_S_SESSION_OPENED (open_session's wait=False), on a
    socket pair standing for the master's control socket and pipes for its stdio; all closed after
    the test."""
    ours, master = socket.socketpair()
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    chan = muxclient.MuxChannel(ours, None, stdin_w, stdout_r, None)
    try:
        yield chan, master
    finally:
        master.close()
        chan.close()
        for fd in (stdin_r, stdout_w):
            os.close(fd)


def _packet(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def test_a_session_not_waited_for_reads_its_opening_then_its_exit_status(deferred):
    chan, master = deferred
    master.sendall(_packet(_body(muxclient.MUX_S_SESSION_OPENED, 1, 42)))
    master.sendall(_packet(_body(muxclient.MUX_S_EXIT_MESSAGE, 41, 9)))  # another session's
    master.sendall(_packet(_body(muxclient.MUX_S_EXIT_MESSAGE, 42, 7)))
    master.close()
    assert chan.recv_exit_status() == 7 and chan.session == 42


def test_a_session_not_waited_for_that_the_master_refuses_ends_without_a_status(deferred):
    chan, master = deferred
    master.sendall(_packet(_body(muxclient.MUX_S_FAILURE, 1, b"Session open refused by peer")))
    deadline = time.monotonic() + 5
    while not chan.exit_status_ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert chan.ended and chan.session is None
    assert chan.recv_exit_status() == muxclient.NO_STATUS


def test_a_master_that_takes_the_socket_but_never_says_hello_is_given_up_on():
    """A stuck master (stopped, frozen) accepts the connection and answers nothing: the session is
    given up after `local_timeout` (the master answers its hello itself, with no round trip to the
    node), not after the node's connect timeout."""
    import threading

    path = Path(tempfile.mkdtemp(prefix="mx", dir="/tmp"))
    path.chmod(0o700)
    server = _listening(path / "m")  # listens, never accepts nor answers
    outcome: list[BaseException | None] = []

    def open_one() -> None:
        try:
            muxclient.open_session(str(path), "m", "true", wait=False, local_timeout=0.2)
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    try:
        opener = threading.Thread(target=open_one, daemon=True)
        opener.start()
        opener.join(30)  # the default wait would be muxclient.OPEN_TIMEOUT, 75 s
        assert not opener.is_alive(), "still waiting for the master's hello"
        assert len(outcome) == 1 and isinstance(outcome[0], MuxUnavailable), outcome
    finally:
        server.close()
        (path / "m").unlink()
        path.rmdir()


def test_an_end_behind_a_message_not_read_yet_is_seen_at_the_first_look(deferred):
    """The master said the session opened, then closed the socket (it ended, or its master did): one
    look says so, whatever was still unread before the end."""
    chan, master = deferred
    master.sendall(_packet(_body(muxclient.MUX_S_SESSION_OPENED, 1, 42)))
    master.close()
    assert chan.exit_status_ready() is True
    assert chan.ended_by_node() is False  # no exit status: its master or link ended it


def test_a_session_whose_command_exited_ended_by_the_node(deferred):
    chan, master = deferred
    assert chan.ended_by_node() is False  # running
    master.sendall(_packet(_body(muxclient.MUX_S_SESSION_OPENED, 1, 42)))
    master.sendall(_packet(_body(muxclient.MUX_S_EXIT_MESSAGE, 42, 3)))
    master.close()
    assert chan.ended_by_node() is True
