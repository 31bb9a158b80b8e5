"""What goes over the wire, proven by the lab nodes' own records (sshd log at LogLevel VERBOSE,
sftp-server log, /proc), not by the tool's counters: the FLEETOPS_TRACE text, hosts in parallel and
`--forks` / FLEETOPS_FORKS, FLEETOPS_SERIAL / FLEETOPS_LIMIT / FLEETOPS_PLAYBOOK / FLEETOPS_JSON
with plain `fab`, exit status 4 for an authentication failure and for a connect timeout, and a new
agent version uploaded and used."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import GENERATOR, REPO, disconnect_all, fab_json, on_openssh, run_fab, sha256
from sshd_evidence import TRACE_LINE, agent_zips, clear_agent_cache, logs_for, traced_run

pytestmark = pytest.mark.lab
BOTH = ["lab01", "lab02"]


def drift(lab, name: str) -> None:
    target = lab.node(name).module_file(GENERATOR)
    target.write_text(
        target.read_text().replace("kv_cache_groups=kv_cache_groups,", "kv_cache_groups=mine,")
    )


def bundle_of(code: Path) -> tuple[str, int]:
    """(file name, size) of the agent zip that the fleetops code under `code` builds, asked from
    that code."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from fleetops.wire.bundle import agent_bundle as a; b = a(); "
            "print(b.filename, len(b.data))",
        ],
        cwd=code,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(code)},
    ).stdout.split()
    return out[0], int(out[1])


# ---------------------------------------------------------------- FLEETOPS_TRACE text
def test_trace_text_matches_what_the_nodes_logged(lab):
    run_fab(lab.root, "-H", "lab02", "ping", check=True)  # lab02 has the agent already ...
    clear_agent_cache(lab.node("lab01"))  # ... lab01 must be sent it
    if on_openssh():
        disconnect_all()  # the traced run logs in afresh on either transport
    logs = logs_for(lab, BOTH)
    traced, _ = traced_run(lab.root, BOTH, "ping", "verify", "--kinds", "compile")
    for name in BOTH:
        wire = logs[name].settled()
        assert traced[name] == wire.counts(), (
            f"{name}: trace says {traced[name]}; {wire.describe()}"
        )
        assert list(wire.execs) == wire.accepted  # every exec on the one connection
    # One agent per host per invocation: the chain `ping verify` is one exec; on lab01 the first
    # exec found no agent (the bootstrap refused, nothing ran): upload, then the one agent of the
    # run.
    assert traced["lab01"] == {"connections": 1, "execs": 2, "uploads": 1}
    assert traced["lab02"] == {"connections": 1, "execs": 1, "uploads": 0}
    plain = run_fab(lab.root, "-H", "lab01", "ping")
    # only when asked
    assert plain.returncode == 0 and not TRACE_LINE.search(plain.stdout + plain.stderr)


# ---------------------------------------------------------------- hosts in parallel, --forks,
# FLEETOPS_FORKS
def _agent_alive(pid: int, node) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"fleetops-agent-" in cmdline and str(node.state_dir).encode() in cmdline


def _hit_pid(hit: Path) -> int | None:
    try:
        return int(hit.read_text().strip())
    except (OSError, ValueError):
        return None  # not reached yet, or being written


def watch_patch(lab, argv: list[str], env: dict | None = None, seconds: float = 5) -> dict:
    """Run a patch over lab01,lab02 with each node's agent held `seconds` inside its lock (failpoint
    sleep), and poll /proc meanwhile: which nodes' agents were alive at the same poll, and whether
    the other node had even accepted a connection while one node's agent was alive."""
    nodes = {n: lab.node(n) for n in BOTH}
    hits = {n: nodes[n].faults_dir / "failpoint-lock.acquired.hit" for n in BOTH}
    for n in BOTH:
        hits[n].unlink(missing_ok=True)
        (nodes[n].faults_dir / "failpoints.json").write_text(
            json.dumps({"lock.acquired": {"action": "sleep", "seconds": seconds}})
        )
    if on_openssh():
        disconnect_all()  # each run logs in afresh: its connections are what the nodes count
    logs = logs_for(lab, BOTH)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", *argv],
        cwd=lab.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", **(env or {})},
    )
    seen: set[str] = set()
    together = 0  # polls at which both agents were alive
    # node alone alive -> the other's accepted connections
    other_connected_while_alone: dict[str, int] = {}
    deadline = started + 180
    try:
        while proc.poll() is None:
            assert time.monotonic() < deadline, "the run did not finish in 180 s"
            # Working = the agent is alive AND holds its node's lock. With one agent per host per
            # invocation a host whose chain is done keeps an idle agent until the run closes its
            # connection.
            alive = {
                n
                for n in BOTH
                if (pid := _hit_pid(hits[n]))
                and _agent_alive(pid, nodes[n])
                and (nodes[n].state_dir / "lock.json").exists()
            }
            seen |= alive
            if len(alive) == 2:
                together += 1
            elif len(alive) == 1:
                (alone,) = alive
                other = next(n for n in BOTH if n != alone)
                other_connected_while_alone[alone] = max(
                    other_connected_while_alone.get(alone, 0), len(logs[other].read().accepted)
                )
            time.sleep(0.05)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        for n in BOTH:
            (nodes[n].faults_dir / "failpoints.json").unlink(missing_ok=True)
    took = time.monotonic() - started
    assert proc.returncode == 0, out + err
    wires = {n: logs[n].settled() for n in BOTH}
    for n in BOTH:
        assert wires[n].counts()["connections"] == 1, wires[n].describe()
    return {
        "seen": seen,
        "together": together,
        "alone": other_connected_while_alone,
        "took": round(took, 1),
    }


def test_hosts_run_in_parallel_by_default_and_one_at_a_time_with_forks_1(lab):
    # agents in place: only the held step differs
    run_fab(lab.root, "-H", "lab01,lab02", "ping", check=True)
    fab = ["fabric", "-H", "lab01,lab02", "patch", "--json"]

    parallel = watch_patch(lab, fab)
    assert parallel["seen"] == set(BOTH)
    assert parallel["together"] > 0, (
        f"the two nodes' agents were never alive at the same time: {parallel}"
    )

    for how, argv, env in [
        ("FLEETOPS_FORKS=1", fab, {"FLEETOPS_FORKS": "1"}),
        (
            "fleet --forks 1",
            ["fleetops.cli", "-H", "lab01,lab02", "--forks", "1", "patch", "--json"],
            None,
        ),
    ]:
        serial = watch_patch(lab, argv, env)
        # Both agents were seen (the watch works), never at the same poll, and while one node worked
        # the other's sshd had not even accepted its connection.
        assert serial["seen"] == set(BOTH), f"{how}: {serial}"
        assert serial["together"] == 0, f"{how}: both nodes' agents alive at once: {serial}"
        # The node that went first worked while the other had no connection; the second found the
        # first's connection already made (and done).
        assert sorted(serial["alone"].values()) == [0, 1], f"{how}: {serial}"
        assert serial["took"] >= 2 * 5, (
            f"{how}: two 5 s holds one after the other took {serial['took']:.1f} s"
        )
    print(
        f"wall clock: default forks {parallel['took']:.1f} s, "
        f"forks 1 {serial['took']:.1f} s (5 s hold per node)"
    )


# ---------------------------------------------------------------- FLEETOPS_SERIAL / _LIMIT /
# _PLAYBOOK / _JSON
def test_environment_variables_steer_plain_fab_and_the_nodes_confirm_it(lab, tmp_path):
    # FLEETOPS_LIMIT (and FLEETOPS_JSON instead of --json): lab01 is never even connected to.
    if on_openssh():
        disconnect_all()  # the runs below log in afresh on either transport
    logs = logs_for(lab, BOTH)
    proc = run_fab(
        lab.root,
        "-H",
        "lab01,lab02",
        "ping",
        env={"FLEETOPS_LIMIT": "lab0[2]", "FLEETOPS_JSON": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert [r["host"] for r in doc["results"]] == ["lab02"]
    assert logs["lab01"].settled().tcp == [] and logs["lab01"].read().accepted == []
    assert logs["lab02"].settled().counts()["connections"] == 1

    # FLEETOPS_SERIAL=1: lab01 fails in batch 1, so lab02 (batch 2) is skipped and never connected
    # to.
    drift(lab, "lab01")
    before = sha256(lab.node("lab02").module_file(GENERATOR))
    for one in logs.values():
        one.mark()
    rc, doc = fab_json(lab.root, "-H", "lab01,lab02", "patch", env={"FLEETOPS_SERIAL": "1"})
    assert rc == 1, doc
    by = {r["host"]: r for r in doc["results"]}
    assert by["lab01"]["status"] == "failed"
    assert (
        by["lab02"]["status"] == "skipped"
        and "roll-out stopped after batch 1" in by["lab02"]["msg"]
    )
    assert logs["lab02"].settled().tcp == [], logs["lab02"].read().describe()
    assert logs["lab01"].read().counts()["connections"] == 1
    assert sha256(lab.node("lab02").module_file(GENERATOR)) == before

    # FLEETOPS_PLAYBOOK: the run uses that playbook (its one check, by its name), not the project
    # default.
    book = tmp_path / "env-book.yaml"
    book.write_text(
        "name: env-book\nverify:\n  - name: env-book-only-check\n    kind: grep\n"
        f"    module: {GENERATOR}\n    pattern: 'class VllmHiddenStatesGenerator'\n"
    )
    rc, doc = fab_json(lab.root, "-H", "lab02", "verify", env={"FLEETOPS_PLAYBOOK": str(book)})
    assert rc == 0, doc
    labels = [i["label"] for r in doc["results"] for i in r["items"]]
    assert labels == ["env-book-only-check [grep]"], labels
    assert doc["results"][0]["data"]["playbook"] == "env-book"


# ---------------------------------------------------------------- exit status 4
def test_auth_failure_exits_4_and_the_node_saw_the_key_refused(lab, tmp_path):
    node = lab.node("lab01")
    stranger = tmp_path / "stranger_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    extra = lab.root / "hosts" / "stranger.yaml"
    extra.write_text(
        f"hosts:\n  stranger:\n    address: 127.0.0.1\n    port: {node.port}\n    user: "
        f"{lab.user}\n    identity_file: {stranger}\n    known_hosts: {lab.known_hosts}\n    "
        f"python: {node.python}\n    state_dir: {node.state_dir}\n    connect_timeout: 10\n"
    )
    logs = logs_for(lab, ["lab01"])
    try:
        rc, doc = fab_json(lab.root, "-H", "stranger,lab02", "ping")
    finally:
        extra.unlink()
    assert rc == 4, doc
    by = {r["host"]: r for r in doc["results"]}
    assert (
        by["stranger"]["status"] == "unreachable" and by["stranger"]["data"]["error_kind"] == "auth"
    )
    assert (
        "authentication failed" in by["stranger"]["msg"]
        and f"127.0.0.1:{node.port}" in by["stranger"]["msg"]
    )
    assert by["lab02"]["status"] == "ok"  # the other host is not affected
    assert doc["failed_hosts"] == ["stranger"]
    wire = logs["lab01"].settled()
    # The node saw the TCP connection and accepted no key: the failure was authentication, nothing
    # else.
    assert len(wire.tcp) == 1 and wire.accepted == [] and wire.execs == {}, wire.describe()


class SilentServer:
    """A local TCP listener that accepts connections and never says a word (an SSH banner never
    comes)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.held.append(conn)
            except OSError:
                continue

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for s in [*self.held, self.sock]:
            s.close()


class FullBacklog:
    """A listener that never accepts, its accept queue filled: the kernel drops further SYNs, so a
    connect gets no answer at all (a TCP-level timeout, like a firewalled host), all on loopback."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(0)
        self.port = self.sock.getsockname()[1]
        self.fillers: list[socket.socket] = []
        for _ in range(16):
            filler = socket.socket()
            filler.settimeout(1)
            self.fillers.append(filler)
            try:
                filler.connect(("127.0.0.1", self.port))
            except TimeoutError:
                return  # the queue is full: this SYN went unanswered
        raise AssertionError("could not fill the accept queue of a listen(0) socket")

    def close(self) -> None:
        for s in [*self.fillers, self.sock]:
            s.close()


@pytest.mark.parametrize("kind", ["silent-server", "full-backlog"])
def test_connect_timeout_exits_4_naming_host_and_cause(lab, kind):
    server = SilentServer() if kind == "silent-server" else FullBacklog()
    extra = lab.root / "hosts" / "blackhole.yaml"
    extra.write_text(
        f"hosts:\n  blackhole:\n    address: 127.0.0.1\n    port: {server.port}\n    "
        "connect_timeout: 3\n    identity_file: "
        f"{lab.client_key}\n    known_hosts: {lab.known_hosts}\n"
    )
    try:
        started = time.monotonic()
        rc, doc = fab_json(
            lab.root, "-H", "blackhole,lab01", "ping", "verify", "--kinds", "compile"
        )
        took = time.monotonic() - started
    finally:
        extra.unlink()
        server.close()
    assert rc == 4, doc
    by = {(r["host"], r["task"]): r for r in doc["results"]}
    msg = by[("blackhole", "ping")]["msg"]
    assert by[("blackhole", "ping")]["status"] == "unreachable", msg
    assert f"127.0.0.1:{server.port}" in msg, msg
    assert by[("blackhole", "verify")]["status"] == "skipped"
    assert by[("lab01", "ping")]["status"] == "ok"
    assert doc["failed_hosts"] == ["blackhole"]
    if kind == "full-backlog":
        assert "timed out after 3s" in msg, msg
    assert took < 120  # bounded by connect_timeout, not hanging (generous: a loaded 2-core machine)


def test_silent_server_is_reported_as_a_timeout_without_traceback(lab):
    server = SilentServer()
    extra = lab.root / "hosts" / "blackhole.yaml"
    extra.write_text(
        f"hosts:\n  blackhole:\n    address: 127.0.0.1\n    port: {server.port}\n    "
        "connect_timeout: 3\n    identity_file: "
        f"{lab.client_key}\n    known_hosts: {lab.known_hosts}\n"
    )
    try:
        proc = run_fab(lab.root, "-H", "blackhole", "ping", "--json")
    finally:
        extra.unlink()
        server.close()
    assert proc.returncode == 4, proc.stdout + proc.stderr
    msg = json.loads(proc.stdout)["results"][0]["msg"]
    assert "Traceback" not in proc.stderr, proc.stderr
    # the cause: no SSH banner in time
    assert "timed out" in msg and "3s" in msg and "SSH" in msg, msg


# ---------------------------------------------------------------- a new agent version
def test_a_new_agent_version_is_uploaded_once_and_used(lab, tmp_path):
    node = lab.node("lab01")
    code = tmp_path / "v2"
    for name in ("fleetops", "remote_scripts"):
        # fleetops/agent stays the link to remote_scripts/
        shutil.copytree(
            REPO / name, code / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    agent = code / "remote_scripts" / "core" / "agent.py"
    old_text = '"version": sys.version.split()[0]'
    assert old_text in agent.read_text()
    agent.write_text(
        agent.read_text().replace(old_text, '"version": sys.version.split()[0] + "+wire-test-v2"')
    )
    old_name, old_size = bundle_of(REPO)
    new_name, new_size = bundle_of(code)
    assert old_name != new_name  # content-addressed: other code, other name

    openssh = on_openssh()
    if openssh:
        disconnect_all()  # the ping below logs in; its master carries the two runs after it
    run_fab(lab.root, "-H", "lab01", "ping", check=True)  # the current version is on the node
    # paramiko: each run a connection of its own; openssh: none, the ping's master is still up
    connections = 0 if openssh else 1
    before = agent_zips(node)
    assert old_name in before and new_name not in before

    logs = logs_for(lab, ["lab01"])
    rc, doc = fab_json(lab.root, "-H", "lab01", "ping", env={"PYTHONPATH": str(code)})
    assert rc == 0, doc
    assert doc["results"][0]["data"]["version"].endswith("+wire-test-v2")  # the new agent answered
    wire = logs["lab01"].settled()
    assert (
        wire.counts()
        == {"connections": connections, "execs": 2, "uploads": 1}
        == doc["counters"]["lab01"]
    ), wire.describe()
    assert wire.uploads == [f"{node.state_dir}/bin/{new_name}"] and wire.upload_bytes == [new_size]
    after = agent_zips(node)
    assert after[old_name] == before[old_name]  # the old version is left alone
    shipped = node.state_dir / "bin" / new_name
    assert sha256(shipped).startswith(new_name.removeprefix("fleetops-agent-").removesuffix(".pyz"))

    # Back to the current code: its version is still there, so nothing is sent, and it is what
    # answers.
    logs["lab01"].mark()
    rc, doc = fab_json(lab.root, "-H", "lab01", "ping")
    assert rc == 0, doc
    assert not doc["results"][0]["data"]["version"].endswith("+wire-test-v2")
    assert (
        logs["lab01"].settled().counts()
        == {"connections": connections, "execs": 1, "uploads": 0}
        == doc["counters"]["lab01"]
    )
    assert agent_zips(node) == after
    assert old_size > 0
