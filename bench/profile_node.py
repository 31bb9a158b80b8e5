"""The node side of fleetops' cost, on one lab node over one paramiko connection from this process:
node CPU of one SSH connection, of an exec of `true`, of each agent call, the agent's imports as the
node runs them, and locally the node python's start-up and the login shell's rc files.

Node CPU is the nodes' cgroup usage when bench/run.py measures by cgroup (it charges every session
process however it ends); without it, the listener's process tree from /proc (undercounts what
leaves the tree or is reaped after the reading).
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import time
from pathlib import Path

from profile_tools import importtime, module_times, src_root

EXEC_TRUE = "exec `true` (sshd session + login shell)"


class NodeProbe:
    """One lab node: its node CPU, a strict paramiko client to it, and one exec over a client."""

    def __init__(self, node, client_key: str, known_hosts: str, cgroups=None) -> None:
        self.node, self.client_key, self.known_hosts, self.cgroups = (
            node,
            client_key,
            known_hosts,
            cgroups,
        )
        self.pid = node.pid()
        self.clk = os.sysconf("SC_CLK_TCK")

    def _cpu_of(self, p: int) -> float:
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return sum(int(x) for x in f[11:15]) / self.clk

    def node_cpu(self) -> float:
        """The listener and everything under it, live (sessions on our open connection) or
        reaped."""
        if self.cgroups:
            return self.cgroups.usage("nodes")
        parent = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    parent[int(entry.name)] = int(
                        Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1]
                    )
                except (OSError, ValueError, IndexError):
                    pass
        total, frontier = self._cpu_of(self.pid), {self.pid}
        while frontier:
            frontier = {c for c, pp in parent.items() if pp in frontier}
            total += sum(self._cpu_of(c) for c in frontier)
        return total

    def settle(self, before: set[int], fallback: float) -> None:
        """Until the step's sshd session processes have ended (only those alive before it remain): a
        fixed sleep read the node CPU before a loaded machine had finished tearing the session
        down."""
        if self.cgroups:
            self.cgroups.settle("nodes", before, timeout=10)
        else:
            time.sleep(fallback)

    def procs(self) -> set[int]:
        return self.cgroups.procs("nodes") if self.cgroups else set()

    def client(self):
        import paramiko

        c = paramiko.SSHClient()
        c.load_host_keys(self.known_hosts)
        c.set_missing_host_key_policy(paramiko.RejectPolicy())
        c.connect(
            "127.0.0.1",
            port=self.node.port,
            username="root",
            key_filename=self.client_key,
            look_for_keys=False,
            allow_agent=False,
        )
        return c

    @staticmethod
    def run(c, cmd: str, stdin: bytes = b"") -> tuple[float, bytes]:
        t = time.perf_counter()
        chan = c.get_transport().open_session()
        chan.exec_command(cmd)
        if stdin:
            chan.sendall(stdin)
        chan.shutdown_write()
        out = b""
        while True:
            d = chan.recv(65536)
            if not d:
                break
            out += d
        chan.recv_exit_status()
        chan.close()
        return time.perf_counter() - t, out


def _connect_cost(probe: NodeProbe, reps: int) -> tuple[float, float]:
    """One connection, no exec: (median wall, mean node CPU)."""
    walls, cpus = [], []
    for _ in range(reps):
        before = probe.procs()
        c0, t = probe.node_cpu(), time.perf_counter()
        c = probe.client()
        walls.append(time.perf_counter() - t)
        c.close()
        probe.settle(before, 0.1)
        cpus.append(probe.node_cpu() - c0)
    return statistics.median(walls), statistics.mean(cpus)


def _agent_seconds(data: bytes) -> float | None:
    """The agent's own time from its last answer line, if it has one."""
    try:
        return json.loads(data.decode().strip().splitlines()[-1])["seconds"]
    except (ValueError, IndexError, KeyError):
        return None


def _exec_cost(
    probe: NodeProbe, c, cmd: str, stdin: bytes, reps: int
) -> tuple[float, float, float | None]:
    """One exec, `reps` times on one connection: (median wall, mean node CPU, median agent-reported
    time)."""
    walls, cpus, inside = [], [], []
    for _ in range(reps):
        before = probe.procs()
        c0 = probe.node_cpu()
        w, data = probe.run(c, cmd, stdin)
        probe.settle(before, 0.05)
        walls.append(w)
        cpus.append(probe.node_cpu() - c0)
        seconds = _agent_seconds(data) if stdin else None
        if seconds is not None:
            inside.append(seconds)
    return (
        statistics.median(walls),
        statistics.mean(cpus),
        statistics.median(inside) if inside else None,
    )


def _local_costs(python: str, reps: int) -> dict:
    """The node python's own start-up, and the login shell's rc files, which sshd's `bash -c` runs
    for every exec (bash sources ~/.bashrc when started by sshd): the same shell locally, with and
    without them."""
    out: dict = {}
    t = time.perf_counter()
    for _ in range(reps):
        subprocess.run([python, "-c", "pass"], check=True)
    out["python_startup"] = (time.perf_counter() - t) / reps
    home = os.path.expanduser("~")
    clean = {"HOME": home, "PATH": "/usr/bin:/bin"}
    for label, cmd in (("shell_rc", f". {home}/.bashrc"), ("shell_bare", "true")):
        t = time.perf_counter()
        for _ in range(reps):
            subprocess.run(["bash", "-c", cmd], env=clean, capture_output=True)
        out[label] = (time.perf_counter() - t) / reps
    return out


def node_costs(node, client_key: str, known_hosts: str, reps: int = 10, cgroups=None) -> dict:
    """Node CPU of one connection, one exec of `true`, and each agent call; all over paramiko from
    this process. `cgroups`: bench/cpuacct.py's CpuCgroups (the node's listener in its bench-nodes),
    or None."""
    from fleetops.plans.playbook import load_playbook
    from fleetops.wire.bundle import BOOTSTRAP, PYTHON_FLAGS, agent_bundle
    from remote_scripts.core.protocol import PROTOCOL

    probe = NodeProbe(node, client_key, known_hosts, cgroups)
    out: dict = {"connect": _connect_cost(probe, reps)}
    book = load_playbook(src_root() / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml")
    bundle = agent_bundle()
    # As fleetops runs it: through the verifying bootstrap (the zip refuses to run by its path).
    words = [
        "-c",
        BOOTSTRAP,
        str(node.state_dir),
        f"{node.state_dir}/bin/{bundle.filename}",
        bundle.sha256,
    ]
    agent = shlex.join([str(node.python), *PYTHON_FLAGS, *words])
    agent_importtime = (
        shlex.join([str(node.python), *PYTHON_FLAGS, "-X", "importtime", *words]) + " 2>&1"
    )
    base = {"protocol": PROTOCOL, "state_dir": str(node.state_dir), "operator": "bench@profile"}
    patch = {**base, "op": "patch", **book.patch_request(False)}
    verify = {**base, "op": "verify", **book.verify_request({"grep", "compile"})}
    cases = [
        (EXEC_TRUE, "true", b""),
        ("agent ping", agent, json.dumps({**base, "op": "ping"}).encode()),
        ("agent patch (steady state)", agent, json.dumps(patch).encode()),
        ("agent verify grep,compile", agent, json.dumps(verify).encode()),
    ]
    c = probe.client()
    try:
        for label, cmd, stdin in cases:
            out[label] = _exec_cost(probe, c, cmd, stdin, reps)
        # The agent's imports as the node runs them (over SSH: the node's environment, its bytecode
        # cache).
        for op, req in (("ping", {**base, "op": "ping"}), ("verify", verify)):
            _, data = probe.run(c, agent_importtime, json.dumps(req).encode())
            text = data.decode(errors="replace")
            total, per = importtime(text)
            out[f"agent_imports_{op}"] = (total, per, module_times(text, r"remote_scripts\.\S+"))
    finally:
        c.close()
    out.update(_local_costs(str(node.python), reps))
    return out
