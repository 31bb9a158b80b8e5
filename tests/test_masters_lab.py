"""ssh master connections against the lab's nodes: real `ssh -M` masters started here
(ControlPersist, a socket in a private control directory, a record beside it as the OpenSSH
transport writes one), listed by `fleet connections` with the pid `ssh -O check` and the kernel's
socket table both give, closed by `fleet disconnect` (one host or all; a stale socket removed) and
by `lab.down`; none left afterwards."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, run_fab, ssh_masters, ssh_processes

from fleetops.lab import Lab
from fleetops.lab.node import Node
from fleetops.wire import controldir, masters
from fleetops.wire.controldir import MasterRecord


@pytest.fixture
def cm_dir() -> Iterator[Path]:
    """A private control directory with a short path (a socket path holds 108 bytes); every master
    left in it is closed at the end, by ssh's own `-O exit`."""
    path = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp"))
    yield path
    for pid, name in ssh_masters(path).items():
        subprocess.run(
            ["ssh", "-F", "/dev/null", "-S", str(path / name), "-O", "exit", "x"],
            capture_output=True,
        )
        if masters._alive(pid):
            os.kill(pid, signal.SIGTERM)
    for pid in ssh_processes(str(path)):  # an ssh of the directory that is no master: none stays
        os.kill(pid, signal.SIGTERM)
    shutil.rmtree(path, ignore_errors=True)


def start_master(
    lab: Lab, node: Node, directory: Path, record: bool = True, name: str = "%C"
) -> str:
    """A real master to `node` (`ssh -M -fN`, ControlPersist 60 s, socket named %C as the transport
    names it), its record written as the transport writes one; returns the socket's name."""
    before = set(masters.socket_names(str(directory)))
    masters.open_master(
        str(directory / name),
        f"{lab.user}@127.0.0.1",
        node.port,
        str(lab.client_key),
        str(lab.known_hosts),
        persist_s=60,
    )
    (name,) = set(masters.socket_names(str(directory))) - before
    if record:
        now = time.time()
        controldir.write_record(
            str(directory),
            MasterRecord(
                socket=name,
                host=node.name,
                hostname="127.0.0.1",
                user=lab.user,
                port=node.port,
                jump="",
                opened=now - 125,
                used=now - 5,
            ),
        )
    return name


def fleet(lab: Lab, directory: Path, *args: str) -> subprocess.CompletedProcess:
    proc = run_fab(lab.root, *args, env={"FLEETOPS_CONTROL_DIR": str(directory)}, timeout=120)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def test_connections_lists_live_masters_and_disconnect_closes_one_host_then_all(lab, cm_dir):
    lab01, lab02 = lab.nodes()[:2]
    first = start_master(lab, lab01, cm_dir)
    second = start_master(lab, lab02, cm_dir, record=False)  # a master fleetops has no record of
    pids = ssh_masters(cm_dir)
    assert sorted(pids.values()) == sorted([first, second])
    by_socket = {name: pid for pid, name in pids.items()}

    proc = fleet(lab, cm_dir, "connections", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["socket"]: r for r in json.loads(proc.stdout)["masters"]}
    assert rows[first]["host"] == "lab01" and rows[first]["port"] == lab01.port
    assert rows[first]["user"] == lab.user and rows[first]["state"] == "live"
    assert rows[first]["pid"] == by_socket[first] and 120 <= rows[first]["age_s"] < 200
    assert 5 <= rows[first]["idle_s"] < 80
    assert 512 < rows[first]["rss_kib"] < 64 * 1024  # an ssh master: a few MB resident
    assert rows[second]["host"] == second and rows[second]["pid"] == by_socket[second]
    assert rows[second]["age_s"] is None

    table = fleet(lab, cm_dir, "connections").stdout
    assert "lab01" in table and str(by_socket[first]) in table and second[:12] in table
    assert re.search(r"│ +[23]m\d\ds │", table), table  # the age, as an operator reads it
    assert re.search(r"│ +\d+\.\dM │", table) and "2 masters, " in table, table

    assert (
        "no ssh master connections to close for lab09"
        in fleet(lab, cm_dir, "-H", "lab09", "disconnect").stdout
    )
    proc = fleet(lab, cm_dir, "-H", "lab01", "disconnect")
    assert proc.returncode == 0 and second not in proc.stdout, proc.stdout + proc.stderr
    assert f"lab01: master closed (pid {by_socket[first]})" in proc.stdout
    assert not masters._alive(by_socket[first])
    assert controldir.read_record(str(cm_dir), first) is None and not (cm_dir / first).exists()
    assert ssh_masters(cm_dir) == {by_socket[second]: second}

    proc = fleet(lab, cm_dir, "disconnect")
    assert proc.returncode == 0 and f"{second}: master closed" in proc.stdout, (
        proc.stdout + proc.stderr
    )
    assert ssh_masters(cm_dir) == {}
    assert "no ssh master connections" in fleet(lab, cm_dir, "connections").stdout


def test_a_stale_socket_is_said_and_removed(lab, cm_dir):
    name = start_master(lab, lab.nodes()[0], cm_dir)
    (pid,) = ssh_masters(cm_dir)
    os.kill(pid, signal.SIGKILL)  # the master dies without removing its socket
    deadline = time.monotonic() + 5
    while masters._alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (cm_dir / name).is_socket()

    proc = fleet(lab, cm_dir, "connections", "--json")
    (row,) = json.loads(proc.stdout)["masters"]
    assert (row["state"], row["pid"], row["host"]) == ("stale", None, "lab01")
    assert "lab01: stale socket" in fleet(lab, cm_dir, "connections").stdout

    proc = fleet(lab, cm_dir, "disconnect")
    assert (
        proc.returncode == 0 and "lab01: stale socket" in proc.stdout and "removed" in proc.stdout
    )
    assert not (cm_dir / name).exists() and controldir.read_record(str(cm_dir), name) is None


def test_lab_down_closes_the_labs_masters_and_leaves_others(lab, cm_dir):
    lab01, lab02 = lab.nodes()[:2]
    start_master(lab, lab01, cm_dir)
    start_master(lab, lab02, cm_dir)
    # not known as the lab's: the operator's
    other = start_master(lab, lab02, cm_dir, record=False, name="mine")
    assert len(ssh_masters(cm_dir)) == 3
    try:
        proc = fleet(lab, cm_dir, "lab.down")
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout + proc.stderr
        assert "lab01: ssh master closed" in out and "lab02: ssh master closed" in out
        assert list(ssh_masters(cm_dir).values()) == [other]
    finally:
        for node in lab.nodes():
            lab.start_node(node)


def test_runs_at_once_to_a_cold_host_share_one_master_and_leave_no_ssh_behind(lab, cm_dir):
    """Four `fleet ping`s started together at one host with no master: one master, which all four
    use, and after `fleet disconnect` no ssh process of the directory left. Each run used to start
    its own `ssh -M`; the ones that lost the race for the socket's name went on as plain `ssh -N`
    connections (OpenSSH: "ControlSocket ... already exists, disabling multiplexing") that nothing
    listed or closed, holding a login on the node for good."""
    env = {**os.environ, "FLEETOPS_CONTROL_DIR": str(cm_dir), "FLEETOPS_TRANSPORT": "openssh"}
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "fleetops.cli", "-H", "lab01", "ping"],
            cwd=lab.root,
            env={**env, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [run.communicate(timeout=120)[0] for run in runs]
    said = [f"--- exit {run.returncode}\n{text}" for run, text in zip(runs, outputs)]
    assert all(run.returncode == 0 for run in runs), "\n".join(said)
    assert len(ssh_processes(str(cm_dir))) == 1, ssh_processes(str(cm_dir))
    assert len(ssh_masters(cm_dir)) == 1
    fleet(lab, cm_dir, "disconnect")
    assert ssh_processes(str(cm_dir)) == []
