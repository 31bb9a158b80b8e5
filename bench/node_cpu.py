"""Node CPU per host and bytes per host of a steady-state `fleet -H @lab patch verify --kinds
grep,compile`, through real SSH on a lab of N nodes, for versions of fleetops side by side.

    python bench/node_cpu.py [--sizes 1,32] [--runs 8] [LABEL=DIR ...] [--rev LABEL=GITREV ...]

Each DIR is a tree holding fleetops/ and remote_scripts/ (e.g. `git archive REV fleetops
remote_scripts | tar -x -C DIR`); a --rev is archived from this repository into a temporary folder.
Without any, the checkout's own. Each version runs as the client (its fleetops first on PYTHONPATH,
under this venv's `fleet` script), so it sends its own agent, launcher and requests. One lab per
size, made in a temporary project (`fleet init`), RTT 0 (sshd on 127.0.0.1, no delay proxy: the
nodes' CPU does not depend on the RTT); a warm-up run per version patches the nodes and uploads its
agent, then the versions alternate run by run, so the machine's load falls on all of them alike.
Beside them, the floor (bench/floor.py, one of its rows): one paramiko connection per host and one
exec of the node's `python -c pass`, what any tool that runs the node's Python once per host costs
there.

Node CPU: the lab's sshd listeners are moved into a cgroup of this process's own (cgroup v1 cpuacct
or v2 cpu.stat; named with this process's pid, so a concurrent bench/run.py keeps its own), which
charges every session process however it ends (sshd, the login shell, the agent and what it starts);
after each run the bench waits until only the listeners are left in it. Bytes: each node's sshd log,
`Transferred: sent S, received R` of the run's connection (S + R per host). Needs root (cgroups),
like bench/run.py's measurement by cgroup.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleetops.lab import Lab  # noqa: E402

FLEET = str(Path(sys.executable).parent / "fleet")
COMMAND = ["-H", "@lab", "patch", "verify", "--kinds", "grep,compile"]
ENV = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
MOVED = re.compile(r"Transferred: sent (\d+), received (\d+)")


class Cgroup:
    """One cgroup of this process's own for the nodes' sshd listeners (their sessions inherit
    it)."""

    def __init__(self) -> None:
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
        v1 = next(
            (
                Path(m[1])
                for m in mounts
                if len(m) > 3 and m[2] == "cgroup" and "cpuacct" in m[3].split(",")
            ),
            None,
        )
        v2 = next((Path(m[1]) for m in mounts if len(m) > 2 and m[2] == "cgroup2"), None)
        root = v1 or v2
        if root is None:
            raise SystemExit(
                "bench/node_cpu.py: no cgroup cpuacct (v1) or cgroup2 mount; it measures by cgroup"
            )
        self.root, self.v1 = root, v1 is not None
        self.dir = root / f"fleetops-node-cpu-{os.getpid()}"
        try:
            self.dir.mkdir()
        except OSError as exc:
            raise SystemExit(
                f"bench/node_cpu.py: cannot make {self.dir} ({exc.strerror}): run it as root"
            ) from None

    def add(self, pid: int) -> None:
        (self.dir / "cgroup.procs").write_text(str(pid))

    def pids(self) -> set[int]:
        return {int(x) for x in (self.dir / "cgroup.procs").read_text().split()}

    def usage_ms(self) -> float:
        if self.v1:
            return int((self.dir / "cpuacct.usage").read_text()) / 1e6
        stat = dict(line.split() for line in (self.dir / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e3

    def settle(self, keep: set[int], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while self.pids() - keep and time.monotonic() < deadline:
            time.sleep(0.02)

    def remove(self) -> None:
        for pid in self.pids():
            try:
                (self.root / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass
        try:
            self.dir.rmdir()
        except OSError as exc:
            print(
                f"bench/node_cpu.py: could not remove {self.dir}: {exc.strerror}", file=sys.stderr
            )


def _bytes_of_last_run(logs: list[Path], seen: dict[Path, int]) -> list[int]:
    out: list[int] = []
    for log in logs:
        text = log.read_text(errors="replace")
        moved = MOVED.findall(text[seen.get(log, 0) :])
        seen[log] = len(text)
        out.extend(int(s) + int(r) for s, r in moved)
    return out


FLOOR = "floor"


def measure(
    size: int, trees: list[tuple[str, Path]], runs: int, top: Path
) -> dict[str, tuple[list, list]]:
    project = top / f"project-{size}"
    subprocess.run([FLEET, "init", str(project)], check=True, capture_output=True, env=ENV)
    lab = Lab(project)
    cg = Cgroup()
    try:
        nodes = lab.up(size, progress=lambda m: None)
        for node in nodes:
            pid = node.pid()
            if pid is None:
                raise SystemExit(f"bench/node_cpu.py: {node.name}'s sshd is not running")
            cg.add(pid)
        keep = cg.pids()
        logs = [node.dir / "sshd.log" for node in nodes]
        hosts = top / f"floor-{size}.json"
        hosts.write_text(
            json.dumps(
                [
                    {
                        "name": node.name,
                        "address": "127.0.0.1",
                        "port": node.port,
                        "user": "root",
                        "identity_file": str(project / ".lab" / "id_ed25519"),
                        "known_hosts": str(project / ".lab" / "known_hosts"),
                        "python": str(node.python),
                    }
                    for node in nodes
                ]
            )
        )
        seen: dict[Path, int] = {}
        out: dict[str, tuple[list, list]] = {
            label: ([], []) for label, _ in [*trees, (FLOOR, None)]
        }
        for rep in range(runs + 1):  # the first: patch, upload each version's agent; not counted
            for label, tree in [*trees, (FLOOR, None)]:
                before = cg.usage_ms()
                argv = (
                    [sys.executable, str(REPO / "bench" / "floor.py"), str(hosts)]
                    if tree is None
                    else [FLEET, *COMMAND]
                )
                proc = subprocess.run(
                    argv,
                    cwd=project,
                    capture_output=True,
                    text=True,
                    env={**ENV, "PYTHONPATH": str(tree or REPO)},
                    timeout=600,
                )
                cg.settle(keep)
                used = cg.usage_ms() - before
                moved = _bytes_of_last_run(logs, seen)
                if proc.returncode != 0:
                    raise SystemExit(
                        f"{label}: `{' '.join(argv)}` exited {proc.returncode}:\n"
                        f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
                    )
                if rep:
                    out[label][0].append(used / size)
                    out[label][1].append(statistics.median(moved) if moved else float("nan"))
        return out
    finally:
        cg.remove()
        lab.down(purge=True)


def _tree_of_rev(rev: str, top: Path, label: str) -> Path:
    tree = top / f"rev-{label}"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "fleetops", "remote_scripts"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,32")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument(
        "versions", nargs="*", help="LABEL=DIR: a tree with fleetops/ and remote_scripts/"
    )
    ap.add_argument(
        "--rev", action="append", default=[], help="LABEL=GITREV: a commit of this repository"
    )
    args = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="node-cpu-") as tmp:
        top = Path(tmp)
        trees = [
            (label, Path(d).expanduser().resolve())
            for label, d in (v.split("=", 1) for v in args.versions)
        ]
        trees += [
            (label, _tree_of_rev(rev, top, label))
            for label, rev in (r.split("=", 1) for r in args.rev)
        ]
        trees = trees or [("checkout", REPO)]
        results = {
            size: measure(size, trees, args.runs, top) for size in map(int, args.sizes.split(","))
        }
    print(
        f"`fleet {' '.join(COMMAND)}`, steady state, RTT 0, "
        f"{args.runs} runs per version and size; node CPU per "
        "host by cgroup (ms: median, mean of the lowest "
        "quartile), bytes per host (sshd's Transferred); load average (1, 5, 15 min) "
        f"{' '.join(f'{x:.1f}' for x in load_before)} before, "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} after"
    )
    for size, by_label in results.items():
        for label, (cpu, moved) in by_label.items():
            low = sorted(cpu)[: max(1, len(cpu) // 4)]
            print(
                f"  N={size:<4d} {label:12s} node CPU {statistics.median(cpu):6.1f} ms/host "
                f"(lowest quartile {statistics.mean(low):6.1f}), "
                f"{statistics.median(moved):8.0f} bytes/host"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
