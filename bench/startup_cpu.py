"""The client's start-up CPU: user + system seconds of a whole `fleet --version` process, and the
floors under it.

    .venv/bin/python bench/startup_cpu.py            # fleet --version, python -c pass, invoke
    .venv/bin/python bench/startup_cpu.py --runs 20 --json
    .venv/bin/python bench/startup_cpu.py --tree /tmp/old   # another fleetops: before/after

(`--tree`'s directory from `git archive REV fleetops | tar -x -C /tmp/old`.)

The commands run in a throwaway project (bench/.work/startup-project: a one-line fabfile and one
inventory host on loopback, never contacted: the host task names a host the inventory does not have,
so it ends before connecting). Each command runs `--runs` times (one unmeasured warm-up first, so
the page cache and .pyc files are there), one after another; each run's CPU is the growth of
getrusage(RUSAGE_CHILDREN) across its wait, which counts the child and everything it waited for. The
median is reported, with the lowest and highest. CPU time, not wall time: a busy machine stretches
the wall clock, far less the CPU a process burns. Not a test: run by hand (docs/perf.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
PROJECT = ROOT / "bench" / ".work" / "startup-project"


def project() -> Path:
    (PROJECT / "hosts").mkdir(parents=True, exist_ok=True)
    (PROJECT / "fabfile.py").write_text("from fleetops.fab.tasks import ns  # noqa: F401\n")
    (PROJECT / "fabric.yaml").write_text(
        "tasks:\n  executor_class: fleetops.fab.executor.FleetExecutor\n"
        "fleetops:\n  inventory: hosts\n"
    )
    (PROJECT / "hosts" / "lab.yaml").write_text(
        f"hosts:\n  n1:\n    address: 127.0.0.1\n    port: 9\n    known_hosts: {os.devnull}\n"
    )
    return PROJECT


def commands() -> dict[str, list[str]]:
    fleet = VENV_BIN / "fleet"
    return {
        "fleet --version": [str(fleet), "--version"],
        "python -m fleetops.cli --version": [sys.executable, "-m", "fleetops.cli", "--version"],
        "fleet --help": [str(fleet), "--help"],
        "fleet --list": [str(fleet), "--list"],
        "fleet -H nosuchhost ping": [str(fleet), "-H", "nosuchhost", "ping"],
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import invoke'": [sys.executable, "-c", "import invoke"],
        "python -c 'import fabric'": [sys.executable, "-c", "import fabric"],
    }


def cpu_of(argv: list[str], env: dict[str, str]) -> float:
    """user + system seconds of one run of argv (and its children), from RUSAGE_CHILDREN."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    # the
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=PROJECT, env=env)
    # unknown host's run exits 2
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(argv: list[str], runs: int, env: dict[str, str]) -> dict[str, float]:
    cpu_of(argv, env)  # warm-up, not counted
    samples = [cpu_of(argv, env) for _ in range(runs)]
    return {
        "median_ms": round(statistics.median(samples) * 1000, 1),
        "min_ms": round(min(samples) * 1000, 1),
        "max_ms": round(max(samples) * 1000, 1),
        "runs": runs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs", type=int, default=20, help="measured runs per command (default 20)"
    )
    parser.add_argument(
        "--only", default="", help="comma-separated names of the commands to run (default: all)"
    )
    parser.add_argument(
        "--json", action="store_true", help="one JSON document instead of the table"
    )
    parser.add_argument(
        "--tree",
        default="",
        help="a folder holding another fleetops/ to run instead of the "
        "installed one (put first on PYTHONPATH)",
    )
    opts = parser.parse_args()
    project()
    wanted = {w.strip() for w in opts.only.split(",") if w.strip()}
    env = {**os.environ, "PYTHONPATH": opts.tree} if opts.tree else dict(os.environ)
    results = {
        name: measure(argv, opts.runs, env)
        for name, argv in commands().items()
        if not wanted or name in wanted
    }
    if opts.json:
        print(json.dumps(results, indent=2))
        return 0
    print(
        f"{'command':32} {'median':>8} {'min':>8} {'max':>8}   "
        f"(ms of CPU, user + sys, {opts.runs} runs)"
    )
    for name, row in results.items():
        print(f"{name:32} {row['median_ms']:8.1f} {row['min_ms']:8.1f} {row['max_ms']:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
