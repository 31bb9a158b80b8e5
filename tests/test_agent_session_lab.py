"""One agent per host per invocation, against real lab sshd nodes (a 2-node lab of this module's
own).

- the chain `patch verify gpu` runs in ONE exec per host: the tool's trace counters and the node's
  own sshd log (tests/sshd_evidence.py) agree, and every task of the chain was answered by the same
  agent process;
- the agent exits when its client is SIGKILLed mid-chain: no agent process left on the node, its
  lock released, no temp file;
- a node-side exception in one request answers that request with an error (no traceback for the
  user, the node's traceback in the evidence) and the same agent answers the next request;
- a request that imports the node's packages (verify's import check) runs in a child of the agent,
  so the agent itself stays lean and never holds a module a later request of the session may have
  patched;
- pipelining (item 2): in `patch verify gpu`, verify's and gpu's requests go out before patch's
  answer is in (the client's trace of sends and answers); a failing patch leaves the verify sent
  ahead reported skipped as before, and nothing on the node changed; a step that writes is never
  sent ahead; an agent error in a request sent ahead answers only that request; a request sent ahead
  and overtaken by its step's own later request is asked again;
- a host whose chain is over has its agent closed at once, while a slower host still runs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GENERATOR, REPO, disconnect_all, fab_json, on_openssh, run_fab, sha256
from faultkit import agents_of, fresh_nodes, hit_file, temp_files, wait_for
from pausekit import NO_LIVE, fab_paused_at
from sshd_evidence import logs_for, traced_run

from fleetops import api
from fleetops.plans.inventory import load_inventory
from fleetops.results import Status
from fleetops.wire.connector import COUNTERS, TransportError
from fleetops.wire.ssh import NodeConnection

pytestmark = pytest.mark.lab
BOTH = ["lab01", "lab02"]


@pytest.fixture(scope="module")
def lab2(lab_factory):
    return lab_factory.shared(2, __name__)


@pytest.fixture
def lab(lab2):
    return fresh_nodes(lab2)


def lock_free(node) -> bool:
    return not (node.state_dir / "lock.json").exists()


def test_chain_patch_verify_gpu_is_one_exec_per_host(lab):
    openssh = on_openssh()
    if openssh:
        disconnect_all()  # the ping below logs in, and its master is the one the chain must use
    both_runs = logs_for(lab, BOTH)
    run_fab(lab.root, "-H", "lab01,lab02", "ping", check=True)  # the agent zip is on both nodes
    logs = logs_for(lab, BOTH)
    traced, output = traced_run(lab.root, BOTH, "patch", "verify", "--kinds", "grep,compile", "gpu")
    for name in BOTH:
        wire = logs[name].settled()
        # paramiko: a connection of its own; openssh: none, the ping's master carries the chain
        assert traced[name] == {"connections": 0 if openssh else 1, "execs": 1, "uploads": 0}, (
            output
        )
        assert wire.counts() == traced[name], f"{name}: trace {traced[name]}; {wire.describe()}"
        if openssh:
            assert len(both_runs[name].settled().accepted) == 1, (
                both_runs[name].settled().describe()
            )
    for node in lab.nodes():  # and the agent of the run is gone once the run is over
        wait_for(
            lambda node=node: not agents_of(node), f"{node.name}'s agent to exit after the run"
        )


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
        assert "Traceback" not in str(err) and any(
            "Traceback" in line for line in err.evidence.stderr_tail
        ), err.evidence
        again, evidence = node.call("ping", {})
        assert again["ok"] and again["pid"] == first["pid"], (first, again)
        assert agents_of(lab.node("lab01")) == [first["pid"]]
        gpu, _ = node.call("gpu", {})  # and a real op after it, same agent
        assert gpu.get("ok") is not False, gpu
        assert COUNTERS.per_host["lab01"]["execs"] - before.get("execs", 0) == 1
    finally:
        node.close()
    wait_for(
        lambda: not agents_of(lab.node("lab01")),
        "lab01's agent to exit when its client closed the session",
    )


def test_importing_request_runs_in_a_child_and_the_agent_stays_lean(lab):
    inventory = load_inventory(lab.root / "hosts")
    node = NodeConnection(inventory.resolve("lab02"), inventory)
    try:
        first, _ = node.call("ping", {})
        pid = first["pid"]
        answer, _ = node.call(
            "verify",
            {"checks": [{"kind": "import", "name": "json-imports", "module": "speculators"}]},
        )
        assert answer["ok"], answer
        maps = Path(f"/proc/{pid}/maps").read_text()  # the agent itself never loaded the package
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = int(re.search(r"VmRSS:\s+(\d+)", status)[1])
        assert "torch" not in maps and rss_kb < 100_000, (
            rss_kb,
            [m for m in maps.splitlines() if "torch" in m][:3],
        )
        again, _ = node.call("ping", {})
        assert again["pid"] == pid
    finally:
        node.close()


def test_agent_exits_when_the_client_is_killed_mid_chain(lab):
    nodes = lab.nodes()
    with fab_paused_at(
        lab.root,
        nodes,
        "lock.acquired",
        ["-H", "lab01,lab02", "ping", "patch", "verify"],
        seconds=120,
        env=NO_LIVE,
        what="every node's agent to pause in patch, with the lock held",
    ) as proc:
        assert all(agents_of(n) for n in nodes)
        proc.send_signal(signal.SIGKILL)  # no Ctrl-C handling, no close: the client just vanishes
        proc.communicate(timeout=60)
    for node in nodes:
        wait_for(
            lambda node=node: not agents_of(node),
            f"{node.name}'s agent to exit after its client died",
        )
        wait_for(lambda node=node: lock_free(node), f"{node.name}'s lock to be released")
        assert not temp_files(node), temp_files(node)
    # and the next run simply finishes the job
    rc, doc = fab_json(lab.root, "-H", "lab01,lab02", "patch")
    assert rc == 0, doc


# ---------------------------------------------------------------- pipelining
def wire_events(host: str, since: float) -> list[tuple[str, str]]:
    """(what, op) of the client's agent-session trace for host since `since`: sent / sent_ahead /
    answered / closed, in the order they happened."""
    return [
        (what, op) for at, name, what, op in list(COUNTERS.events) if name == host and at >= since
    ]


def by_name(results) -> dict[tuple[str, str], object]:
    return {(r.host, r.task): r for r in results}


def test_chain_sends_read_only_steps_before_the_answer_before_them(lab):
    since = time.monotonic()
    before = {n: dict(COUNTERS.per_host.get(n, {"execs": 0})) for n in BOTH}
    results = api.run(
        lab.root, BOTH, [("patch", {}), ("verify", {"kinds": "grep,compile"}), ("gpu", {})]
    )
    got = by_name(results)
    for name in BOTH:
        assert got[name, "patch"].status is Status.CHANGED, got[name, "patch"]
        assert got[name, "verify"].status is Status.OK and got[name, "gpu"].status is Status.OK, (
            results
        )
        assert COUNTERS.per_host[name]["execs"] - before[name].get("execs", 0) == 1
        events = wire_events(name, since)
        # Both read-only requests went out before patch's answer came back; every answer in request
        # order.
        assert events[:3] == [("sent", "patch"), ("sent_ahead", "verify"), ("sent_ahead", "gpu")], (
            events
        )
        assert [e for e in events if e[0] == "answered"] == [
            ("answered", "patch"),
            ("answered", "verify"),
            ("answered", "gpu"),
        ], events
        assert events[-1] == ("closed", ""), events  # and the chain's end closed the host's agent
    for node in lab.nodes():
        wait_for(
            lambda node=node: not agents_of(node), f"{node.name}'s agent to exit after its chain"
        )


def test_failing_patch_skips_the_verify_sent_ahead_and_changes_nothing(lab):
    node = lab.node("lab01")
    target = node.module_file(GENERATOR)
    target.write_text(
        target.read_text().replace(
            "            kv_cache_groups=kv_cache_groups,\n",
            "            kv_cache_groups=groups,  # local edit\n",
        )
    )
    before = sha256(target)
    since = time.monotonic()
    results = api.run(
        lab.root, "lab01", [("patch", {}), ("verify", {"kinds": "grep,compile"}), ("gpu", {})]
    )
    got = by_name(results)
    assert got["lab01", "patch"].status is Status.FAILED and "drifted" in str(
        got["lab01", "patch"].items
    ), results
    for task in ("verify", "gpu"):  # exactly what a chain without pipelining reports
        assert got["lab01", task].status is Status.SKIPPED, results
        assert got["lab01", task].msg == "skipped: patch failed on this host", results
    events = wire_events("lab01", since)
    assert ("sent_ahead", "verify") in events, events  # it did go ahead, and its answer was dropped
    assert sha256(target) == before
    assert not (node.state_dir / "backups").exists() and lock_free(node) and not temp_files(node)
    wait_for(lambda: not agents_of(node), "lab01's agent to exit after its chain")


def test_a_step_that_writes_is_never_sent_ahead(lab):
    since = time.monotonic()
    results = api.run(
        lab.root,
        "lab01",
        [
            ("ping", {}),
            ("patch", {}),
            ("verify", {"kinds": "grep"}),
            ("rollback", {}),
            ("facts", {}),
        ],
    )
    assert [(r.task, r.status) for r in results] == [
        ("ping", Status.OK),
        ("patch", Status.CHANGED),
        ("verify", Status.OK),
        ("rollback", Status.CHANGED),
        ("facts", Status.OK),
    ], results
    events = wire_events("lab01", since)
    sends = [e for e in events if e[0].startswith("sent")]
    assert sends == [
        ("sent", "ping"),
        ("sent", "patch"),
        ("sent_ahead", "verify"),
        ("sent", "rollback"),
        ("sent_ahead", "facts"),
    ], events
    # Each writing step went out only once every answer before it was in.
    for op in ("patch", "rollback"):
        earlier = events[: events.index(("sent", op))]
        assert sum(e[0] == "answered" for e in earlier) == sum(
            e[0].startswith("sent") for e in earlier
        ), events


def test_agent_error_in_a_request_sent_ahead_answers_only_that_request(lab):
    inventory = load_inventory(lab.root / "hosts")
    node = NodeConnection(inventory.resolve("lab01"), inventory)
    try:
        first, _ = node.call("ping", {})
        broken = node.submit("verify", {})  # no "checks": the node's verify raises KeyError
        after = node.submit("ping", {})
        facts, _ = node.call("facts", {})  # goes out first; both submitted requests right behind it
        assert facts.get("ok") is not False, facts
        with pytest.raises(TransportError) as caught:
            broken.result()
        assert caught.value.kind == "remote" and "KeyError" in str(caught.value), caught.value
        again, _ = after.result()
        assert again["pid"] == first["pid"], (first, again)
        # A request sent ahead and then overtaken by a later request of the step before it is asked
        # again: its early answer may predate that request's effect.
        since = time.monotonic()
        overtaken = node.submit("facts", {})
        node.call("ping", {})
        node.call("ping", {})
        answer, _ = overtaken.result()
        assert answer.get("ok") is not False, answer
        sends = [e for e in wire_events("lab01", since) if e[0].startswith("sent")]
        assert sends == [
            ("sent", "ping"),
            ("sent_ahead", "facts"),
            ("sent", "ping"),
            ("sent", "facts"),
        ], sends
        assert agents_of(lab.node("lab01")) == [first["pid"]]
    finally:
        node.close()


def test_a_finished_host_closes_its_agent_while_a_slow_host_still_runs(lab):
    slow, fast = lab.node("lab02"), lab.node("lab01")
    with fab_paused_at(
        lab.root,
        [slow],
        "lock.acquired",
        ["-H", "lab01,lab02", "patch", "verify", "--kinds", "grep"],
        seconds=300,
        env=NO_LIVE,
        timeout=180,
        what="lab02's agent to pause in patch",
    ) as proc:
        wait_for(
            lambda: not agents_of(fast) or proc.poll() is not None,
            "lab01's agent to exit once its chain is over",
            timeout=180,
        )
        assert proc.poll() is None, proc.communicate()
        assert agents_of(slow), "the slow host's agent is still at work"
        hit_file(slow, "lock.acquired").unlink()  # the slow host goes on
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out + err
    wait_for(lambda: not agents_of(slow), "lab02's agent to exit after the run")


def test_serial_batches_still_run_every_chain(lab):
    results = api.run(
        lab.root, BOTH, [("patch", {}), ("verify", {"kinds": "grep,compile"})], serial=1
    )
    assert [(r.host, r.task, r.status) for r in results] == [
        ("lab01", "patch", Status.CHANGED),
        ("lab01", "verify", Status.OK),
        ("lab02", "patch", Status.CHANGED),
        ("lab02", "verify", Status.OK),
    ], results
    for node in lab.nodes():
        wait_for(
            lambda node=node: not agents_of(node), f"{node.name}'s agent to exit after its chain"
        )


def test_connections_share_the_per_process_work_and_idle_quietly(lab, monkeypatch):
    """Per connection fleetops cloned Fabric's config (~0.4 ms), paramiko parsed the identity file
    once per key type (3 parses per host) and each transport thread woke every 0.1 s while the
    connection waited for the rest of the fleet (~0.5 ms per host per second)."""
    import paramiko

    from fleetops.wire import ssh

    loads: list[str] = []
    original = paramiko.SSHClient._key_from_filepath
    monkeypatch.setattr(
        paramiko.SSHClient,
        "_key_from_filepath",
        lambda self, *a, **kw: loads.append(a[0]) or original(self, *a, **kw),
    )
    inventory = load_inventory(lab.root / "hosts")
    nodes = [NodeConnection(inventory.resolve(name), inventory) for name in ("lab01", "lab02")]
    try:
        for node in nodes:
            node.call("ping", {})
        first, second = (node.cxn for node in nodes)
        assert first.config is second.config  # one Fabric config, read by every connection
        with pytest.raises(RuntimeError, match="shares one Fabric config"):
            # a write would race with readers: refused, never silently merged
            first.config.run.echo = True
        # the key came from fleetops' one load, not paramiko's per-connection parses
        assert loads == []
        for cxn in (first, second):
            assert cxn.client.get_transport().sock.gettimeout() == ssh.IDLE_CHECK_SECONDS
            # one call per packet
            assert cxn.client.get_transport().remote_cipher == "aes128-gcm@openssh.com"
        answer, _ = nodes[0].call("ping", {})  # and the quiet connection still answers at once
        assert answer["ok"]
    finally:
        for node in nodes:
            node.close()


def test_a_connection_that_used_sftp_closes_cleanly_and_at_once(lab):
    """Found by CI: closing hung the TCP connection up first, then Fabric closed the SFTP session on
    the dead socket and paramiko raised EOFError out of close() whenever its transport thread had
    not yet seen the hang-up (21 of 30 closes in a probe), so a run that had uploaded a file ended
    in a traceback. SFTP now says goodbye first; the hang-up still ends the node's session at once.
    Five rounds: the old order fails at least one of them all but about 0.2% of the time."""
    inventory = load_inventory(lab.root / "hosts")
    node = lab.nodes()[0]
    for round_ in range(5):
        conn = NodeConnection(inventory.resolve(node.name), inventory)
        target = node.state_dir / f"sftp-close-probe-{round_}.txt"
        try:
            conn.upload(str(target), b"written over SFTP\n")
            answer, _ = conn.call("ping", {})
            assert answer["ok"], answer
            # the session this test is about is open
            assert conn.cxn is not None and conn.cxn._sftp is not None
            transport = conn.cxn.client.get_transport()
        finally:
            conn.close()  # raised EOFError before the fix
        assert target.read_bytes() == b"written over SFTP\n"
        assert conn.cxn is None and not transport.is_active()
        conn.close()  # a second close is harmless


ORDER_PROBE = """
import os, sys, threading
events = []
def hook(event, args):
    if event == "import" and args[0] in ("rich", "fleetops.wire.bundle") and args[0] not in events:
        events.append(args[0])
sys.addaudithook(hook)
from fleetops import cli
from fleetops.wire import bundle
from CONNECTION_MODULE import CONNECTION_CLASS as Connection
opened, built = Connection.open, bundle._agent_bundle
def open_(self):
    events.append("open:" + threading.current_thread().name.split("-")[0])
    return opened(self)
def build():
    events.append("bundle:" + threading.current_thread().name.split("-")[0])
    return built()
Connection.open, bundle._agent_bundle = open_, build
from fleetops import state
prepare = state.RunState.prepare_while_connecting
def prepare_(self):
    events.append("prepare:" + threading.current_thread().name.split("-")[0])
    return prepare(self)
state.RunState.prepare_while_connecting = prepare_
real_exit = os._exit
def exit_(code):
    print("ORDER", ",".join(events), file=sys.stderr, flush=True)
    real_exit(code)
os._exit = exit_
sys.argv = ["fleet", "-H", "lab01", "ping"]
cli.main()
"""


def test_the_report_and_the_agent_bundle_load_while_the_first_connection_handshakes(lab):
    """Rich (~30 ms to import) and the agent bundle used to be loaded before the first connection
    started; now the hosts' chains are started first and the main thread loads both while they
    connect (0.895 -> 0.849 s at 50 ms RTT, median of 8 alternating runs)."""
    # the connector of the suite's transport: its open() is where a host's login starts
    module, name = (
        ("fleetops.wire.openssh", "OpenSSHConnection")
        if on_openssh()
        else ("fleetops.wire.ssh", "NodeConnection")
    )
    probe = ORDER_PROBE.replace("CONNECTION_MODULE", module).replace("CONNECTION_CLASS", name)
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=lab.root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("ORDER ")]
    order = line.split()[1].split(",")
    # not imported before the chains start
    assert order.index("prepare:MainThread") < order.index("rich"), order
    assert "open:ThreadPoolExecutor" in order, order
    # built by the main thread (once), not on a host's path
    assert "bundle:MainThread" in order, order
    assert "lab01" in proc.stdout and "1 ok" in proc.stdout, proc.stdout
