"""CPU and memory of the processes a run involves: /proc readings, the child-subreaper reaping of
Ansible's ssh masters, the client tree's memory sampler, and CPU accounting by cgroup (CpuCgroups)
with the per-process method as its fallback. `spawn` starts a process in its role's cgroup when the
bench measures by cgroup.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
import time
from pathlib import Path

from benchpaths import CLK, say


def set_child_subreaper() -> None:
    """Orphans of our children (Ansible's backgrounded ssh ControlPersist masters) become our
    children, so their CPU and memory can be collected with wait4 instead of vanishing into init."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        say("warning: PR_SET_CHILD_SUBREAPER failed; Ansible's ssh masters will not be counted")


def proc_cpu(pid: int, children: bool = True) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = (
        int(fields[11]) + int(fields[12]) + ((int(fields[13]) + int(fields[14])) if children else 0)
    )
    return ticks / CLK


def busy_cpu() -> float:
    values = list(map(int, Path("/proc/stat").read_text().splitlines()[0].split()[1:]))
    return (sum(values) - values[3] - values[4]) / CLK


def live_tree_cpu(roots: list[int], exclude: set[int] = frozenset()) -> float:
    """CPU of the live descendants of `roots` (each with its own reaped children), not of the
    roots."""
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
                parent[int(entry.name)] = int(
                    Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1]
                )
            except (OSError, ValueError, IndexError):
                pass
    return parent


def descendants(root: int) -> list[int]:
    parent = _parents()
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


def reap_adopted(
    exclude: set[int], timeout: float = 3.0, expect: int = 0
) -> tuple[float, int, int]:
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
    """CPU accounting by cgroup: the kernel charges every process in a cgroup, however short-lived,
    however it was reparented (double-forked, reaped by init or by nobody yet). The per-process
    method (the listeners' reaped children, /proc/PID/stat) missed most of the nodes' CPU: a
    re-measurement with cgroup v1 cpuacct found 4.7-6.2 CPU-s of node CPU for fleetops at N = 32
    where it had counted 1.82 s.

    One cgroup per role (bench-nodes: the lab's sshd listeners, their sessions inherit it;
    bench-client: the measured tool, started in it; bench-proxy: the delay proxy). cgroup v1 cpuacct
    (cpuacct.usage, ns) if mounted, else cgroup v2 (cpu.stat usage_usec, present in every v2
    cgroup). None where neither is writable (not root, no cgroupfs): the bench then falls back to
    the per-process method and says so."""

    ROLES = ("nodes", "client", "proxy")

    def __init__(self, root: Path, version: int) -> None:
        self.root, self.version = root, version
        self.dirs = {role: root / f"bench-{role}" for role in self.ROLES}

    @property
    def method(self) -> str:
        return (
            f"cgroup v{self.version} "
            f"({'cpuacct.usage' if self.version == 1 else 'cpu.stat usage_usec'})"
        )

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
                say(
                    f"bench: cgroup v{version} at {root} not usable ({exc}); trying the next method"
                )
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
        """For Popen(preexec_fn=...): the child joins the cgroup before it execs (its descendants
        inherit). The file is opened here, in the parent: the child only does one write(2)."""
        fd = os.open(self.dirs[role] / "cgroup.procs", os.O_WRONLY)

        def join() -> None:
            os.write(fd, b"0")  # "0": the writing process itself

        join.fd = fd  # closed by the caller once Popen returned
        return join

    def settle(self, role: str, keep: set[int], timeout: float = 20.0) -> bool:
        """Wait until only `keep` (the listeners) are left in the cgroup: the nodes' sessions finish
        after the client exits (sshd tears a session down once its channel closed)."""
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


CGROUPS: CpuCgroups | None = None  # set by bench/run.py when the machine allows it


def spawn(cmd: list[str], role: str, **kw) -> subprocess.Popen:
    """Popen, in the role's cgroup when measuring by cgroup."""
    join = CGROUPS.preexec(role) if CGROUPS else None
    try:
        return subprocess.Popen(cmd, preexec_fn=join, **kw)
    finally:
        if join:
            os.close(join.fd)
