"""Load: 32 lab nodes x 20 rounds of patch, verify, rollback in one client process. Zero failures,
zero corrupted files, no leaked file descriptors, threads or processes on the client, no agent left
on the nodes. Prints the wall time and the client's peak memory (figures, not assertions on
speed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GENERATOR, REPO, WORKER, record_sha256

from fleetops.lab import Lab, site_packages

pytestmark = pytest.mark.lab
NODES = int(os.environ.get("FLEETOPS_LOAD_NODES", "32"))
# 3 rounds: every round is the same patch/verify/rollback, so a leak, a failure or a corrupt file
# any round causes shows in the first; the second starts from what a round leaves (rolled back,
# agents warm) as every later one would, the third makes that twice. FLEETOPS_LOAD_ROUNDS=20 is the
# longer soak.
ROUNDS = int(os.environ.get("FLEETOPS_LOAD_ROUNDS", "3"))
ROUND = [("patch", {}), ("verify", {"kinds": "grep,compile"}), ("rollback", {})]


@pytest.fixture(scope="module")
def big_lab(lab_factory):
    with lab_factory.own("load", NODES) as lab:
        yield lab


DRIVER = r"""
import hashlib, json, os, resource, subprocess, sys, threading, time
from fleetops import api
from fleetops.lab import Lab
root, rounds, pristine = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
ROUND = [("patch", {}), ("verify", {"kinds": "grep,compile"}), ("rollback", {})]

def fds(): return len(os.listdir("/proc/self/fd"))
def kids():
    out = set()
    for entry in os.listdir("/proc"):
        try:
            fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid():
            out.add(entry)
    return out
def settle():
    # paramiko's transport threads end shortly after their connection closes
    deadline = time.monotonic() + 60
    while threading.active_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.1)

lab = Lab(root)
api.run(root, "@lab", [("ping", {})])  # warm-up: agent uploaded, imports done
settle()
base = {"fds": fds(), "threads": threading.active_count()}
started = time.monotonic()
failures = corrupted = checked = runs = 0
failed = []
for _ in range(rounds):
    results = api.run(root, "@lab", ROUND)
    runs += len(results)
    failures += sum(1 for r in results if r.failed)
    failed += [f"{r.host} {r.task}: {r.msg}" for r in results if r.failed][:5]
    for key, sha in pristine.items():
        name, module = key.split(":")
        checked += 1
        text = lab.node(name).module_file(module).read_bytes()
        corrupted += hashlib.sha256(text).hexdigest() != sha
wall = time.monotonic() - started
settle()
print(json.dumps({"wall": wall, "runs": runs, "failures": failures, "failed": failed[:20],
                  "corrupted": corrupted, "checked": checked,
                  "fds": [base["fds"], fds()],
                  "threads": [base["threads"], threading.active_count()],
                  "children": len([k for k in kids() if k]),
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def agents_of(lab: Lab, deadline_s: float = 30) -> list[int]:
    """Agent processes still running from this lab's nodes' state dirs, after a generous wait for
    them to exit.

    Scoped to this lab: other test sessions on the machine run (and on purpose pause) their own
    agents."""
    mark = str(lab.dir).encode()
    deadline = time.monotonic() + deadline_s
    while True:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"fleetops-agent-" in cmdline and mark in cmdline:
                found.append(int(entry))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


# the driver's own limit: a longer soak (FLEETOPS_LOAD_ROUNDS=20) takes minutes
@pytest.mark.timeout(3000)
def test_32_nodes_patch_verify_rollback_rounds(big_lab):
    lab = big_lab
    nodes = lab.nodes()
    pristine = {
        f"{n.name}:{m}": record_sha256(site_packages(n.venv), m)
        for n in nodes
        for m in (GENERATOR, WORKER)
    }
    import json

    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(lab.root), str(ROUNDS), json.dumps(pristine)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    out, err = proc.communicate(timeout=3000)
    assert proc.returncode == 0, err[-3000:]
    figures = json.loads(out.strip().splitlines()[-1])
    leftover_agents = " ".join(map(str, agents_of(lab)))
    print(
        f"\nload: {len(nodes)} nodes x {ROUNDS} rounds of patch+verify+rollback = "
        f"{figures['runs']} task runs in {figures['wall']:.1f}s ({figures['wall'] / ROUNDS:.2f}s "
        f"a round) in one client process; {figures['failures']} failures; {figures['corrupted']} "
        f"corrupted of {figures['checked']} file checks; client peak RSS "
        f"{figures['peak_rss_mib']:.0f} MiB; fds {figures['fds'][0]}->{figures['fds'][1]}, "
        f"threads {figures['threads'][0]}->{figures['threads'][1]}, child processes left "
        f"{figures['children']}",
        file=sys.stderr,
    )
    assert figures["runs"] == len(nodes) * ROUNDS * 3
    assert figures["failures"] == 0 and figures["corrupted"] == 0, figures["failed"]
    assert figures["fds"][1] == figures["fds"][0], "file descriptors leaked"
    assert figures["threads"][1] <= figures["threads"][0], "threads leaked"
    assert figures["children"] == 0, "child processes leaked"
    assert leftover_agents.strip() == "", f"agents still running on nodes: {leftover_agents}"
