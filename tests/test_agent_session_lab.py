"""Issue 16: one agent per host per invocation, against real lab sshd nodes (a 2-node lab of this module's own).

- the chain `patch verify gpu` runs in ONE exec per host: the tool's trace counters and the node's own sshd log
  (tests/sshd_evidence.py) agree, and every task of the chain was answered by the same agent process;
- the agent exits when its client is SIGKILLed mid-chain: no agent process left on the node, its lock released,
  no temp file;
- a node-side exception in one request answers that request with an error (no traceback for the user, the
  node's traceback in the evidence) and the same agent answers the next request;
- a request that imports the node's packages (verify's import check) runs in a child of the agent, so the
  agent itself stays lean and never holds a module a later request of the session may have patched."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, fab_json, make_project, run_fab
from faultkit import arm, disarm, hit_file, reset_node, temp_files, wait_for
from sshd_evidence import logs_for

from fleetops.lab import Lab
from fleetops.plans.inventory import load_inventory
from fleetops.wire.connector import COUNTERS, TransportError
from fleetops.wire.ssh import NodeConnection

pytestmark = pytest.mark.lab
BOTH = ["lab01", "lab02"]
TRACE_LINE = re.compile(r"^trace (\S+): (\d+) connections, (\d+) execs, (\d+) uploads$", re.M)


@pytest.fixture(scope="module")
def lab2(tmp_path_factory):
    lab = Lab(make_project(tmp_path_factory.mktemp("session") / "project"))
    lab.up(2, progress=lambda m: print(m, file=sys.stderr))
    yield lab
    lab.down(purge=True)


@pytest.fixture
def lab(lab2):
    for node in lab2.nodes():
        lab2.start_node(node)
        reset_node(lab2, node)
        disarm(node)
    return lab2


def agents_of(node) -> list[int]:  # noqa: ANN001 - fleetops.lab.Node
    """Pids of processes running our agent zip under this node's state dir, from /proc."""
    mark = f"{node.state_dir}/bin/fleetops-agent".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def lock_free(node) -> bool:  # noqa: ANN001
    return not (node.state_dir / "lock.json").exists()


def test_chain_patch_verify_gpu_is_one_exec_per_host(lab):
    run_fab(lab.root, "-H", "lab01,lab02", "ping", check=True)  # the agent zip is on both nodes
    logs = logs_for(lab, BOTH)
    proc = run_fab(lab.root, "-H", "lab01,lab02", "patch", "verify", "--kinds", "grep,compile", "gpu",
                   env={"FLEETOPS_TRACE": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    traced = {m[1]: {"connections": int(m[2]), "execs": int(m[3]), "uploads": int(m[4])}
              for m in TRACE_LINE.finditer(proc.stdout + proc.stderr)}
    assert sorted(traced) == BOTH, proc.stdout + proc.stderr
    for name in BOTH:
        wire = logs[name].settled()
        assert traced[name] == {"connections": 1, "execs": 1, "uploads": 0}, proc.stdout + proc.stderr
        assert wire.counts() == traced[name], f"{name}: trace {traced[name]}; {wire.describe()}"
    for node in lab.nodes():  # and the agent of the run is gone once the run is over
        wait_for(lambda node=node: not agents_of(node), f"{node.name}'s agent to exit after the run")


def test_one_agent_answers_every_request_and_survives_a_node_side_exception(lab):
    inventory = load_inventory(lab.root / "hosts")
    host = inventory.resolve("lab01")
    node = NodeConnection(host, inventory)
    before = dict(COUNTERS.per_host.get("lab01", {"execs": 0}))
    try:
        first, _ = node.call("ping", {})
        with pytest.raises(TransportError) as caught:
            node.call("verify", {})  # no "checks": the node's verify raises KeyError
        err = caught.value
        assert err.kind == "remote" and "KeyError" in str(err) and "lab01" in str(err), err
        assert "Traceback" not in str(err) and any("Traceback" in line for line in err.evidence.stderr_tail), \
            err.evidence
        again, evidence = node.call("ping", {})
        assert again["ok"] and again["pid"] == first["pid"], (first, again)
        assert agents_of(lab.node("lab01")) == [first["pid"]]
        gpu, _ = node.call("gpu", {})  # and a real op after it, same agent
        assert gpu.get("ok") is not False, gpu
        assert COUNTERS.per_host["lab01"]["execs"] - before.get("execs", 0) == 1
    finally:
        node.close()
    wait_for(lambda: not agents_of(lab.node("lab01")), "lab01's agent to exit when its client closed the session")


def test_importing_request_runs_in_a_child_and_the_agent_stays_lean(lab):
    inventory = load_inventory(lab.root / "hosts")
    node = NodeConnection(inventory.resolve("lab02"), inventory)
    try:
        first, _ = node.call("ping", {})
        pid = first["pid"]
        answer, _ = node.call("verify", {"checks": [{"kind": "import", "name": "json-imports",
                                                     "module": "speculators"}]})
        assert answer["ok"], answer
        maps = Path(f"/proc/{pid}/maps").read_text()  # the agent itself never loaded the package
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = int(re.search(r"VmRSS:\s+(\d+)", status)[1])
        assert "torch" not in maps and rss_kb < 100_000, (rss_kb, [m for m in maps.splitlines() if "torch" in m][:3])
        again, _ = node.call("ping", {})
        assert again["pid"] == pid
    finally:
        node.close()


def test_agent_exits_when_the_client_is_killed_mid_chain(lab):
    nodes = lab.nodes()
    for node in nodes:
        hit_file(node, "lock.acquired").unlink(missing_ok=True)
        arm(node, {"lock.acquired": {"action": "pause", "seconds": 120}})
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLEETOPS_NO_LIVE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "fabric", "-H", "lab01,lab02", "ping", "patch", "verify"],
                            cwd=lab.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: all(hit_file(n, "lock.acquired").exists() for n in nodes) or proc.poll() is not None,
                 "every node's agent to pause in patch, with the lock held")
        assert proc.poll() is None, proc.communicate()
        assert all(agents_of(n) for n in nodes)
        proc.send_signal(signal.SIGKILL)  # no Ctrl-C handling, no close: the client just vanishes
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    for node in nodes:
        wait_for(lambda node=node: not agents_of(node), f"{node.name}'s agent to exit after its client died")
        wait_for(lambda node=node: lock_free(node), f"{node.name}'s lock to be released")
        assert not temp_files(node), temp_files(node)
        disarm(node)
    rc, doc = fab_json(lab.root, "-H", "lab01,lab02", "patch")  # and the next run simply finishes the job
    assert rc == 0, doc
