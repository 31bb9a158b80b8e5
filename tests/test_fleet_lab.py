"""Fleet runs against two real lab nodes: per-host chains, failures contained, rolling batches,
--limit, the live view on a terminal, and connections/execs counted by the nodes' sshd logs
(compared with the tool's counters)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest
from conftest import GENERATOR, REPO, disconnect_all, fab_json, on_openssh, run_fab
from sshd_evidence import logs_for

pytestmark = pytest.mark.lab
BOTH = ["lab01", "lab02"]


def fleet_json(lab, *args: str, env: dict | None = None):
    import json

    proc = subprocess.run(
        [sys.executable, "-m", "fleetops.cli", *args, "--json"],
        cwd=lab.root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=600,
    )
    return proc.returncode, json.loads(proc.stdout)


def drift(lab, name: str) -> None:
    target = lab.node(name).module_file(GENERATOR)
    target.write_text(
        target.read_text().replace("kv_cache_groups=kv_cache_groups,", "kv_cache_groups=mine,")
    )


def test_one_host_failing_mid_chain_does_not_stop_the_other(lab):
    drift(lab, "lab01")
    if on_openssh():
        disconnect_all()  # this run logs in afresh on either transport
    logs = logs_for(lab, BOTH)
    rc, doc = fab_json(
        lab.root,
        "-H",
        "lab01,lab02",
        "ping",
        "patch",
        "verify",
        "--kinds",
        "grep,compile",
        env={"FLEETOPS_TRACE": "1"},
    )
    assert rc == 1
    by = {(r["host"], r["task"]): r["status"] for r in doc["results"]}
    assert by == {
        ("lab01", "ping"): "ok",
        ("lab01", "patch"): "failed",
        ("lab01", "verify"): "skipped",
        ("lab02", "ping"): "ok",
        ("lab02", "patch"): "changed",
        ("lab02", "verify"): "ok",
    }
    assert doc["failed_hosts"] == ["lab01"]
    assert doc["recap"]["lab01"]["failed"] == 1 and doc["recap"]["lab02"]["failed"] == 0
    # From the nodes: each host's chain ran in one agent (one exec per host, plus one when the first
    # found no agent and it was uploaded), on one connection; the tool's counters say the same.
    # (That lab01's verify never reached the node shows in its result: skipped.)
    for name in BOTH:
        wire = logs[name].settled()
        assert wire.counts()["connections"] == 1 and list(wire.execs) == wire.accepted, (
            wire.describe()
        )
        assert wire.counts()["execs"] - wire.counts()["uploads"] == 1, wire.describe()
        assert doc["counters"][name] == wire.counts(), (
            f"tool counters {doc['counters'][name]}; {wire.describe()}"
        )


def test_patch_verify_is_one_connection_and_one_exec_per_host(lab):
    openssh = on_openssh()
    if openssh:
        disconnect_all()  # the ping below logs in; its master is the one the run must use
    both_runs = logs_for(lab, BOTH)
    # make sure the agent is already on both nodes
    run_fab(lab.root, "-H", "lab01,lab02", "ping", check=True)
    logs = logs_for(lab, BOTH)
    rc, doc = fab_json(
        lab.root,
        "-H",
        "lab01,lab02",
        "patch",
        "verify",
        "--kinds",
        "grep,compile",
        env={"FLEETOPS_TRACE": "1"},
    )
    assert rc == 0, doc
    for host in BOTH:
        wire = logs[host].settled()
        # one agent per host; paramiko: on a connection of its own, openssh: on the ping's master
        # (no new login), the one connection of both runs
        assert wire.counts() == {"connections": 0 if openssh else 1, "execs": 1, "uploads": 0}, (
            wire.describe()
        )
        assert len(wire.execs) == 1 and wire.sftp_sessions == 0, wire.describe()
        before = both_runs[host].settled()
        assert list(wire.execs) == (before.accepted if openssh else wire.accepted), (
            before.describe()
        )
        assert doc["counters"][host] == wire.counts(), (
            f"tool counters {doc['counters'][host]}; {wire.describe()}"
        )


def test_serial_batches_stop_the_rollout_after_a_failing_batch(lab):
    drift(lab, "lab01")
    rc, doc = fleet_json(lab, "-H", "lab01,lab02", "--serial", "1", "patch")
    assert rc == 1
    by = {r["host"]: r for r in doc["results"]}
    assert by["lab01"]["status"] == "failed"
    assert (
        by["lab02"]["status"] == "skipped"
        and "roll-out stopped after batch 1" in by["lab02"]["msg"]
    )
    assert "kv_cache_specs=kv_cache_spec" in lab.node("lab02").module_file(GENERATOR).read_text()


def test_serial_batches_all_run_when_all_succeed_and_limit_filters(lab):
    rc, doc = fleet_json(lab, "-H", "@lab", "--serial", "1", "--limit", "lab0[12]", "patch")
    assert rc == 0, doc
    assert sorted(r["host"] for r in doc["results"]) == ["lab01", "lab02"]
    rc, doc = fleet_json(lab, "-H", "@lab", "--limit", "lab02", "patch")
    assert [r["host"] for r in doc["results"]] == ["lab02"]
    proc = subprocess.run(
        [sys.executable, "-m", "fleetops.cli", "-H", "@lab", "--limit", "nomatch*", "ping"],
        cwd=lab.root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 2 and "matches none" in proc.stderr


def test_live_view_on_a_terminal_and_plain_lines_otherwise(lab):
    pid, fd = pty.fork()
    if pid == 0:  # child: run fab on a pseudo-terminal
        os.chdir(lab.root)
        os.environ.update(PYTHONPATH=str(REPO), COLUMNS="120", TERM="xterm")
        os.execv(
            sys.executable,
            [
                sys.executable,
                "-m",
                "fabric",
                "-H",
                "lab01,lab02",
                "ping",
                "verify",
                "--kinds",
                "grep",
            ],
        )
    chunks = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    os.waitpid(pid, 0)
    screen = b"".join(chunks).decode("utf-8", "replace")
    assert "current task" in screen and "elapsed" in screen  # the live table was drawn
    assert "RECAP" in screen
    plain = subprocess.run(
        [sys.executable, "-m", "fabric", "-H", "lab01,lab02", "ping"],
        cwd=lab.root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert "current task" not in plain.stdout
    assert "lab[01-02] (2) | ping | ok" in plain.stdout  # alike: one group
