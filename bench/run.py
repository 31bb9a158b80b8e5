#!/usr/bin/env python3
"""fleetops against Ansible, pyinfra and a hand-written Fabric ThreadingGroup script, same lab, one run.

    .venv/bin/python bench/run.py [--sizes 1,8,32] [--rtts 0,50] [--reps 3] [--out bench/RESULTS.md]

Run by hand, not by CI (see bench/README.md). Stdlib + fleetops' lab on the client side; Ansible and pyinfra
live in their own venv under bench/.work/peers (made here with pip on first use, never in the system python).

What it does, in order:
  1. a throwaway project under bench/.work/project (symlinks to fabfile.py, fabric.yaml, playbooks/; its own
     hosts/ and .lab/), max(sizes) lab nodes (real sshd on 127.0.0.1), every node patched once (steady state),
     the two diff files copied to <state_dir>/bench-diffs on every node (so no tool pays an upload);
  2. calibration of the delay proxy (bench/delay_proxy.py): an echo server behind it, then `ssh true`;
  3. for each RTT, for each N: one warm-up and one probe run per tool (the probe samples the client process
     tree's memory; fleetops' probe runs traced with --json), then --reps repetitions, tools alternating
     (fleetops patch verify, fleetops patch --check, Ansible, pyinfra, Fabric, the floor row, then again);
  4. CLI overhead (`fab -H bench01 ping` and `fab --list` at 0 ms), and a profile of fleetops
     (bench/profile_fleetops.py: start-up imports, per-phase timeline, node-side agent cost);
  5. the table, the targets and the machine, printed and written to --out; everything stopped (try/finally).

Per run: wall time (start to exit), peak RSS (os.wait4's ru_maxrss: the largest single process among the
tool and every descendant it reaped; Ansible's ControlPersist masters are adopted by this process as a child
subreaper and added), client CPU, node CPU (sshd sessions, shells, commands) and proxy CPU, by cgroup where
the machine allows it (CpuCgroups: bench-client / bench-nodes / bench-proxy; else per process, an undercount),
machine-wide busy CPU (/proc/stat) as a cross-check, and SSH connections / execs / sftp sessions / bytes per
host counted from the lines each run added to the nodes' sshd logs (LogLevel VERBOSE).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
WORK = BENCH / ".work"
# Others edit the repo while the bench runs: it measures a snapshot of fleetops taken at its start (the fab
# runs get it first on PYTHONPATH; fleetops' editable install is found after it).
SNAPSHOT = WORK / "snapshot"
SNAPSHOT_PARTS = ("fleetops", "remote_scripts", "fabfile.py", "fabric.yaml", "playbooks")


SNAPSHOT_HEAD = ""
SNAPSHOT_DIRTY = ""


def need_project_venv() -> None:
    """Stop before writing anything when this interpreter is not fleetops' venv: `python3 bench/run.py` with a
    system python used to copy the snapshot and then fail with `No module named 'invoke'`."""
    import importlib.util

    missing = [m for m in ("invoke", "fabric", "paramiko", "yaml") if importlib.util.find_spec(m) is None]
    fab = Path(sys.executable).parent / "fleet"
    if missing or not fab.exists():
        what = f"modules {', '.join(missing)}" if missing else f"the fleet script beside it ({fab})"
        venv_python = REPO / ".venv" / "bin" / "python"
        print(f"bench/run.py: {sys.executable} is not fleetops' venv (it lacks {what}); nothing was written.\n"
              f"Run it with the project's venv python:\n"
              f"    .venv/bin/python bench/run.py {' '.join(sys.argv[1:])}".rstrip() + "\n"
              + ("" if venv_python.exists() else "(no .venv yet: ./scripts/lab-demo or bash scripts/setup makes it)\n"),
              file=sys.stderr, end="")
        sys.exit(2)


if __name__ == "__main__":
    need_project_venv()


def take_snapshot() -> None:
    global SNAPSHOT_HEAD, SNAPSHOT_DIRTY
    git = ["git", "-C", str(REPO)]
    SNAPSHOT_HEAD = subprocess.run(
        git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    changed = subprocess.run(
        git + ["status", "--porcelain", "--", *SNAPSHOT_PARTS], capture_output=True, text=True
    ).stdout.split("\n")
    SNAPSHOT_DIRTY = ", ".join(line[3:] for line in changed if line.strip())
    if SNAPSHOT.exists():
        shutil.rmtree(SNAPSHOT)
    SNAPSHOT.mkdir(parents=True)
    for part in SNAPSHOT_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, SNAPSHOT / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, SNAPSHOT / part)
    # Byte-compiled, as pip leaves an installed wheel (and as the peers and fleetops' dependencies are here):
    # this machine sets PYTHONDONTWRITEBYTECODE=1, so an uncompiled snapshot would recompile fleetops' sources
    # on every run (~0.17 s of client CPU per `fab`, measured) and no peer pays that.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(SNAPSHOT)], check=True, capture_output=True)
    sys.path.insert(0, str(SNAPSHOT))


take_snapshot() if __name__ == "__main__" else sys.path.insert(0, str(REPO))

from fleetops.lab import Lab, site_packages  # noqa: E402
from fleetops.plans.playbook import load_playbook  # noqa: E402

PLAYBOOK = SNAPSHOT / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml"
PEER_PACKAGES = ["ansible-core", "pyinfra"]
PROFILER_PACKAGES = ["py-spy"]  # the profile's sampler (benchmark-only too); the profile skips it if missing
CLK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1
FAB = str(Path(sys.executable).parent / "fleet")  # fleetops' program (the real script, not a pyenv shim)

TOOLS = [  # (key, label), in the order they alternate within a repetition
    ("fo_pv", "fleetops `patch verify --kinds grep,compile`"),
    ("fo_check", "fleetops `patch --check`"),
    ("ansible", "Ansible playbook (3 shell tasks)"),
    ("pyinfra", "pyinfra deploy (3 server.shell)"),
    ("fabric", "Fabric ThreadingGroup script (3 group.run)"),
    # Not a peer: the least any tool that runs the node's Python once per host can cost (bench/floor.py)
    ("floor", "bare paramiko: 1 connection + 1 exec of `python -c pass` per host (node-CPU floor)"),
]
LABEL = dict(TOOLS)


def say(msg: str) -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------ processes
def set_child_subreaper() -> None:
    """Orphans of our children (Ansible's backgrounded ssh ControlPersist masters) become our children,
    so their CPU and memory can be collected with wait4 instead of vanishing into init."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        say("warning: PR_SET_CHILD_SUBREAPER failed; Ansible's ssh masters will not be counted")


def proc_cpu(pid: int, children: bool = True) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + ((int(fields[13]) + int(fields[14])) if children else 0)
    return ticks / CLK


def busy_cpu() -> float:
    values = list(map(int, Path("/proc/stat").read_text().splitlines()[0].split()[1:]))
    return (sum(values) - values[3] - values[4]) / CLK


def live_tree_cpu(roots: list[int], exclude: set[int] = frozenset()) -> float:
    """CPU of the live descendants of `roots` (each with its own reaped children), not of the roots."""
    parent = _parents()
    total, frontier = 0.0, set(roots)
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier and p not in exclude}
        total += sum(proc_cpu(p) for p in frontier)
    return total


def _parents() -> dict[int, int]:
    parent: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    return parent


def descendants(root: int) -> list[int]:
    parent: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, frontier = [], {root}
    while frontier:
        nxt = {p for p, pp in parent.items() if pp in frontier}
        out += list(nxt)
        frontier = nxt
    return out


def rss_pss_kb(pid: int) -> tuple[int, int]:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    rss = pss = 0
    for line in text.splitlines():
        if line.startswith("Rss:"):
            rss = int(line.split()[1])
        elif line.startswith("Pss:"):
            pss = int(line.split()[1])
    return rss, pss


class TreeSampler(threading.Thread):
    """Peak of the summed RSS and PSS over a process tree (probe runs only: it costs some CPU)."""

    def __init__(self, root: int, also_root: int, exclude: set[int], period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.root, self.also_root, self.exclude, self.period = root, also_root, exclude, period
        self.peak_rss = self.peak_pss = self.peak_procs = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            pids = {self.root, *descendants(self.root), *descendants(self.also_root)} - self.exclude
            pids.discard(os.getpid())
            rss = pss = 0
            for pid in pids:
                r, p = rss_pss_kb(pid)
                rss, pss = rss + r, pss + p
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self.peak_procs = max(self.peak_procs, len(pids))
            self.stop.wait(self.period)


def reap_adopted(exclude: set[int], timeout: float = 3.0, expect: int = 0) -> tuple[float, int, int]:
    """wait4 the orphans we adopted (never the pids in `exclude`): (cpu s, max rss KiB, count)."""
    cpu, rss, count = 0.0, 0, 0
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
        if info is not None and info.si_pid not in exclude:
            _, _, ru = os.wait4(info.si_pid, 0)
            cpu += ru.ru_utime + ru.ru_stime
            rss = max(rss, ru.ru_maxrss)
            count += 1
            continue
        if count >= expect or time.monotonic() > deadline:
            return cpu, rss, count
        time.sleep(0.02)


class CpuCgroups:
    """CPU accounting by cgroup: the kernel charges every process in a cgroup, however short-lived, however
    it was reparented (double-forked, reaped by init or by nobody yet). The per-process method (the listeners'
    reaped children, /proc/PID/stat) missed most of the nodes' CPU: a re-measurement with cgroup v1 cpuacct
    found 4.7-6.2 CPU-s of node CPU for fleetops at N = 32 where it had counted 1.82 s.

    One cgroup per role (bench-nodes: the lab's sshd listeners, their sessions inherit it; bench-client: the
    measured tool, started in it; bench-proxy: the delay proxy). cgroup v1 cpuacct (cpuacct.usage, ns) if
    mounted, else cgroup v2 (cpu.stat usage_usec, present in every v2 cgroup). None where neither is writable
    (not root, no cgroupfs): the bench then falls back to the per-process method and says so."""

    ROLES = ("nodes", "client", "proxy")

    def __init__(self, root: Path, version: int) -> None:
        self.root, self.version = root, version
        self.dirs = {role: root / f"bench-{role}" for role in self.ROLES}

    @property
    def method(self) -> str:
        return f"cgroup v{self.version} ({'cpuacct.usage' if self.version == 1 else 'cpu.stat usage_usec'})"

    @classmethod
    def make(cls) -> CpuCgroups | None:
        v1 = v2 = None
        try:
            mounts = Path("/proc/mounts").read_text().splitlines()
        except OSError:
            return None
        for line in mounts:
            parts = line.split()
            if len(parts) < 4:
                continue
            if parts[2] == "cgroup" and "cpuacct" in parts[3].split(",") and v1 is None:
                v1 = Path(parts[1])
            elif parts[2] == "cgroup2" and v2 is None:
                v2 = Path(parts[1])
        for root, version in ((v1, 1), (v2, 2)):
            if root is None:
                continue
            cg = cls(root, version)
            try:
                for d in cg.dirs.values():
                    d.mkdir(exist_ok=True)
                cg.usage("nodes")
                cg.add("proxy", os.getpid())  # can we move a process at all? (and back at once)
                (root / "cgroup.procs").write_text(str(os.getpid()))
                return cg
            except OSError as exc:
                say(f"bench: cgroup v{version} at {root} not usable ({exc}); trying the next method")
                cg.remove()
        return None

    def add(self, role: str, pid: int) -> None:
        (self.dirs[role] / "cgroup.procs").write_text(str(pid))

    def usage(self, role: str) -> float:
        """CPU seconds used by every process that ever ran in the cgroup."""
        d = self.dirs[role]
        if self.version == 1:
            return int((d / "cpuacct.usage").read_text()) / 1e9
        for line in (d / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
        raise OSError(f"no usage_usec in {d}/cpu.stat")

    def procs(self, role: str) -> set[int]:
        try:
            return {int(p) for p in (self.dirs[role] / "cgroup.procs").read_text().split()}
        except OSError:
            return set()

    def preexec(self, role: str):
        """For Popen(preexec_fn=...): the child joins the cgroup before it execs (its descendants inherit).
        The file is opened here, in the parent: the child only does one write(2)."""
        fd = os.open(self.dirs[role] / "cgroup.procs", os.O_WRONLY)

        def join() -> None:
            os.write(fd, b"0")  # "0": the writing process itself

        join.fd = fd  # closed by the caller once Popen returned
        return join

    def settle(self, role: str, keep: set[int], timeout: float = 20.0) -> bool:
        """Wait until only `keep` (the listeners) are left in the cgroup: the nodes' sessions finish after the
        client exits (sshd tears a session down once its channel closed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not (self.procs(role) - keep):
                return True
            time.sleep(0.05)
        return False

    def remove(self) -> None:
        """Every pid back to the root cgroup, then the cgroups removed."""
        for d in self.dirs.values():
            if not d.exists():
                continue
            for _ in range(3):
                pids = self.procs(d.name.removeprefix("bench-"))
                for pid in pids:
                    try:
                        (self.root / "cgroup.procs").write_text(str(pid))
                    except OSError:
                        pass  # gone meanwhile
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


CGROUPS: CpuCgroups | None = None  # set in main() when the machine allows it


def spawn(cmd: list[str], role: str, **kw) -> subprocess.Popen:
    """Popen, in the role's cgroup when measuring by cgroup."""
    join = CGROUPS.preexec(role) if CGROUPS else None
    try:
        return subprocess.Popen(cmd, preexec_fn=join, **kw)
    finally:
        if join:
            os.close(join.fd)


# ------------------------------------------------------------------ the lab and the work
@dataclass
class BenchHost:
    name: str
    node_name: str
    real_port: int
    port: int  # what the tools connect to (the proxy's port when RTT > 0)
    python: str
    site: str
    state_dir: str
    diffs: str
    log: Path
    listener_pid: int


@dataclass
class Env:
    project: Path
    lab: Lab
    client_key: str
    known_hosts: Path
    spec_file: Path
    nodes: list = field(default_factory=list)
    proxy: subprocess.Popen | None = None
    proxy_ports: dict = field(default_factory=dict)

    def hosts(self, n: int, rtt: float) -> list[BenchHost]:
        out = []
        for i, node in enumerate(self.nodes[:n]):
            site = str(site_packages(node.venv))
            port = self.proxy_ports[node.port] if rtt else node.port
            out.append(
                BenchHost(
                    f"bench{i + 1:02d}",
                    node.name,
                    node.port,
                    port,
                    str(node.python),
                    site,
                    str(node.state_dir),
                    f"{node.state_dir}/bench-diffs",
                    node.dir / "sshd.log",
                    node.pid(),
                )
            )
        return out


def make_project(root: Path) -> Path:
    if root.exists():
        old = Lab(root)
        if any(n.running() for n in old.nodes()):
            old.down()
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for name in ("fabfile.py", "fabric.yaml", "playbooks", "tests"):
        (root / name).symlink_to(SNAPSHOT / name)
    (root / "hosts").mkdir()
    tiny = REPO / ".lab" / "tiny"  # the lab's tiny model (unused here); reuse the repo's if made already
    if (tiny / "lab-data" / "prompts.jsonl").exists():
        shutil.copytree(tiny, root / ".lab" / "tiny")
    return root


def ensure_peers() -> Path:
    """The peers' own venv from bench/requirements.txt (benchmark-only; py-spy is optional)."""
    venv = WORK / "peers"
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    if not (venv / "bin" / "ansible-playbook").exists() or not (venv / "bin" / "pyinfra").exists():
        say(f"bench: installing {', '.join(PEER_PACKAGES)} into {venv} (benchmark-only, own venv)")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(pip + [pin(p) for p in PEER_PACKAGES], check=True)
    if not (venv / "bin" / "py-spy").exists():
        subprocess.run(pip + [pin(p) for p in PROFILER_PACKAGES])
    return venv


def pin(package: str) -> str:
    for line in (BENCH / "requirements.txt").read_text().splitlines():
        if line.split("==")[0].strip() == package:
            return line.strip()
    return package


def write_spec(path: Path) -> dict:
    book = load_playbook(PLAYBOOK)
    rel = {c["module"]: c["module"].replace(".", "/") + ".py" for c in book.checks if "module" in c}
    spec = {
        "diffs": [p.diff_path.name for p in book.patches],
        "greps": [
            {"name": c["name"], "file": rel[c["module"]], "pattern": c["pattern"], "expect": c["expect"]}
            for c in book.checks
            if c["kind"] == "grep"
        ],
        "compile": [rel[c["module"]] for c in book.checks if c["kind"] == "compile"],
        "diff_sources": [str(p.diff_path) for p in book.patches],
    }
    path.write_text(json.dumps(spec, indent=1) + "\n")
    return spec


def write_known_hosts(env: Env, rtt: float) -> None:
    lines = []
    for node in env.nodes:
        keytype, key = node.host_key.with_suffix(".pub").read_text().split()[:2]
        port = env.proxy_ports[node.port] if rtt else node.port
        lines.append(f"[127.0.0.1]:{port} {keytype} {key}")
    env.known_hosts.write_text("\n".join(lines) + "\n")


def write_known_hosts_for(env: Env, size: int, rtt: float) -> None:
    """known_hosts for the first `size` nodes (the proxy may front only those)."""
    lines = []
    for node in env.nodes[:size]:
        keytype, key = node.host_key.with_suffix(".pub").read_text().split()[:2]
        port = env.proxy_ports[node.port] if rtt else node.port
        lines.append(f"[127.0.0.1]:{port} {keytype} {key}")
    env.known_hosts.write_text("\n".join(lines) + "\n")


def write_inventories(env: Env, hosts: list[BenchHost], work: Path) -> dict:
    """fleetops hosts/bench.yaml, Ansible inventory + playbook + cfg, pyinfra inventory, Fabric hosts.json."""
    from peer_work import commands, load_spec

    n = len(hosts)
    fo = [
        "# written by bench/run.py",
        "defaults:",
        "  address: 127.0.0.1",
        "  user: root",
        f"  identity_file: {env.client_key}",
        f"  known_hosts: {env.known_hosts}",
        "  connect_timeout: 10",
        "hosts:",
    ]
    for h in hosts:
        fo += [
            f"  {h.name}:",
            f"    port: {h.port}",
            f"    python: {h.python}",
            f"    state_dir: {h.state_dir}",
            "    groups: [bench]",
        ]
    (env.project / "hosts" / "bench.yaml").write_text("\n".join(fo) + "\n")

    work.mkdir(parents=True, exist_ok=True)
    common = (
        f"-o UserKnownHostsFile={env.known_hosts} -o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=10"
    )
    inventory = {
        "bench": {
            "hosts": {
                h.name: {
                    "ansible_host": "127.0.0.1",
                    "ansible_port": h.port,
                    "ansible_python_interpreter": h.python,
                    "node_python": h.python,
                    "node_site": h.site,
                    "node_diffs": h.diffs,
                }
                for h in hosts
            },
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": env.client_key,
                "ansible_ssh_common_args": common,
            },
        }
    }
    (work / "ansible_inventory.json").write_text(json.dumps(inventory, indent=1) + "\n")
    spec = load_spec(env.spec_file)
    tasks = [
        {"name": name, "ansible.builtin.shell": cmd, "changed_when": False}
        for name, cmd in commands(spec, "{{ node_python }}", "{{ node_site }}", "{{ node_diffs }}")
    ]
    play = [
        {"name": "bench: same checks as fleetops patch verify", "hosts": "bench", "gather_facts": False, "tasks": tasks}
    ]
    (work / "ansible_playbook.yml").write_text(json.dumps(play, indent=1) + "\n")
    (work / "ansible.cfg").write_text(
        "\n".join(
            [
                "[defaults]",
                "host_key_checking = True",
                "retry_files_enabled = False",
                "gathering = explicit",
                "deprecation_warnings = False",
                "interpreter_python = auto_silent",
                f"forks = {n}",
                f"local_tmp = {WORK / 'ansible-home' / 'tmp'}",
                "[ssh_connection]",
                "pipelining = True",
                "",
            ]
        )
    )

    lines = ["# written by bench/run.py", "bench = ["]
    for h in hosts:
        data = {
            "ssh_hostname": "127.0.0.1",
            "ssh_port": h.port,
            "ssh_user": "root",
            "ssh_key": env.client_key,
            "ssh_known_hosts_file": str(env.known_hosts),
            "ssh_strict_host_key_checking": "yes",
            "node_python": h.python,
            "node_site": h.site,
            "node_diffs": h.diffs,
        }
        lines.append(f"    ({h.name!r}, {data!r}),")
    lines.append("]")
    (work / "pyinfra_inventory.py").write_text("\n".join(lines) + "\n")

    fab_hosts = [
        {
            "name": h.name,
            "address": "127.0.0.1",
            "port": h.port,
            "user": "root",
            "identity_file": env.client_key,
            "known_hosts": str(env.known_hosts),
            "python": h.python,
            "site": h.site,
            "diffs": h.diffs,
        }
        for h in hosts
    ]
    (work / "fabric_hosts.json").write_text(json.dumps(fab_hosts, indent=1) + "\n")
    return {"work": work}


# ------------------------------------------------------------------ one measured run
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
        """Machine-wide busy CPU (/proc/stat) less client, nodes and proxy over the same span: the cross-check
        (the kernel's loopback networking outside any process, this bench process, other users)."""
        return self.busy_cpu - self.client_cpu - self.node_cpu - self.proxy_cpu

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def foreign_cpu(self) -> float:
        """CPU used on this machine during the run by anything but the tool, the nodes and the proxy."""
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
        self.quiet_cores, self.noisy_cores, self.max_wait, self.retries = quiet_cores, noisy_cores, max_wait, retries
        self.waited = 0.0
        self.counter = 0
        self.listeners_all = [node.pid() for node in env.nodes]  # every lab sshd (bench-nodes holds them all)
        self.base_env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETOPS_", "ANSIBLE_"))}
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
        """Wait (up to max_wait s) until this machine is idle apart from us: others' test runs share its
        cores. Returns the load (cores busy) seen last."""
        deadline = time.monotonic() + self.max_wait
        while True:
            b0 = busy_cpu()
            time.sleep(0.5)
            load = (busy_cpu() - b0) / 0.5
            if load <= self.quiet_cores or time.monotonic() > deadline:
                if load > self.quiet_cores:
                    say(f"  (machine still busy: {load:.2f} cores after {self.max_wait:.0f} s; going on)")
                return load
            self.waited += 0.5

    def measured(self, tool: str, hosts: list, rtt: float, work: Path, kind: str) -> list:
        """One run after a quiet gate; repeated (up to `retries` times) while others' load during it was over
        noisy_cores. Returns every attempt; the last is the one that counts, earlier ones are kind 'noisy'."""
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
            cmd = [FAB, "-H", "@bench", "patch", "verify", "--kinds", "grep,compile"] + (["--json"] if traced else [])
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
        if tool == "ansible":  # a fresh ControlPath dir per run: every run starts cold, as the others do
            control_dir = tempfile.mkdtemp(prefix="fob-cp-", dir="/tmp")
            env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = control_dir
        self.counter += 1
        out_path = self.logs / f"{self.counter:04d}-{tool}-n{n}-rtt{rtt:g}-{kind}.out"
        offsets = [h.log.stat().st_size for h in hosts]
        listeners = [h.listener_pid for h in hosts]
        proxy_pid = self.env.proxy.pid if (self.env.proxy and rtt) else None
        cg = CGROUPS
        if cg:
            cg0 = {role: cg.usage(role) for role in cg.ROLES}
        node0 = sum(proc_cpu(p) for p in listeners)
        proxy0 = proc_cpu(proxy_pid, False) if proxy_pid else 0.0
        busy0, own0 = busy_cpu(), sum(os.times()[:2])
        with open(out_path, "wb") as out, open(out_path.with_suffix(".err"), "wb") as err:
            started = time.perf_counter()
            proc = spawn(
                cmd, "client", cwd=cwd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            sampler = None
            if probe:
                exclude = {self.env.proxy.pid} if self.env.proxy else set()
                sampler = TreeSampler(proc.pid, os.getpid(), exclude)
                sampler.start()
            timer = threading.Timer(self.timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
            timer.daemon = True  # an interrupted bench must not wait out a pending kill timer at exit
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
                    ["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "bench-master"], capture_output=True, timeout=10
                )
            exclude = {self.env.proxy.pid} if self.env.proxy else set()
            cpu, rss, _ = reap_adopted(exclude, expect=len(socks))
            client_cpu += cpu
            maxrss = max(maxrss, rss)
            shutil.rmtree(control_dir, ignore_errors=True)
        if sampler:
            sampler.stop.set()
            sampler.join()
        # Let the sshd listeners reap their session processes: the node CPU of a session (an agent that exits
        # when its client closes, the commands) reaches the listener only once the session is reaped, which on
        # a loaded machine takes far longer than a fixed 0.15 s (the first issue-16 run undercounted it so).
        if cg:
            # Every process of the lab is in bench-nodes (the sessions inherit the listeners' cgroup), so the
            # nodes are done when only the listeners are left; the tool's stragglers are in bench-client.
            settled = cg.settle("nodes", set(self.listeners_all)) & cg.settle("client", set(), timeout=5)
            used = {role: cg.usage(role) - cg0[role] for role in cg.ROLES}
            busy_all = busy_cpu() - busy0
            span = time.perf_counter() - started
            r = Run(
                tool, n, rtt, kind, proc.returncode, wall, maxrss, used["client"], used["nodes"],
                used["proxy"] if proxy_pid else 0.0, busy_all, log=str(out_path),
            )
            r.method, r.span, r.settled = cg.method, span, settled
            # Others' load: what neither the tool, the nodes, the proxy nor this process (the probe's sampler,
            # the settle polling) used.
            r.window_cpu = sum(used.values()) + (sum(os.times()[:2]) - own0)
        else:
            settle = time.monotonic() + 20
            while time.monotonic() < settle and set(_parents().values()) & set(listeners):
                time.sleep(0.05)
            node_cpu = sum(proc_cpu(p) for p in listeners) - node0
            proxy_cpu = (proc_cpu(proxy_pid, False) - proxy0) if proxy_pid else 0.0
            r = Run(
                tool, n, rtt, kind, proc.returncode, wall, maxrss, client_cpu, node_cpu, proxy_cpu, busy,
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
            r.tree_rss_kb, r.tree_pss_kb, r.tree_procs = sampler.peak_rss, sampler.peak_pss, sampler.peak_procs
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


# ------------------------------------------------------------------ delay proxy
def start_proxy(rtt_ms: float, ports: list[int]) -> tuple[subprocess.Popen, dict]:
    proc = spawn(
        [sys.executable, str(BENCH / "delay_proxy.py"), "--rtt-ms", str(rtt_ms), *map(str, ports)],
        "proxy",
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if not line:
        raise SystemExit("delay proxy did not start")
    mapping = {int(k): v for k, v in json.loads(line)["listen"].items()}
    return proc, mapping


def stop_proc(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def calibrate(rtt_ms: float, env: Env, reps: int = 5) -> dict:
    """An echo server (speaks first: one byte) behind a proxy of this RTT: connect, first byte, echo turns.
    Then `ssh true` to bench01 direct and through the proxy."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            with c:
                c.sendall(b"!")
                while True:
                    d = c.recv(1024)
                    if not d:
                        break
                    c.sendall(d)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    proxy, mapping = start_proxy(rtt_ms, [srv.getsockname()[1]])
    port = mapping[srv.getsockname()[1]]
    connects, firsts, turns = [], [], []
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            s = socket.create_connection(("127.0.0.1", port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t1 = time.perf_counter()
            s.recv(1)
            t2 = time.perf_counter()
            for _ in range(3):
                a = time.perf_counter()
                s.sendall(b"x")
                s.recv(1)
                turns.append(time.perf_counter() - a)
            s.close()
            connects.append(t1 - t0)
            firsts.append(t2 - t0)
    finally:
        stop_proc(proxy)
        stop.set()
        srv.close()
    out = {
        "rtt_ms": rtt_ms,
        "connect_ms": statistics.median(connects) * 1e3,
        "connect_first_byte_ms": statistics.median(firsts) * 1e3,
        "echo_turn_ms": statistics.median(turns) * 1e3,
    }
    # ssh true, direct vs through the proxy (the proxy in front of bench01's sshd)
    node = env.nodes[0]
    proxy, mapping = start_proxy(rtt_ms, [node.port])
    kh = WORK / "calib_known_hosts"
    keytype, key = node.host_key.with_suffix(".pub").read_text().split()[:2]
    kh.write_text(f"[127.0.0.1]:{node.port} {keytype} {key}\n[127.0.0.1]:{mapping[node.port]} {keytype} {key}\n")

    def ssh_true(p: int) -> float:
        t0 = time.perf_counter()
        subprocess.run(
            [
                "ssh",
                "-i",
                env.client_key,
                "-o",
                f"UserKnownHostsFile={kh}",
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                "BatchMode=yes",
                "-p",
                str(p),
                "root@127.0.0.1",
                "true",
            ],
            check=True,
            capture_output=True,
        )
        return time.perf_counter() - t0

    try:
        direct = statistics.median(ssh_true(node.port) for _ in range(reps))
        delayed = statistics.median(ssh_true(mapping[node.port]) for _ in range(reps))
    finally:
        stop_proc(proxy)
    out.update(
        {
            "ssh_true_direct_s": direct,
            "ssh_true_proxied_s": delayed,
            "ssh_true_extra_rtts": (delayed - direct) / (rtt_ms / 1e3),
        }
    )
    return out


# ------------------------------------------------------------------ reporting
def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def per_host(values_runs: list[list[int]]) -> str:
    """Per-host counts over runs: '1' when every host in every run had 1, else 'min–max'."""
    flat = [v for run in values_runs for v in run]
    if not flat:
        return "-"
    lo, hi = min(flat), max(flat)
    return f"{lo}" if lo == hi else f"{lo}–{hi}"


def retried(runs: list[Run], tool: str, n: int, rtt: float, rs: list[Run]) -> str:
    noisy = sum(1 for r in runs if r.kind == "noisy" and r.tool == tool and r.n == n and r.rtt == rtt)
    still = sum(1 for r in rs if r.noisy)
    parts = ([f"{noisy} noisy re-run"] if noisy else []) + ([f"{still} still noisy"] if still else [])
    return f" ({', '.join(parts)})" if parts else ""


def bytes_cell(r: Run) -> str:
    if any(t < c for t, c in zip(r.transferred, r.conns)):
        return "- (not logged: ssh -O exit)" if r.tool == "ansible" else "- (sshd logged no Transferred: line)"
    return f"{med(r.bytes):.0f}"


def machine_info(peers: Path) -> dict:
    def out(cmd: list[str]) -> str:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            return (p.stdout or p.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "?"

    mem = next(
        (
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal:")
        ),
        0,
    )
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    import fabric
    import invoke
    import paramiko

    pv = peers / "bin" / "python"
    peer_versions = out(
        [
            str(pv),
            "-c",
            "import importlib.metadata as m; print(' '.join(f'{p}={m.version(p)}' for p in "
            "('ansible-core','pyinfra','paramiko')))",
        ]
    )
    head = SNAPSHOT_HEAD or out(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = SNAPSHOT_DIRTY
    from fleetops.wire.bundle import agent_bundle

    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{NCPU} x {cpu}",
        "ram": f"{mem / 1024 / 1024:.1f} GiB",
        "kernel": platform.release(),
        "os": out(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "python": platform.python_version(),
        "fabric": fabric.__version__,
        "paramiko": paramiko.__version__,
        "invoke": invoke.__version__,
        "peers": peer_versions,
        "openssh": out(["ssh", "-V"]),
        "fleetops": f"snapshot of the working tree taken at the start: git {head}"
        + (f" + uncommitted changes in {dirty}" if dirty else " (clean)"),
        "agent": agent_bundle().filename,
    }


def render(runs: list[Run], calib: list[dict], cli: dict, info: dict, args, profile_md: str, wall_total: float) -> str:
    L: list[str] = []
    L.append("# fleetops vs Ansible, pyinfra and a Fabric ThreadingGroup script")
    L.append("")
    L.append(
        f"Written by `python3 bench/run.py --sizes {args.sizes} --rtts {args.rtts} --big {args.big} --big-rtt "
        f"{args.big_rtt:g} --reps {args.reps}` on {info['date']} ({wall_total / 60:.1f} min). Every number below "
        "comes from this one run."
        + ("" if args.reps >= 3 else f" **Reduced run: {args.reps} repetition(s) per row, not 3**: the medians are "
           "less robust than the published bench's.")
    )
    L.append("")
    L.append("## Machine")
    L.append("")
    for k in (
        "cpu",
        "ram",
        "kernel",
        "os",
        "python",
        "fabric",
        "paramiko",
        "invoke",
        "peers",
        "openssh",
        "fleetops",
        "agent",
    ):
        L.append(f"- {k}: {info[k]}")
    L.append("")
    L.append(
        "The lab nodes are real OpenSSH sshd processes on this same machine (fleetops.lab), so every node's "
        "remote work (sshd, the login shell, the commands) competes with the client for the same "
        f"{NCPU} cores: see the CPU columns."
    )
    L.append("")
    L.append(
        "The peers do fleetops' steady-state work as 3 shell commands (bench/peer_work.py); before the "
        f"timed runs the bench ran them once and checked the output: {info.get('peer_check', '')}."
    )
    L.append("")
    L.append("## Delay calibration (bench/delay_proxy.py)")
    L.append("")
    L.append(
        "| RTT set | TCP connect | connect + first byte (server speaks first) | echo turn | `ssh true` direct | "
        "`ssh true` proxied | extra RTTs per `ssh true` |"
    )
    L.append("|---|---|---|---|---|---|---|")
    for c in calib:
        L.append(
            f"| {c['rtt_ms']:g} ms | {c['connect_ms']:.1f} ms | {c['connect_first_byte_ms']:.1f} ms "
            f"(model: 1.5 RTT) | {c['echo_turn_ms']:.1f} ms | {c['ssh_true_direct_s']:.3f} s | "
            f"{c['ssh_true_proxied_s']:.3f} s | {c['ssh_true_extra_rtts']:.1f} |"
        )
    L.append("")
    L.append(
        "connect() returns at once (the proxy accepts locally); the handshake's RTT shows up as the first "
        "byte arriving 1 RTT + RTT/2 late. The proxy delays data, not TCP segments: on loopback every segment "
        "is ACKed at once, so Nagle's algorithm and delayed ACKs never cost a round trip here. The reference "
        "lab (NFQUEUE on every packet, /work/shared/reference) measured 12.6 extra RTTs for `ssh true`: read "
        "the delayed rows as a lower bound on what the RTT costs."
    )
    L.append("")

    L.append("## Results")
    L.append("")
    L.append(
        f"Median of {args.reps} timed runs per row (min–max), tools alternating within each repetition "
        "(a warm-up and a probe run per tool and scenario are not timed). Before each run the bench waits for the "
        "machine to be idle (others' tests share it); a run during which others used more than "
        "--noisy-cores is run again and the noisy one left out (counted in 'runs ok'). Ratio = this row's median / "
        "fleetops `patch verify` median in the same scenario (> 1: slower than fleetops). conns/execs/sftp "
        "per host: from the sshd logs, every timed run (a range if they varied). Peak RSS: the largest "
        "single client process (wait4 ru_maxrss; Ansible includes its forked workers, its ssh clients and "
        "the adopted ControlPersist masters). CPU: median seconds per run on the client (the tool and its "
        "children), on the nodes (sshd + shell + commands, all on this machine), in the delay proxy, "
        f"measured by {cpu_methods(runs)}; machine busy = the whole machine's busy CPU over the same span "
        "(/proc/stat), a cross-check; others = busy − client − node − proxy (the kernel's loopback networking "
        "outside any process, this bench process, other users: large 'others' means the three columns "
        f"missed something or the machine was not quiet); CPU bound = (client + node + proxy CPU) / {NCPU} "
        "cores: no run can be faster than that here (a lower bound: it counts neither 'others' nor waits)."
    )
    L.append("")
    L.append(
        "| tool / scenario | N | RTT ms | median wall s (min–max) | ratio to fleetops patch verify | conns/host | "
        "execs/host | sftp/host | peak RSS MB | client CPU s | node CPU s | proxy CPU s | machine busy CPU s | "
        "others CPU s | CPU bound s | runs ok |"
    )
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    scen = sorted({(r.rtt, r.n) for r in runs if r.kind == "rep" and r.tool in LABEL})
    medians: dict = {}
    for rtt, n in scen:
        for tool, _ in TOOLS:
            rs = [r for r in runs if r.kind == "rep" and r.tool == tool and r.n == n and r.rtt == rtt]
            if rs:
                medians[(tool, n, rtt)] = med([r.wall for r in rs])
    for rtt, n in scen:
        base = medians.get(("fo_pv", n, rtt))
        for tool, label in TOOLS:
            rs = [r for r in runs if r.kind == "rep" and r.tool == tool and r.n == n and r.rtt == rtt]
            if not rs:
                continue
            walls = [r.wall for r in rs]
            m = med(walls)
            ratio = f"{m / base:.2f}×" if base else "-"
            cpu_c, cpu_n, cpu_p = (
                med([r.client_cpu for r in rs]),
                med([r.node_cpu for r in rs]),
                med([r.proxy_cpu for r in rs]),
            )
            bound = (cpu_c + cpu_n + cpu_p) / NCPU
            L.append(
                f"| {label} | {n} | {rtt:g} | {m:.3f} ({min(walls):.3f}–{max(walls):.3f}) | {ratio} | "
                f"{per_host([r.conns for r in rs])} | {per_host([r.execs for r in rs])} | "
                f"{per_host([r.sftp for r in rs])} | {max(r.maxrss_kb for r in rs) / 1024:.0f} | {cpu_c:.2f} | "
                f"{cpu_n:.2f} | {cpu_p:.2f} | {med([r.busy_cpu for r in rs]):.2f} | "
                f"{med([r.others_cpu for r in rs]):.2f} | {bound:.2f} | "
                f"{sum(r.ok for r in rs)}/{len(rs)}{retried(runs, tool, n, rtt, rs)} |"
            )
    L.append("")

    L.extend(per_host_section(runs, medians))

    L.append("### Probe runs (one per tool and scenario, not timed)")
    L.append("")
    L.append(
        "Client process tree sampled every 50 ms: peak of the summed RSS and PSS over every process of the "
        "tool (PSS shares pages between forked workers fairly), most processes at once; bytes per host "
        "from sshd's `Transferred:` lines; fleetops' own counters (FLEETOPS_TRACE=1, --json)."
    )
    L.append("")
    L.append(
        "| tool | N | RTT ms | wall s | tree peak RSS MB | tree peak PSS MB | processes | bytes/host | "
        "fleetops trace per host (conns/execs/uploads) |"
    )
    L.append("|---|---|---|---|---|---|---|---|---|")
    for rtt, n in scen:
        for tool, label in TOOLS:
            for r in runs:
                if r.kind == "probe" and r.tool == tool and r.n == n and r.rtt == rtt:
                    trace = "-"
                    if r.trace and r.trace.get("counters"):
                        rows = list(r.trace["counters"].values())
                        trace = "/".join(
                            per_host([[row[k] for row in rows]]) for k in ("connections", "execs", "uploads")
                        )
                    L.append(
                        f"| {label} | {n} | {rtt:g} | {r.wall:.3f} | {r.tree_rss_kb / 1024:.0f} | "
                        f"{r.tree_pss_kb / 1024:.0f} | {r.tree_procs} | {bytes_cell(r)} | {trace} |"
                    )
    L.append("")

    L.append("### CLI overhead (1 host, 0 ms)")
    L.append("")
    L.append("| command | median wall s (min–max) | client CPU s | node CPU s | peak RSS MB | runs ok |")
    L.append("|---|---|---|---|---|---|")
    for key, label in (("fo_ping1", "`fab -H bench01 ping`"), ("fo_list", "`fab --list` (no network)"),
                       ("fo_deep", "`fab -H bench01 verify` (deep: vLLM import, callsites, probe)")):
        rs = cli.get(key, [])
        if rs:
            walls = [r.wall for r in rs]
            L.append(
                f"| {label} | {med(walls):.3f} ({min(walls):.3f}–{max(walls):.3f}) | "
                f"{med([r.client_cpu for r in rs]):.2f} | {med([r.node_cpu for r in rs]):.2f} | "
                f"{max(r.maxrss_kb for r in rs) / 1024:.0f} | {sum(r.ok for r in rs)}/{len(rs)} |"
            )
    L.append("")

    L.append("## Targets (N = 32, RTT 50 ms unless said)")
    L.append("")
    L.extend(targets(runs, cli, medians))
    L.append("")
    rep_runs = [r for r in runs if r.kind == "rep"]
    rates = [r.foreign_cpu / (r.span or r.wall) for r in rep_runs if r.wall > 0]
    L.append(
        f"Noise: CPU used on this machine by others during the timed runs (busy − client − node − proxy − this "
        f"bench process), median {med(rates):.2f} cores (max {max(rates, default=0):.2f})."
        + ("" if all(r.settled for r in rep_runs) else
           f" In {sum(not r.settled for r in rep_runs)} timed run(s) the nodes' sessions had not all ended 20 s "
           "after the tool exited (their node CPU may be short).")
    )
    L.append("")
    if profile_md:
        L.append(analysis(runs, medians, args))
        L.append(profile_md)
    return "\n".join(L) + "\n"


def analysis(runs: list[Run], medians: dict, args) -> str:
    """Where the time goes, from this run's numbers (the profile below has the detail)."""
    try:
        import profile_fleetops

        F = profile_fleetops.FACTS
    except ImportError:
        F = {}
    n, rtt = max(r.n for r in runs), max(r.rtt for r in runs)

    def rows(tool: str, nn: int = n, rr: float = rtt) -> list[Run]:
        return [r for r in runs if r.kind == "rep" and r.tool == tool and r.n == nn and r.rtt == rr]

    def cpu(tool: str, what: str, nn: int = n, rr: float = rtt) -> float:
        return med([getattr(r, what) for r in rows(tool, nn, rr)])

    if not rows("fo_pv") or not F:
        return ""
    L = [f"## Where the time goes (N = {n}, {rtt:g} ms; generated from this run's numbers)", ""]
    wall = medians[("fo_pv", n, rtt)]
    totals = {  # CPU of the tool's median run: client + nodes + proxy
        t: cpu(t, "client_cpu") + cpu(t, "node_cpu") + cpu(t, "proxy_cpu") for t, _ in TOOLS if (t, n, rtt) in medians
    }
    bound = totals["fo_pv"] / NCPU
    share = bound / wall if wall else 0.0
    verdict = (
        "**The wall time is mostly CPU time**" if share >= 0.8
        else "**The wall time is partly CPU time**" if share >= 0.4
        else "**The wall time is not CPU-bound**"
    )
    order = sorted(totals, key=totals.get)
    L.append(
        f"1. {verdict} (measured by {cpu_methods(rows('fo_pv'))}). fleetops `patch verify` took {wall:.2f} s; "
        f"that run used {cpu('fo_pv', 'client_cpu'):.2f} s of client CPU, {cpu('fo_pv', 'node_cpu'):.2f} s of "
        f"node CPU and {cpu('fo_pv', 'proxy_cpu'):.2f} s in the delay proxy: {bound:.2f} s of work for {NCPU} "
        f"cores ({share:.0%} of the wall time; the machine as a whole was busy "
        f"{cpu('fo_pv', 'busy_cpu'):.2f} CPU-s). Per tool, wall / CPU bound: "
        + "; ".join(
            f"{LABEL[t].split(' (')[0]} {medians[(t, n, rtt)]:.2f} s wall / {totals[t] / NCPU:.2f} s bound"
            for t in totals
        )
        + ". Total CPU (client + nodes + proxy), least first: "
        + ", ".join(f"{LABEL[t].split(' (')[0]} {totals[t]:.2f} s" for t in order)
        + f". The lab's {n} nodes run their sshd, login shells and commands on the client's own {NCPU} cores"
        + (f"; at 0 ms fleetops took {medians[('fo_pv', n, 0.0)]:.2f} s, so the {rtt:g} ms RTT added "
           f"{wall - medians[('fo_pv', n, 0.0)]:.2f} s." if rtt and ("fo_pv", n, 0.0) in medians else ".")
    )
    per_host = {t: cpu(t, "node_cpu") / n for t, _ in TOOLS if rows(t)}
    L.append(
        "2. **Node CPU per host:** "
        + ", ".join(f"{LABEL[t].split(' (')[0]} {v:.2f} s" for t, v in per_host.items())
        + f". fleetops' = one SSH connection ({F['connect_node_cpu']:.3f} s on an idle node) + 1 exec (the agent, "
        f"serving every request of the chain), "
        + (f"paying once the login shell's rc files ({F['shell_rc']:.3f} s here: root's ~/.bashrc), "
           if F["exec_true_node_cpu"] >= F["shell_rc"] / 2 else
           f"the login shell without its rc files (an exec of `true` costs {F['exec_true_node_cpu']:.3f} s of "
           f"node CPU, so the lab's sessions do not source root's ~/.bashrc, {F['shell_rc']:.3f} s locally), ")
        + f"the node python's start ({F['python_startup']:.3f} s) and the agent ({F['agent_patch_own']:.3f} s for "
        f"patch, {F['agent_verify_own']:.3f} s for verify as the agent reports it; `-X importtime` counts "
        f"{F['agent_imports']:.3f} s of imports in a verify call). On an idle node one agent exec "
        f"costs {F['agent_patch_node_cpu']:.3f}/{F['agent_verify_node_cpu']:.3f} s of node CPU against "
        f"{F['exec_true_node_cpu']:.3f} s for `true`; with {n} nodes sharing {NCPU} cores each costs more. "
        "The peers run 3 execs per host but only grep/patch/py_compile in them; Ansible runs a Python module "
        "(AnsiballZ) per task."
    )
    fo1 = medians.get(("fo_pv", 1, rtt))
    tl = F.get("timelines", {}).get(f"{rtt:g}/1")
    if fo1 and tl:
        L.append(
            f"3. **One host at {rtt:g} ms already takes {fo1:.2f} s** (median above; the N = 32 target is "
            f"1.2 s): start-up {tl['imports']:.2f} s "
            f"to the end of the imports (plus ~0.04 s interpreter start), connect {tl['connect_med']:.2f} s, "
            f"the agent's calls {tl['exec_med']:.2f} s (one exec; patch and verify pipelined on it, node time "
            f"included), exit at {tl['exit']:.2f} s. What is left on this path is the client's start-up (mostly "
            "importing Fabric, Invoke, paramiko and rich) and the SSH handshake's round trips."
        )
    if F.get("pyspy"):
        top = sorted(F["pyspy"].items(), key=lambda kv: -kv[1])[:4]
        L.append(
            f"4. **Client side** (fleetops at N = {n}: {cpu('fo_pv', 'client_cpu'):.2f} s CPU, peak RSS "
            f"{max(r.maxrss_kb for r in rows('fo_pv')) / 1024:.0f} MB): Python-level CPU by area "
            + ", ".join(f"{a} {v:.2f} s" for a, v in top)
            + " (py-spy, section 3 below)."
        )
    L.append("")
    return "\n".join(L)


def cpu_methods(runs: list[Run]) -> str:
    """How these runs' CPU was measured, for the text (one method per bench run, in practice)."""
    methods = sorted({r.method for r in runs if r.kind in ("rep", "probe")}) or ["per-process"]
    return " and ".join(
        m if m.startswith("cgroup") else "per process (the listeners' reaped children in /proc: an undercount)"
        for m in methods
    )


def rows_for(runs: list[Run], tool: str, n: int, rtt: float) -> list[Run]:
    return [r for r in runs if r.kind == "rep" and r.tool == tool and r.n == n and r.rtt == rtt]


def projection(runs: list[Run], medians: dict, tool: str, n: int, rtt: float) -> float | None:
    """Model for a real fleet (each node has its own CPUs, so the lab's node CPU leaves the client's cores):
    the critical path of one host (this run's N = 1 wall at the same RTT) plus the client CPU that the other
    N − 1 hosts add (this run's client CPU at N minus at N = 1), spread over the client's cores."""
    one, rs, rs1 = medians.get((tool, 1, rtt)), rows_for(runs, tool, n, rtt), rows_for(runs, tool, 1, rtt)
    if one is None or not rs or not rs1:
        return None
    extra = med([r.client_cpu for r in rs]) - med([r.client_cpu for r in rs1])
    return one + max(0.0, extra) / NCPU


def per_host_section(runs: list[Run], medians: dict) -> list[str]:
    L = ["### Per host, and a projection for a real fleet", ""]
    L.append(
        "Client and node CPU per host = the run's median CPU / N. **Projection for a real fleet** (model): "
        "on real nodes each node's work runs on its own CPUs, so what remains on the critical path is one host's "
        "chain (this run's N = 1 median wall at the same RTT) plus the client CPU the other hosts add (client CPU "
        f"at N − client CPU at N = 1), spread over the client's {NCPU} cores. It is a model, not a measurement: "
        "it ignores the client's network stack and assumes the nodes answer as fast as an idle lab node."
    )
    L.append("")
    L.append("| tool / scenario | N | RTT ms | median wall s | client CPU ms/host | node CPU ms/host | peak RSS MB | "
             "projection for a real fleet s |")
    L.append("|---|---|---|---|---|---|---|---|")
    for rtt, n in sorted({(r.rtt, r.n) for r in runs if r.kind == "rep" and r.tool in LABEL}):
        for tool, label in TOOLS:
            rs = rows_for(runs, tool, n, rtt)
            if not rs:
                continue
            proj = projection(runs, medians, tool, n, rtt)
            L.append(
                f"| {label} | {n} | {rtt:g} | {medians[(tool, n, rtt)]:.3f} | "
                f"{med([r.client_cpu for r in rs]) / n * 1e3:.1f} | {med([r.node_cpu for r in rs]) / n * 1e3:.1f} | "
                f"{max(r.maxrss_kb for r in rs) / 1024:.0f} | {'-' if proj is None else f'{proj:.3f}'} |"
            )
    L.append("")
    return L


def targets(runs: list[Run], cli: dict, medians: dict) -> list[str]:
    out = []

    def row(name: str, ok: bool | None, detail: str) -> None:
        word = {True: "**met**", False: "**missed**", None: "n/a"}[ok]
        out.append(f"| {name} | {word} | {detail} |")

    out.append("| target | result | numbers |")
    out.append("|---|---|---|")
    fo_runs = [r for r in runs if r.tool in ("fo_pv", "fo_check") and r.kind in ("rep", "probe")]
    execs = [e for r in fo_runs for e in r.execs]
    row("execs per host for any task chain: 1 (`patch verify`, `patch --check`; sshd logs)",
        bool(execs) and set(execs) == {1} if execs else None,
        f"{per_host([execs])} per host over {len(execs)} host-runs")
    conns = [c for r in fo_runs for c in r.conns]
    row("1 SSH connection per host", bool(conns) and set(conns) == {1} if conns else None,
        f"{per_host([conns])} per host over {len(conns)} host-runs")
    pv = rows_for(runs, "fo_pv", 32, 50.0)
    floor = rows_for(runs, "floor", 32, 50.0)
    if pv:
        node = med([r.node_cpu for r in pv]) / 32
        detail = f"{node * 1e3:.1f} ms (median node CPU {med([r.node_cpu for r in pv]):.2f} s / 32)"
        if floor:
            least = med([r.node_cpu for r in floor]) / 32
            detail += (f"; the floor in this run, 1 connection + 1 exec of the node's `python -c pass` and no work: "
                       f"{least * 1e3:.1f} ms, so fleetops' own work (the agent's checks, imports and both ops) "
                       f"costs {(node - least) * 1e3:.1f} ms")
        row("node CPU per host for `patch verify --kinds grep,compile` ≤ 45 ms (N = 32, 50 ms)", node <= 0.045,
            detail)
    fo = medians.get(("fo_pv", 32, 50.0))
    for tool, factor in (("fabric", 1.5), ("pyinfra", 1.5), ("ansible", 10)):
        other = medians.get((tool, 32, 50.0))
        name = f"N = 32, 50 ms: ≥ {factor:g}× faster than {LABEL[tool].split(' (')[0]}"
        if fo is None or other is None:
            row(name, None, "not measured")
        else:
            row(name, other / fo >= factor, f"{other:.3f} s / fleetops {fo:.3f} s = {other / fo:.2f}×")
    one = medians.get(("fo_pv", 1, 50.0))
    least = medians.get(("floor", 1, 50.0))
    row("N = 1, 50 ms: ≤ 0.70 s", None if one is None else one <= 0.70,
        "not measured" if one is None else f"{one:.3f} s" + (
            "" if least is None else f"; the floor script (stock paramiko, one exec of `python -c pass`) took "
                                     f"{least:.3f} s"))
    big = [r for r in runs if r.kind == "rep" and r.tool == "fo_pv" and r.n >= 128 and r.rtt == 50.0]
    if big:
        n = big[0].n
        rss = max(r.maxrss_kb for r in big) / 1024
        cpu = med([r.client_cpu for r in big]) / n
        row(f"N = {n}, 50 ms: client peak RSS < 150 MB", rss < 150, f"max {rss:.0f} MB over {len(big)} runs")
        row(f"N = {n}, 50 ms: client CPU per host ≤ 15 ms", cpu <= 0.015,
            f"{cpu * 1e3:.1f} ms (median client CPU {med([r.client_cpu for r in big]):.2f} s / {n})")
    else:
        row("N = 128, 50 ms: client peak RSS < 150 MB, client CPU per host ≤ 15 ms", None, "not in this run")
    deep = [r.wall for r in cli.get("fo_deep", [])]
    row("deep `verify` on one node no slower than before (about 12 s)", med(deep) <= 12.5 if deep else None,
        f"{med(deep):.2f} s median of {len(deep)}" if deep else "not measured")
    return out


# ------------------------------------------------------------------ main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,8,32")
    ap.add_argument("--big", type=int, default=128, help="one more fleet size, run at --big-rtt only (0: none)")
    ap.add_argument("--big-rtt", type=float, default=50)
    ap.add_argument("--rtts", default="0,50")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(BENCH / "RESULTS.md"))
    ap.add_argument("--timeout", type=float, default=240, help="seconds before a run is killed")
    ap.add_argument("--no-profile", action="store_true", help="skip the fleetops profile at the end")
    ap.add_argument(
        "--quiet-cores",
        type=float,
        default=0.3,
        help="before each measured run, wait until the machine's load is at most this (cores)",
    )
    ap.add_argument(
        "--noisy-cores",
        type=float,
        default=0.5,
        help="run again (up to 3 times) if others used more than this many cores during a run",
    )
    ap.add_argument("--max-wait", type=float, default=900, help="longest wait for a quiet machine (s)")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be at least 1 (3 for the published figures; fewer is a reduced run, said so)")
    sizes = [int(s) for s in args.sizes.split(",")]
    rtts = [float(r) for r in args.rtts.split(",")]
    t_start = time.perf_counter()

    def stop(signum, frame):  # SIGTERM, and SIGINT even when started in the background (where it is ignored)
        # Once: a second signal (`timeout` forwards one, an impatient Ctrl-C) must not cut the cleanup short and
        # leave the lab's sshd listeners behind.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    WORK.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(BENCH))
    peers = ensure_peers()
    project = make_project(WORK / "project")
    logs = WORK / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    lab = Lab(project)
    env = Env(project, lab, str(lab.client_key), project / ".lab" / "bench_known_hosts", WORK / "spec.json")
    runs: list[Run] = []
    calib: list[dict] = []
    cli: dict = {}
    profile_md = ""
    peer_check = ""
    try:
        most = max(sizes + [args.big])
        say(f"bench: starting {most} lab nodes in {project}")
        env.nodes = lab.up(most, progress=lambda m: say(f"  {m}"))
        global CGROUPS
        CGROUPS = CpuCgroups.make()
        if CGROUPS:
            for node in env.nodes:  # listeners only: the sessions each one forks from now on inherit it
                CGROUPS.add("nodes", node.pid())
            say(f"bench: CPU measured by {CGROUPS.method} under {CGROUPS.root} (bench-nodes/-client/-proxy)")
        else:
            say("bench: no usable cgroup (needs root and a cgroup v1 cpuacct or v2 mount): CPU measured per "
                "process, which misses the nodes' sessions that are reaped late or reparented (an undercount)")
        (project / "hosts" / "lab.yaml").unlink(missing_ok=True)  # fleetops sees only hosts/bench.yaml
        spec = write_spec(env.spec_file)
        for node in env.nodes:
            d = node.state_dir / "bench-diffs"
            d.mkdir(parents=True, exist_ok=True)
            for src in spec["diff_sources"]:
                shutil.copy(src, d / Path(src).name)
        runner = Runner(env, peers, logs, args.timeout, args.quiet_cores, args.noisy_cores, args.max_wait)
        write_known_hosts(env, 0)
        hosts_all = env.hosts(len(env.nodes), 0)
        write_inventories(env, hosts_all, WORK / "scenario")
        say("bench: patching every node once (steady state)")
        first = subprocess.run(
            [FAB, "-H", "@bench", "patch"],
            cwd=project,
            env=runner.base_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if first.returncode != 0:
            raise SystemExit(f"initial patch failed:\n{first.stdout[-3000:]}\n{first.stderr[-3000:]}")
        # The peers' commands really do the work: the Fabric peer's output on bench01, checked.
        shown = subprocess.run(
            [
                sys.executable,
                str(BENCH / "peer_fabric.py"),
                str(WORK / "scenario" / "fabric_hosts.json"),
                str(env.spec_file),
                "--show",
            ],
            cwd=WORK,
            env=runner.base_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        first_host = [part for part in shown.stdout.split("--- ") if part.startswith(f"127.0.0.1:{hosts_all[0].port} ")]
        expect = {"already applied": len(spec["diffs"]), ": ok": len(spec["greps"]), "compiled": 1}
        got = {k: sum(part.count(k) for part in first_host) for k in expect}
        peer_check = f"peer commands on one node: {got} (expected {expect})"
        say(f"bench: {peer_check}")
        if shown.returncode != 0 or got != expect:
            raise SystemExit(f"the peer commands do not do the expected work:\n{shown.stdout}\n{shown.stderr}")
        set_child_subreaper()
        for rtt in sorted(set(rtts) | ({args.big_rtt} if args.big else set())):
            if rtt:
                c = calibrate(rtt, env)
                calib.append(c)
                say(
                    f"bench: calibration {rtt:g} ms: connect {c['connect_ms']:.1f} ms, connect+first byte "
                    f"{c['connect_first_byte_ms']:.1f} ms, echo turn {c['echo_turn_ms']:.1f} ms; ssh true "
                    f"{c['ssh_true_direct_s']:.3f} s direct, {c['ssh_true_proxied_s']:.3f} s proxied "
                    f"({c['ssh_true_extra_rtts']:.1f} extra RTTs)"
                )
                env.proxy, env.proxy_ports = start_proxy(rtt, [n.port for n in env.nodes])
            write_known_hosts(env, rtt)
            for n in [m for m in sizes if rtt in rtts] + ([args.big] if args.big and rtt == args.big_rtt else []):
                hosts = env.hosts(n, rtt)
                work = WORK / "scenario"
                write_inventories(env, hosts, work)
                say(f"bench: N={n} RTT={rtt:g} ms")
                for kind in ("warmup", "probe"):
                    for tool, _ in TOOLS:
                        r = (
                            runner.run(tool, hosts, rtt, work, kind)
                            if kind == "warmup"
                            else runner.measured(tool, hosts, rtt, work, kind)[-1]
                        )
                        runs.append(r)
                        say(
                            f"  {kind:6} {tool:8} {r.wall:7.3f} s rc={r.rc} conns/host={per_host([r.conns])} "
                            f"execs/host={per_host([r.execs])} rss={r.maxrss_kb / 1024:.0f} MB"
                        )
                for rep in range(args.reps):
                    line = []
                    for tool, _ in TOOLS:
                        attempts = runner.measured(tool, hosts, rtt, work, "rep")
                        runs.extend(attempts)
                        r = attempts[-1]
                        line.append(
                            f"{tool} {r.wall:.3f}"
                            + ("" if r.ok else f" (rc {r.rc})")
                            + (f" ({len(attempts) - 1} noisy)" if len(attempts) > 1 else "")
                        )
                    say(f"  rep {rep + 1}: " + ", ".join(line))
            if env.proxy:
                stop_proc(env.proxy)
                env.proxy, env.proxy_ports = None, {}
        write_known_hosts(env, 0)
        hosts1 = env.hosts(1, 0)
        write_inventories(env, hosts1, WORK / "scenario")
        say("bench: CLI overhead")
        for key in ("fo_ping1", "fo_list", "fo_deep"):
            runner.run(key, hosts1, 0, WORK / "scenario", "warmup")
            times = args.reps if key == "fo_deep" else max(args.reps, 5)
            cli[key] = [runner.measured(key, hosts1, 0, WORK / "scenario", "rep")[-1] for _ in range(times)]
            say(f"  {key}: median {med([r.wall for r in cli[key]]):.3f} s")
        if not args.no_profile:
            say("bench: profiling fleetops")
            import contextlib

            import profile_fleetops

            @contextlib.contextmanager
            def delayed(rtt: float, size: int):
                """hosts/bench.yaml (and known_hosts) for the first `size` nodes, through a proxy if rtt."""
                if rtt:
                    env.proxy, env.proxy_ports = start_proxy(rtt, [node.port for node in env.nodes[:size]])
                try:
                    write_known_hosts_for(env, size, rtt)
                    write_inventories(env, env.hosts(size, rtt), WORK / "scenario")
                    yield
                finally:
                    stop_proc(env.proxy)
                    env.proxy, env.proxy_ports = None, {}
                    write_known_hosts(env, 0)

            pyspy = peers / "bin" / "py-spy"
            try:
                profile_md = profile_fleetops.profile(
                    project,
                    env.nodes[0],
                    max(sizes),
                    FAB,
                    runner.base_env,
                    WORK,
                    delayed,
                    max(rtts),
                    str(pyspy) if pyspy.exists() else None,
                    cgroups=CGROUPS,
                )
            except Exception as exc:  # the measurements above must still be written
                import traceback

                traceback.print_exc()
                profile_md = f"## Where fleetops' time goes\n\nThe profile failed: {type(exc).__name__}: {exc}\n"
    finally:
        stop_proc(env.proxy)
        stopped = lab.down()
        say(f"bench: lab stopped ({len(stopped)} sshd)")
        if CGROUPS:
            CGROUPS.remove()
    info = machine_info(peers)
    info["peer_check"] = peer_check
    text = render(runs, calib, cli, info, args, profile_md, time.perf_counter() - t_start)
    Path(args.out).write_text(text)
    (WORK / "runs.json").write_text(json.dumps([r.__dict__ for r in runs], indent=0, default=str))
    print(text)
    say(f"bench: wrote {args.out} ({(time.perf_counter() - t_start) / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
