"""A warm OpenSSH run's agents started before the program's start-up (wire/warmstart.py), against
the lab's real sshd: the run takes each one over as its own (one session per host on the node, no
new connection), or, when the run would connect otherwise, closes it and connects as it would have.
A host without a live master, or a command line naming another login, gets nothing early. Every
connection is to 127.0.0.1."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO
from faultkit import agents_of, sshd_log, sshd_log_size, wait_for
from prockit import control_dir

from fleetops.plans.inventory import load_inventory
from fleetops.wire import masters, parked, warmstart
from fleetops.wire.connector import COUNTERS, Pool
from fleetops.wire.openssh import OpenSSHConnection
from fleetops.wire.transports import Factory

pytestmark = pytest.mark.lab

FLEET = Path(sys.executable).parent / "fleet"
EARLY = "its agent was started while the program started"


@pytest.fixture
def cm(monkeypatch) -> Iterator[str]:
    yield from control_dir(monkeypatch, "fo-w-")


def _fleet(root: Path, folder: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "COLUMNS": "200",
        "FLEETOPS_NO_LIVE": "1",
        "FLEETOPS_TRANSPORT": "openssh",
        "FLEETOPS_CONTROL_DIR": folder,
        "FLEETOPS_TRACE": "1",
        **env,
    }
    proc = subprocess.run(
        [str(FLEET), *args], cwd=root, env=full, text=True, capture_output=True, timeout=300
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def _sessions(text: str) -> int:
    return len(re.findall(r"^Starting session: command for ", text, re.M))


def _accepted(text: str) -> int:
    return len(re.findall(r"^Accepted publickey", text, re.M))


def _with_a_master(lab, monkeypatch) -> tuple:
    """lab01's node, the lab's inventory and lab01's Host, with a live master of lab01 (a run's,
    ended), in this process on the OpenSSH transport from the lab's project folder."""
    monkeypatch.setenv("FLEETOPS_TRANSPORT", "openssh")
    monkeypatch.chdir(lab.root)
    inventory = load_inventory(lab.root / "hosts")
    host = inventory.hosts["lab01"]
    warm = OpenSSHConnection(host, inventory)
    warm.call("ping", {})
    warm.close()
    return lab.node("lab01"), inventory, host


def test_a_warm_run_takes_over_the_agent_started_before_its_start_up(lab, cm):
    node = lab.node("lab01")
    first = _fleet(lab.root, cm, "-H", "lab01", "ping")  # cold: the run starts the master
    assert first.returncode == 0, first.stdout + first.stderr
    assert EARLY not in first.stderr + first.stdout  # no master yet: nothing started early
    since = sshd_log_size(node)
    proc = _fleet(lab.root, cm, "-H", "lab01", "patch", "verify", "--kinds", "grep,compile")
    both = proc.stdout + proc.stderr
    assert proc.returncode == 0, both
    assert f"trace lab01: {EARLY}" in both
    assert "trace lab01: 0 connections, 1 execs, 0 uploads" in both
    log = sshd_log(node, since)
    assert _sessions(log) == 1 and _accepted(log) == 0, log  # one agent, on the master


def test_a_command_line_naming_the_login_gets_no_early_start(lab, cm):
    """-u is the run's to apply: an agent started early would be the inventory's login."""
    node = lab.node("lab01")
    assert _fleet(lab.root, cm, "-H", "lab01", "ping").returncode == 0
    since = sshd_log_size(node)
    proc = _fleet(lab.root, cm, "-u", lab.user, "-H", "lab01", "ping")
    both = proc.stdout + proc.stderr
    assert proc.returncode == 0, both
    assert EARLY not in both
    assert _sessions(sshd_log(node, since)) == 1


def test_a_host_without_a_live_master_is_connected_to_by_the_run(lab, cm):
    node = lab.node("lab01")
    assert _fleet(lab.root, cm, "-H", "lab01", "ping").returncode == 0
    masters.close_all(cm, masters.masters(cm))
    since = sshd_log_size(node)
    proc = _fleet(lab.root, cm, "-H", "lab01,lab02", "ping")
    both = proc.stdout + proc.stderr
    assert proc.returncode == 0, both
    assert EARLY not in both
    log = sshd_log(node, since)
    assert _accepted(log) == 1 and _sessions(log) == 1, log


def test_an_agent_started_early_is_the_runs_only_when_it_is_the_runs_connection(
    lab, cm, monkeypatch
):
    """In-process, as entry.py and the run's Pool do it: the parked connection is the one the run's
    Factory hands out (its agent answers; one exec), and one made for a Host that differs from the
    run's is closed (its agent ends on the node) while the run's own connects."""
    node, inventory, host = _with_a_master(lab, monkeypatch)
    try:
        execs = COUNTERS.per_host.get("lab01", {}).get("execs", 0)
        assert warmstart.begin(["-H", "lab01", "ping"]) == ["lab01"]
        early = parked.names()
        pool = Pool(inventory, Factory())
        taken = pool.get(host)
        assert early == ["lab01"] and parked.names() == []
        answer, _ = taken.call("ping", {})
        assert answer.get("ok") is not False, answer
        assert COUNTERS.per_host["lab01"]["execs"] == execs + 1  # the early agent is the run's
        pool.close_all()

        assert warmstart.begin(["-H", "lab01", "ping"]) == ["lab01"]
        wait_for(lambda: len(agents_of(node)) == 1, what="the agent started early")
        other = dataclasses.replace(host, state_dir=host.state_dir + "-elsewhere")
        made = Pool(inventory, Factory()).get(other)
        assert isinstance(made, OpenSSHConnection) and made.session is None  # not the early one
        wait_for(lambda: agents_of(node) == [], what="the early agent's end")
    finally:
        parked.discard_all()


def test_a_host_whose_ssh_g_answer_is_not_stored_is_left_to_the_run(lab, cm):
    """Resolving a host here would take an `ssh -G` process, one host after another, before the
    program starts: the run resolves its hosts in parallel instead."""
    assert _fleet(lab.root, cm, "-H", "lab01", "ping").returncode == 0
    proc = _fleet(lab.root, cm, "-H", "lab01", "ping", FLEETOPS_SSH_G_CACHE="0")
    both = proc.stdout + proc.stderr
    assert proc.returncode == 0, both
    assert EARLY not in both
    assert "trace lab01: 0 connections, 1 execs, 0 uploads" in both


def test_an_early_agent_that_finds_its_zip_gone_is_sent_it_by_the_run(lab, cm):
    """The node's copy of the agent went away between two runs: the agent started early says so and
    ends; the run that took it over uploads the zip and starts it again, as a run that started it
    itself does."""
    node = lab.node("lab01")
    assert _fleet(lab.root, cm, "-H", "lab01", "ping").returncode == 0
    zips = list((Path(node.state_dir) / "bin").glob("fleetops-agent-*.pyz"))
    assert zips
    for path in zips:
        path.unlink()
    proc = _fleet(lab.root, cm, "-H", "lab01", "ping")
    both = proc.stdout + proc.stderr
    assert proc.returncode == 0, both
    assert f"trace lab01: {EARLY}" in both
    assert "trace lab01: 0 connections, 2 execs, 1 uploads" in both
    assert list((Path(node.state_dir) / "bin").glob("fleetops-agent-*.pyz"))


def test_an_early_agent_whose_master_ended_meanwhile_is_not_taken_over(lab, cm, monkeypatch):
    """The master ended while the host waited its turn (another run made room, `fleet disconnect`, a
    dropped link), taking the early agent's session with it: the run connects as it would have,
    starting a master of its own, instead of reaching the node without one."""
    node, inventory, host = _with_a_master(lab, monkeypatch)
    pool = None
    try:
        assert warmstart.begin(["-H", "lab01", "ping"]) == ["lab01"]
        masters.close_all(cm, masters.masters(cm))
        wait_for(lambda: agents_of(node) == [], what="the early agent's end with its master")
        since = sshd_log_size(node)
        COUNTERS.early.discard("lab01")  # another test's, in this process
        pool = Pool(inventory, Factory())
        taken = pool.get(host)
        assert "lab01" not in COUNTERS.early
        for _ in range(2):
            answer, _ = taken.call("ping", {})
            assert answer.get("ok") is not False, answer
        assert len(masters.masters(cm)) == 1  # the run's own master, started again
        assert _accepted(sshd_log(node, since)) == 1  # its one login
    finally:
        if pool is not None:
            pool.close_all()
        parked.discard_all()


def test_a_stale_control_socket_gets_no_early_start_and_no_login(lab, cm, monkeypatch):
    """A master killed outright (an OOM kill, a reboot) leaves its socket: `ssh` there would log in
    on its own. Before the program has read its command line nothing logs in: the early start
    opens sessions on live masters only."""
    import signal

    node, inventory, host = _with_a_master(lab, monkeypatch)
    live = masters.masters(cm)
    assert len(live) == 1
    os.kill(live[0].pid, signal.SIGKILL)
    wait_for(lambda: not _pid_alive(live[0].pid), what="the master's end")
    since = sshd_log_size(node)
    try:
        assert warmstart.begin(["-H", "lab01", "ping"]) == []
        assert parked.names() == []
        assert _accepted(sshd_log(node, since)) == 0 and _sessions(sshd_log(node, since)) == 0
    finally:
        parked.discard_all()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (the master was the child of this process) has ended too
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
