"""Sessions opened on a real master's control socket by the OpenSSH transport itself (muxclient.py)
against the lab's sshd: a warm connection starts no `ssh` for its agent session, its exec or its
SFTP session; a failing command's exit status and stderr come back; megabytes in and out arrive
whole; closing the connection ends the node's agent; a master killed outright (its socket left
behind) makes the transport start `ssh` as before."""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import threading
import time
from collections.abc import Iterator

import pytest
from conftest import ssh_masters, ssh_processes
from faultkit import agents_of, wait_for
from prockit import control_dir

from fleetops.plans.inventory import load_inventory
from fleetops.wire import masters, muxclient
from fleetops.wire.muxclient import MuxChannel
from fleetops.wire.openssh import OpenSSHConnection
from fleetops.wire.sshproc import ProcessChannel

pytestmark = pytest.mark.lab


@pytest.fixture
def cm(monkeypatch) -> Iterator[str]:
    yield from control_dir(monkeypatch, "fo-m-", FLEETOPS_TRANSPORT="openssh")


def _connector(lab) -> OpenSSHConnection:
    inventory = load_inventory(lab.root / "hosts")
    return OpenSSHConnection(inventory.resolve("lab01"), inventory)


def test_a_warm_connection_starts_no_ssh_for_its_agent_exec_or_sftp(lab, cm):
    node = _connector(lab)
    try:
        node.call("ping", {})
        assert node.session is not None and isinstance(node.session.chan, MuxChannel)
        # the master alone, while the agent's session is open
        assert len(ssh_processes(cm)) == 1
        seen: list[int] = []
        done = threading.Event()

        def count_while_exec_runs() -> None:
            while not done.is_set():
                seen.append(len(ssh_processes(cm)))
                time.sleep(0.05)

        counter = threading.Thread(target=count_while_exec_runs)
        counter.start()
        try:
            result = node.exec(["sh", "-c", "sleep 1; echo done"])
        finally:
            done.set()
            counter.join()
        assert result.exit_code == 0 and result.stdout == b"done\n", result
        assert seen and max(seen) == 1, seen
        remote = f"{lab.node('lab01').state_dir}/t-mux/small.bin"
        node.upload(remote, b"over the socket")
        assert isinstance(node._sftp_chan, MuxChannel) and node._sftp_proc is None
        assert node.download(remote) == b"over the socket"
        assert len(ssh_processes(cm)) == 1
    finally:
        node.close()


def test_a_failing_commands_exit_status_and_stderr_come_back(lab, cm):
    node = _connector(lab)
    try:
        node.open()
        result = node.exec(["sh", "-c", "echo out; echo 'it went wrong' >&2; exit 7"])
        assert (result.exit_code, result.stdout, result.stderr) == (7, b"out\n", b"it went wrong\n")
        # a command the node's shell cannot find: its own status and words
        result = node.exec(["no-such-command-here"])
        assert result.exit_code == 127 and b"no-such-command-here" in result.stderr, result
    finally:
        node.close()


def test_megabytes_in_and_out_arrive_whole_and_an_sftp_fetch_resumes(lab, cm, tmp_path):
    node = _connector(lab)
    data = os.urandom(6 * 1024 * 1024)
    remote = f"{lab.node('lab01').state_dir}/t-mux/big.bin"
    try:
        node.open()
        # in: 6 MiB on stdin, its digest computed on the node
        result = node.exec(["sha256sum"], stdin=data)
        assert result.exit_code == 0, result
        assert result.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
        # out: the same bytes uploaded over SFTP, then read back on stdout
        node.upload(remote, data)
        result = node.exec(["cat", remote])
        assert result.exit_code == 0 and result.stdout == data
        # a fetch over SFTP, resumed from a partial copy
        local = tmp_path / "big.bin"
        local.write_bytes(data[:1_000_000])
        got = node.download_to(remote, str(local), 1_000_000, len(data))
        assert got == len(data) - 1_000_000 and local.read_bytes() == data
        assert isinstance(node._sftp_chan, MuxChannel)
    finally:
        node.close()


def test_closing_the_connection_ends_the_nodes_agent_while_the_master_lives_on(lab, cm):
    lab_node = lab.node("lab01")
    node = _connector(lab)
    try:
        node.call("ping", {})
        assert node.session is not None and isinstance(node.session.chan, MuxChannel)
        assert agents_of(lab_node)
    finally:
        node.close()
    wait_for(lambda: not agents_of(lab_node), "lab01's agent to exit after its session closed")
    assert len(ssh_processes(cm)) == 1


def test_a_stale_socket_falls_back_to_ssh(lab, cm):
    node = _connector(lab)
    try:
        node.call("ping", {})
    finally:
        node.close()
    ((pid, name),) = ssh_masters(cm).items()
    os.kill(pid, signal.SIGKILL)  # no cleanup: its socket file stays, nothing listens on it
    wait_for(lambda: not masters._alive(pid), "the master to die")
    assert stat.S_ISSOCK(os.lstat(os.path.join(cm, name)).st_mode)
    node = _connector(lab)
    try:
        answer, evidence = node.call("ping", {})
        assert evidence.exit_code == 0, answer
        assert node.session is not None and isinstance(node.session.chan, ProcessChannel)
        result = node.exec(["sh", "-c", "echo fine; exit 3"])
        assert (result.exit_code, result.stdout) == (3, b"fine\n"), result
        remote = f"{lab.node('lab01').state_dir}/t-mux/fallback.bin"
        node.upload(remote, b"through ssh")
        assert node.download(remote) == b"through ssh"
        assert node._sftp_chan is None and node._sftp_proc is not None
    finally:
        node.close()


def test_a_close_from_another_thread_ends_a_wait_for_the_exit_status(lab, cm):
    node = _connector(lab)
    try:
        node.open()
        assert node._directory is not None and node._socket is not None
        chan = muxclient.open_session(node._directory, node._socket, "sleep 5")
        got: list[int] = []
        waiter = threading.Thread(target=lambda: got.append(chan.recv_exit_status()))
        waiter.start()
        time.sleep(0.3)
        assert not got and not chan.exit_status_ready()
        started = time.monotonic()
        chan.close()
        waiter.join(timeout=5)
        assert got == [-1] and time.monotonic() - started < 2, got  # -1: paramiko's "none"
    finally:
        node.close()


def test_a_master_killed_during_a_session_leaves_no_exit_status_as_ssh_says_255(lab, cm):
    node = _connector(lab)
    try:
        node.open()
        assert node._directory is not None and node._socket is not None
        chan = muxclient.open_session(node._directory, node._socket, "echo started; sleep 5")
        assert chan.recv(100) == b"started\n"
        ((pid, _),) = ssh_masters(cm).items()
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        assert chan.recv_exit_status() == 255 and time.monotonic() - started < 3
        assert chan.exit_status_ready() and chan.recv(100) == b"" and chan.eof_received
        chan.close()
    finally:
        node.close()
