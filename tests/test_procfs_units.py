"""The node agent's one way of reading /proc (remote_scripts/core/procfs.py), on this machine's real
processes: the pid list, the uptime its start times count on, a process's raw files, and nothing
(not an exception) for a process that is gone. No lab."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from remote_scripts.core import procfs

MARK = "fleetops-procfs-probe"


def _sleeper() -> subprocess.Popen:
    """A child that has exec'd (until then /proc shows the forked copy of this process)."""
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(60)", MARK])
    deadline = time.monotonic() + 30
    while MARK.encode() not in (procfs.read(child.pid, "cmdline") or b""):
        assert time.monotonic() < deadline, "the child did not start within 30 s"
        time.sleep(0.01)
    return child


def test_pids_lists_this_process_and_a_child_it_started():
    child = _sleeper()
    try:
        found = procfs.pids()
        assert os.getpid() in found and child.pid in found
        assert all(isinstance(p, int) for p in found)
    finally:
        child.kill()
        child.wait()


def test_read_gives_a_process_files_as_bytes_with_their_nul_separators():
    child = _sleeper()
    try:
        cmdline = procfs.read(child.pid, "cmdline")
        assert cmdline is not None and cmdline.split(b"\0")[-2] == MARK.encode()
        assert procfs.read(str(child.pid), "comm") is not None
        fields = procfs.stat_fields(child.pid)
        assert fields is not None and int(fields[1]) == os.getpid()  # ppid: this test
    finally:
        child.kill()
        child.wait()


def test_a_process_that_is_gone_reads_as_none():
    child = _sleeper()
    child.kill()
    child.wait()  # reaped: its /proc entry is gone
    assert child.pid not in procfs.pids()
    assert procfs.read(child.pid, "cmdline") is None
    assert procfs.read(child.pid, "environ") is None
    assert procfs.stat_fields(child.pid) is None


def test_uptime_is_the_clock_of_the_start_times():
    child = _sleeper()
    try:
        ticks = procfs.start_ticks(child.pid)
        assert ticks is not None
        age = procfs.uptime() - ticks / os.sysconf("SC_CLK_TCK")
        assert 0 <= age < 30  # started just now, on the same clock
    finally:
        child.kill()
        child.wait()
