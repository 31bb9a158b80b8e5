"""The master-connection module without a node: a socket nothing listens on is stale (and only such
a one is removed), a listener is found by the kernel's tables under the name ssh renames it to, -H
words pick masters by what the record says, a socket ssh is still binding is not listed, and ages
read as an operator reads them. Real Unix sockets and the real `ssh -O check`."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fleetops.report.masters import duration
from fleetops.wire import controldir, masters
from fleetops.wire.controldir import MasterRecord

needs_ssh = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh")


@pytest.fixture
def cm() -> Path:
    path = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def dead_socket(path: Path) -> None:
    """A socket file nothing listens on: what a killed master leaves."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()


def record(name: str, host: str, used: float = 1.0) -> MasterRecord:
    return MasterRecord(
        socket=name,
        host=host,
        hostname="10.0.0.9",
        user="ops",
        port=2222,
        jump="",
        opened=0.5,
        used=used,
    )


@needs_ssh
def test_a_socket_nothing_listens_on_is_stale_and_closing_removes_it(cm):
    dead_socket(cm / "gone")
    controldir.write_record(str(cm), record("gone", "web1"))
    assert masters.check(str(cm / "gone")) is None
    (found,) = masters.masters(str(cm))
    assert found.stale and found.host == "web1"
    closed = masters.close(str(cm), "gone")
    assert (closed.outcome, closed.host) == ("stale", "web1")
    assert not (cm / "gone").exists() and controldir.read_record(str(cm), "gone") is None


@needs_ssh
def test_a_listener_that_is_no_master_is_neither_live_nor_removed(cm, monkeypatch):
    """Something listens but does not speak ssh's mux protocol: never taken for stale, never
    removed."""
    monkeypatch.setattr(masters, "CHECK_TIMEOUT_S", 1.0)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(cm / "odd"))
    server.listen(4)
    try:
        (found,) = masters.masters(str(cm))
        assert found.pid is None and not found.stale and found.error
        assert masters.close(str(cm), "odd").outcome == "failed"
        assert (cm / "odd").is_socket()
    finally:
        server.close()


def test_listeners_are_found_by_the_name_ssh_gives_them(cm):
    """ssh binds `<socket>.<16 characters>` and links it to `<socket>`: the kernel keeps the first
    name."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import os, socket, sys, time\n"
                "s = socket.socket(socket.AF_UNIX); "
                f"s.bind({str(cm / 'abc.0123456789abcdef')!r}); s.listen(1)\n"
                f"os.link({str(cm / 'abc.0123456789abcdef')!r}, {str(cm / 'abc')!r})\n"
                f"os.unlink({str(cm / 'abc.0123456789abcdef')!r})\n"
                "print('up', flush=True); time.sleep(60)\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"
        assert masters.listening_pids(str(cm)) == {child.pid: str(cm / "abc")}
        assert masters.socket_names(str(cm)) == ["abc"]
        os.unlink(cm / "abc")  # a master whose socket file was removed is still found
        assert masters.listening_pids(str(cm)) == {child.pid: str(cm / "abc")}
    finally:
        child.kill()
        child.wait()
    assert masters.listening_pids(str(cm)) == {}


def test_a_socket_being_bound_is_not_listed(cm):
    dead_socket(cm / "a4336bc55ef7d52ef6aaca75b4cd5472e1e5217e.E1nKrM3HvzfbPPTx")
    dead_socket(cm / "a4336bc55ef7d52ef6aaca75b4cd5472e1e5217e")
    (cm / "notasocket").write_text("")
    assert masters.socket_names(str(cm)) == ["a4336bc55ef7d52ef6aaca75b4cd5472e1e5217e"]


def test_host_words_pick_masters_by_their_record():
    found = [
        masters.Master("s1", 10, record("s1", "web1")),
        masters.Master("s2", 11, record("s2", "web2")),
        masters.Master("s3", 12, None),
    ]
    pick = lambda words: [m.socket for m in masters.chosen(found, words)]  # noqa: E731
    assert pick(None) == ["s1", "s2", "s3"]
    assert (
        pick(["web1"]) == ["s1"] and pick(["web*"]) == ["s1", "s2"] and pick(["ops@web2"]) == ["s2"]
    )
    assert (
        pick(["10.0.0.9:2222"]) == ["s1", "s2"] and pick(["s3"]) == ["s3"] and pick(["nope"]) == []
    )


def test_the_oldest_use_comes_first_and_rows_say_age_and_idle():
    now = time.time()
    rows = masters.row(masters.Master("s1", 10, record("s1", "web1", used=now - 30)), now=now)
    assert (rows["state"], rows["idle_s"], rows["pid"], rows["jump"]) == ("live", 30.0, 10, None)
    assert masters.row(masters.Master("s3", None, None), now=now)["state"] == "stale"
    assert [duration(s) for s in (None, 5, 125, 7500, 3 * 86400 + 4 * 3600)] == [
        "-",
        "5s",
        "2m05s",
        "2h05m",
        "3d04h",
    ]


def test_no_ssh_binary_is_said_not_raised_as_a_traceback(cm, monkeypatch):
    dead_socket(cm / "gone")
    monkeypatch.setenv("PATH", str(cm))
    with pytest.raises(masters.MasterError, match="no `ssh` on PATH"):
        masters.check(str(cm / "gone"))
    closed = masters.close(str(cm), "gone")
    assert closed.outcome == "failed" and "no `ssh` on PATH" in closed.detail
    assert (cm / "gone").is_socket()  # nothing removed on doubt


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="reads Linux's /proc")
def test_a_process_cost_is_read_from_proc_and_a_gone_one_reads_none():
    """What `connections` shows and bench/master_cost.py measures: VmRSS and Pss in KiB as the
    kernel writes them, the descriptors a process holds, None for a process that is gone."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout.readline() == b"up\n"  # started: its memory no longer grows
        status = Path(f"/proc/{child.pid}/status").read_text()
        vm_size = int(next(ln for ln in status.splitlines() if ln.startswith("VmSize:")).split()[1])
        rss = masters.rss_kib(child.pid)
        pss = masters.proc_kib(child.pid, "Pss", "smaps_rollup")
        assert rss is not None and pss is not None and 0 < pss <= rss <= vm_size
        assert masters.proc_kib(child.pid, "NoSuchField") is None
        held = len(os.listdir(f"/proc/{child.pid}/fd"))
        assert masters.fd_count(child.pid) == held >= 3
    finally:
        child.stdin.close()
        child.wait(timeout=30)
        child.stdout.close()
    assert masters.rss_kib(child.pid) is None and masters.fd_count(child.pid) is None
