"""Load: 32 lab nodes x 20 rounds of patch, verify, rollback in one client process. Zero failures, zero
corrupted files, no leaked file descriptors, threads or processes on the client, no agent left on the nodes.
Prints the wall time and the client's peak memory (figures, not assertions on speed)."""

from __future__ import annotations

import hashlib
import os
import resource
import subprocess
import sys
import threading
import time

import pytest
from conftest import GENERATOR, WORKER, make_project, record_sha256

from fleetops import api
from fleetops.lab import Lab, site_packages

pytestmark = pytest.mark.lab
NODES = int(os.environ.get("FLEETOPS_LOAD_NODES", "32"))
ROUNDS = int(os.environ.get("FLEETOPS_LOAD_ROUNDS", "20"))
ROUND = [("patch", {}), ("verify", {"kinds": "grep,compile"}), ("rollback", {})]


@pytest.fixture(scope="module")
def big_lab(tmp_path_factory):
    lab = Lab(make_project(tmp_path_factory.mktemp("load") / "project"))
    lab.up(NODES, progress=lambda m: None)
    yield lab
    lab.down()


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def settle() -> None:
    """paramiko's transport threads end shortly after their connection is closed."""
    deadline = time.monotonic() + 10
    while threading.active_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.1)


def children() -> list[str]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(os.getpid())], capture_output=True, text=True).stdout
    return out.split()


def test_32_nodes_20_rounds_patch_verify_rollback(big_lab):
    lab = big_lab
    nodes = lab.nodes()
    pristine = {(n.name, m): record_sha256(site_packages(n.venv), m) for n in nodes for m in (GENERATOR, WORKER)}
    api.run(lab.root, "@lab", [("ping", {})])  # warm-up: agent uploaded, imports done
    settle()
    base_fds, base_threads, base_children = fds(), threading.active_count(), set(children())
    started = time.monotonic()
    failures, corrupted, checked = 0, 0, 0
    for _ in range(ROUNDS):
        results = api.run(lab.root, "@lab", ROUND)
        failures += sum(1 for r in results if r.failed)
        assert len(results) == NODES * len(ROUND)
        for n in nodes:
            for m in (GENERATOR, WORKER):
                checked += 1
                corrupted += hashlib.sha256(n.module_file(m).read_bytes()).hexdigest() != pristine[(n.name, m)]
    wall = time.monotonic() - started
    settle()
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    leftover_agents = subprocess.run(["pgrep", "-f", "fleetops-agent-.*pyz$"], capture_output=True, text=True).stdout
    print(f"\nload: {NODES} nodes x {ROUNDS} rounds of patch+verify+rollback = {NODES * ROUNDS * 3} task runs in "
          f"{wall:.1f}s ({wall / ROUNDS:.2f}s a round); {failures} failures; {corrupted} corrupted of {checked} file "
          f"checks; client peak RSS {peak_mib:.0f} MiB (the pytest process); fds {base_fds}->{fds()}, threads "
          f"{base_threads}->{threading.active_count()}", file=sys.stderr)
    assert failures == 0 and corrupted == 0
    assert fds() == base_fds, "file descriptors leaked"
    assert threading.active_count() == base_threads, "threads leaked"
    assert set(children()) <= base_children, "child processes leaked"
    assert leftover_agents.strip() == "", f"agents still running on nodes: {leftover_agents}"
