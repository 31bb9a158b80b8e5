"""One measured run of one tool: the command line, the quiet gate and the noisy re-runs, and what is
read around it (wall time, peak RSS, client / node / proxy CPU, machine-wide busy CPU, and per host
the SSH connections, execs, sftp sessions and bytes from the nodes' sshd logs); and the helpers that
read a list of runs back (medians, per-host ranges, the rows of one scenario).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import cpuacct
from benchpaths import BENCH, FAB, LABEL, PATCH_VERIFY, SNAPSHOT, TOOLS, WORK, say
from cpuacct import TreeSampler, _parents, busy_cpu, live_tree_cpu, proc_cpu, reap_adopted, spawn
from labhosts import BenchHost, Env


@dataclass
class Run:
    tool: str
    n: int
    rtt: float
    kind: str  # warmup / probe / rep
    rc: int
    wall: float
    maxrss_kb: int
    client_cpu: float
    node_cpu: float
    proxy_cpu: float
    busy_cpu: float
    conns: list = field(default_factory=list)  # per host
    execs: list = field(default_factory=list)
    sftp: list = field(default_factory=list)
    bytes: list = field(default_factory=list)
    tree_rss_kb: int = 0
    tree_pss_kb: int = 0
    tree_procs: int = 0
    trace: dict | None = None
    log: str = ""
    noisy: bool = False  # others' load stayed over the limit even after the retries
    window_cpu: float = 0.0  # tool + nodes + proxy (+ this process) CPU over `span`
    transferred: list = field(default_factory=list)  # sshd 'Transferred:' lines per host
    method: str = "per-process"  # how client / node / proxy CPU were measured (CpuCgroups.method)
    span: float = 0.0  # seconds over which busy_cpu was taken (cgroup: start to the nodes' settle)
    settled: bool = True  # the nodes' sessions had all ended when node CPU was read

    @property
    def others_cpu(self) -> float:
        """Machine-wide busy CPU (/proc/stat) less client, nodes and proxy over the same span: the
        cross-check (the kernel's loopback networking outside any process, this bench process, other
        users)."""
        return self.busy_cpu - self.client_cpu - self.node_cpu - self.proxy_cpu

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def foreign_cpu(self) -> float:
        """CPU used on this machine during the run by anything but the tool, the nodes and the
        proxy."""
        return max(0.0, self.busy_cpu - self.window_cpu)


class Runner:
    def __init__(
        self,
        env: Env,
        peers: Path,
        logs: Path,
        timeout: float,
        quiet_cores: float = 0.3,
        noisy_cores: float = 0.5,
        max_wait: float = 90,
        retries: int = 3,
    ) -> None:
        self.env, self.peers, self.logs, self.timeout = env, peers, logs, timeout
        self.quiet_cores, self.noisy_cores, self.max_wait, self.retries = (
            quiet_cores,
            noisy_cores,
            max_wait,
            retries,
        )
        self.waited = 0.0
        self.counter = 0
        # every lab sshd (bench-nodes holds them all)
        self.listeners_all = [node.pid() for node in env.nodes]
        self.base_env = {
            k: v for k, v in os.environ.items() if not k.startswith(("FLEETOPS_", "ANSIBLE_"))
        }
        self.base_env["PYTHONPATH"] = os.pathsep.join(
            [str(SNAPSHOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        )
        self.base_env.update(
            {
                "FLEETOPS_NO_LIVE": "1",
                "COLUMNS": "200",
                "TERM": "dumb",
                "ANSIBLE_HOME": str(WORK / "ansible-home"),
                "ANSIBLE_NOCOLOR": "1",
                "PYINFRA_PROGRESS": "0",
            }
        )

    def quiet(self) -> float:
        """Wait (up to max_wait s) until this machine is idle apart from us: others' test runs share
        its cores. Returns the load (cores busy) seen last."""
        deadline = time.monotonic() + self.max_wait
        while True:
            b0 = busy_cpu()
            time.sleep(0.5)
            load = (busy_cpu() - b0) / 0.5
            if load <= self.quiet_cores or time.monotonic() > deadline:
                if load > self.quiet_cores:
                    say(
                        f"  (machine still busy: {load:.2f} cores "
                        f"after {self.max_wait:.0f} s; going on)"
                    )
                return load
            self.waited += 0.5

    def measured(self, tool: str, hosts: list, rtt: float, work: Path, kind: str) -> list:
        """One run after a quiet gate; repeated (up to `retries` times) while others' load during it
        was over noisy_cores. Returns every attempt; the last is the one that counts, earlier ones
        are kind 'noisy'."""
        attempts = []
        for attempt in range(self.retries + 1):
            self.quiet()
            r = self.run(tool, hosts, rtt, work, kind)
            attempts.append(r)
            span = r.span or r.wall
            if span <= 0 or r.foreign_cpu / span <= self.noisy_cores or attempt == self.retries:
                if span > 0 and r.foreign_cpu / span > self.noisy_cores:
                    r.noisy = True
                return attempts
            say(f"  (noisy: others used {r.foreign_cpu / span:.2f} cores during {tool}; run again)")
            r.kind = "noisy"
        return attempts

    def command(self, tool: str, n: int, work: Path, traced: bool) -> tuple[list[str], dict, Path]:
        env = dict(self.base_env)
        cwd = self.env.project
        if tool == "fo_pv":
            cmd = [FAB, *PATCH_VERIFY] + (["--json"] if traced else [])
        elif tool == "fo_check":
            cmd = [FAB, "-H", "@bench", "patch", "--check"] + (["--json"] if traced else [])
        elif tool == "fo_ping1":
            cmd = [FAB, "-H", "bench01", "ping"]
        elif tool == "fo_list":
            cmd = [FAB, "--list"]
        elif tool == "fo_deep":  # the deep verify (vLLM import, callsites, probe) on one node
            cmd = [FAB, "-H", "bench01", "verify"]
        elif tool == "ansible":
            cmd = [
                str(self.peers / "bin" / "ansible-playbook"),
                "-i",
                str(work / "ansible_inventory.json"),
                "-f",
                str(n),
                str(work / "ansible_playbook.yml"),
            ]
            env["ANSIBLE_CONFIG"] = str(work / "ansible.cfg")
            cwd = work
        elif tool == "pyinfra":
            cmd = [
                str(self.peers / "bin" / "pyinfra"),
                "--parallel",
                str(n),
                "-y",
                str(work / "pyinfra_inventory.py"),
                str(BENCH / "peer_pyinfra_deploy.py"),
            ]
            env["BENCH_SPEC"] = str(self.env.spec_file)
            cwd = work
        elif tool == "fabric":
            cmd = [
                sys.executable,
                str(BENCH / "peer_fabric.py"),
                str(work / "fabric_hosts.json"),
                str(self.env.spec_file),
            ]
            cwd = work
        elif tool == "floor":
            cmd = [sys.executable, str(BENCH / "floor.py"), str(work / "fabric_hosts.json")]
            cwd = work
        else:
            raise ValueError(tool)
        if traced and tool.startswith("fo_"):
            env["FLEETOPS_TRACE"] = "1"
        return cmd, env, cwd

    def run(self, tool: str, hosts: list[BenchHost], rtt: float, work: Path, kind: str) -> Run:
        n = len(hosts)
        probe = kind == "probe"
        cmd, env, cwd = self.command(tool, n, work, traced=probe)
        control_dir = None
        # a fresh ControlPath dir per run: every run starts cold, as the others do
        if tool == "ansible":
            control_dir = tempfile.mkdtemp(prefix="fob-cp-", dir="/tmp")
            env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = control_dir
        self.counter += 1
        out_path = self.logs / f"{self.counter:04d}-{tool}-n{n}-rtt{rtt:g}-{kind}.out"
        offsets = [h.log.stat().st_size for h in hosts]
        listeners = [h.listener_pid for h in hosts]
        proxy_pid = self.env.proxy.pid if (self.env.proxy and rtt) else None
        cg = cpuacct.CGROUPS
        if cg:
            cg0 = {role: cg.usage(role) for role in cg.ROLES}
        node0 = sum(proc_cpu(p) for p in listeners)
        proxy0 = proc_cpu(proxy_pid, False) if proxy_pid else 0.0
        busy0, own0 = busy_cpu(), sum(os.times()[:2])
        with open(out_path, "wb") as out, open(out_path.with_suffix(".err"), "wb") as err:
            started = time.perf_counter()
            proc = spawn(
                cmd,
                "client",
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            sampler = None
            if probe:
                exclude = {self.env.proxy.pid} if self.env.proxy else set()
                sampler = TreeSampler(proc.pid, os.getpid(), exclude)
                sampler.start()
            timer = threading.Timer(self.timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
            # an interrupted bench must not wait out a pending kill timer at exit
            timer.daemon = True
            timer.start()
            try:
                _, status, ru = os.wait4(proc.pid, 0)
            except KeyboardInterrupt:
                os.killpg(proc.pid, signal.SIGKILL)
                raise
            finally:
                timer.cancel()
            wall = time.perf_counter() - started
            proc.returncode = os.waitstatus_to_exitcode(status)
        client_cpu, maxrss = ru.ru_utime + ru.ru_stime, ru.ru_maxrss
        # others' load is judged over the tool's own lifetime, less this process (the sampler)
        busy = busy_cpu() - busy0 - (sum(os.times()[:2]) - own0)
        node_mid = sum(proc_cpu(p) for p in listeners) - node0 + live_tree_cpu(listeners)
        proxy_mid = (proc_cpu(proxy_pid, False) - proxy0) if proxy_pid else 0.0
        # plus what is still alive of the tool (Ansible's ssh masters, adopted by us)
        tool_cpu = client_cpu + live_tree_cpu([os.getpid()], {proxy_pid} if proxy_pid else set())
        if control_dir:
            socks = [p for p in Path(control_dir).iterdir()]
            for sock in socks:
                subprocess.run(
                    ["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "bench-master"],
                    capture_output=True,
                    timeout=10,
                )
            exclude = {self.env.proxy.pid} if self.env.proxy else set()
            cpu, rss, _ = reap_adopted(exclude, expect=len(socks))
            client_cpu += cpu
            maxrss = max(maxrss, rss)
            shutil.rmtree(control_dir, ignore_errors=True)
        if sampler:
            sampler.stop.set()
            sampler.join()
        # Let the sshd listeners reap their session processes: the node CPU of a session (an agent
        # that exits when its client closes, the commands) reaches the listener only once the
        # session is reaped, which on a loaded machine takes far longer than a fixed 0.15 s: a fixed
        # wait undercounted it.
        if cg:
            # Every process of the lab is in bench-nodes (the sessions inherit the listeners'
            # cgroup), so the nodes are done when only the listeners are left; the tool's stragglers
            # are in bench-client.
            settled = cg.settle("nodes", set(self.listeners_all)) & cg.settle(
                "client", set(), timeout=5
            )
            used = {role: cg.usage(role) - cg0[role] for role in cg.ROLES}
            busy_all = busy_cpu() - busy0
            span = time.perf_counter() - started
            r = Run(
                tool,
                n,
                rtt,
                kind,
                proc.returncode,
                wall,
                maxrss,
                used["client"],
                used["nodes"],
                used["proxy"] if proxy_pid else 0.0,
                busy_all,
                log=str(out_path),
            )
            r.method, r.span, r.settled = cg.method, span, settled
            # Others' load: what neither the tool, the nodes, the proxy nor this process (the
            # probe's sampler, the settle polling) used.
            r.window_cpu = sum(used.values()) + (sum(os.times()[:2]) - own0)
        else:
            settle = time.monotonic() + 20
            while time.monotonic() < settle and set(_parents().values()) & set(listeners):
                time.sleep(0.05)
            node_cpu = sum(proc_cpu(p) for p in listeners) - node0
            proxy_cpu = (proc_cpu(proxy_pid, False) - proxy0) if proxy_pid else 0.0
            r = Run(
                tool,
                n,
                rtt,
                kind,
                proc.returncode,
                wall,
                maxrss,
                client_cpu,
                node_cpu,
                proxy_cpu,
                busy,
                log=str(out_path),
            )
            r.window_cpu = tool_cpu + node_mid + proxy_mid
            r.span = wall
        for h, off in zip(hosts, offsets):
            with open(h.log, "rb") as f:
                f.seek(off)
                text = f.read().decode("utf-8", "replace")
            r.conns.append(text.count("Accepted publickey"))
            r.execs.append(text.count("Starting session: command"))
            r.sftp.append(text.count("Starting session: subsystem"))
            moved = re.findall(r"Transferred: sent (\d+), received (\d+)", text)
            r.transferred.append(len(moved))
            r.bytes.append(sum(int(a) + int(b) for a, b in moved))
        if sampler:
            r.tree_rss_kb, r.tree_pss_kb, r.tree_procs = (
                sampler.peak_rss,
                sampler.peak_pss,
                sampler.peak_procs,
            )
        if probe and tool.startswith("fo_"):
            try:
                r.trace = json.loads(out_path.read_text())
            except ValueError:
                r.trace = None
        if not r.ok:
            tail = (
                out_path.read_text(errors="replace")[-1500:]
                + out_path.with_suffix(".err").read_text(errors="replace")[-1500:]
            )
            say(f"  !! {tool} n={n} rtt={rtt:g} {kind} exited {r.rc}; log {out_path}\n{tail}")
        return r


# ------------------------------------------------------------------ reading runs
def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def per_host(values_runs: list[list[int]]) -> str:
    """Per-host counts over runs: '1' when every host in every run had 1, else 'min–max'."""
    flat = [v for run in values_runs for v in run]
    if not flat:
        return "-"
    lo, hi = min(flat), max(flat)
    return f"{lo}" if lo == hi else f"{lo}–{hi}"


def cpu_methods(runs: list[Run]) -> str:
    """How these runs' CPU was measured, for the text (one method per bench run, in practice)."""
    methods = sorted({r.method for r in runs if r.kind in ("rep", "probe")}) or ["per-process"]
    return " and ".join(
        m
        if m.startswith("cgroup")
        else "per process (the listeners' reaped children in /proc: an undercount)"
        for m in methods
    )


def rows_for(runs: list[Run], tool: str, n: int, rtt: float) -> list[Run]:
    return [r for r in runs if r.kind == "rep" and r.tool == tool and r.n == n and r.rtt == rtt]


def scenarios(runs: list[Run]) -> list[tuple[float, int]]:
    """(RTT, N) of every timed scenario, in table order."""
    return sorted({(r.rtt, r.n) for r in runs if r.kind == "rep" and r.tool in LABEL})


def medians_of(runs: list[Run]) -> dict:
    """(tool, N, RTT) -> median wall of its timed runs."""
    medians: dict = {}
    for rtt, n in scenarios(runs):
        for tool, _ in TOOLS:
            rs = rows_for(runs, tool, n, rtt)
            if rs:
                medians[(tool, n, rtt)] = med([r.wall for r in rs])
    return medians
