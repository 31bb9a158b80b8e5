"""Where the bench keeps things, which tools it runs, and the snapshot of fleetops it measures.

Stdlib only: bench/run.py imports it before fleetops is importable (it checks the interpreter, then
puts the snapshot first on sys.path).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
WORK = BENCH / ".work"
# Others edit the repo while the bench runs: it measures a snapshot of fleetops taken at its start
# (the fab runs get it first on PYTHONPATH; fleetops' editable install is found after it).
SNAPSHOT = WORK / "snapshot"
SNAPSHOT_PARTS = ("fleetops", "remote_scripts", "fabfile.py", "fabric.yaml", "playbooks")
SNAPSHOT_HEAD = ""  # set by take_snapshot(): the git commit and the uncommitted files it copied
SNAPSHOT_DIRTY = ""

PLAYBOOK = SNAPSHOT / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml"
PEER_PACKAGES = ["ansible-core", "pyinfra"]
# the profile's sampler (benchmark-only too); the profile skips it if missing
PROFILER_PACKAGES = ["py-spy"]
CLK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1
# fleetops' program (the real script, not a pyenv shim)
FAB = str(Path(sys.executable).parent / "fleet")
# The measured fleetops run: its arguments after the program (every table and profile runs the same
# one).
PATCH_VERIFY = ("-H", "@bench", "patch", "verify", "--kinds", "grep,compile")

TOOLS = [  # (key, label), in the order they alternate within a repetition
    ("fo_pv", "fleetops `patch verify --kinds grep,compile`"),
    ("fo_check", "fleetops `patch --check`"),
    ("ansible", "Ansible playbook (3 shell tasks)"),
    ("pyinfra", "pyinfra deploy (3 server.shell)"),
    ("fabric", "Fabric ThreadingGroup script (3 group.run)"),
    # Not a peer: the least any tool that runs the node's Python once per host can cost
    # (bench/floor.py)
    ("floor", "bare paramiko: 1 connection + 1 exec of `python -c pass` per host (node-CPU floor)"),
]
LABEL = dict(TOOLS)
# The rows the targets are judged on (N = 32 and N = 1 at 50 ms): `--targets` runs only these.
TARGET_TOOLS = ("fo_pv", "pyinfra", "fabric")


def say(msg: str) -> None:
    print(msg, flush=True)


def need_project_venv() -> None:
    """Stop before writing anything when this interpreter is not fleetops' venv: `python3
    bench/run.py` with a system python used to copy the snapshot and then fail with `No module named
    'invoke'`."""
    import importlib.util

    missing = [
        m for m in ("invoke", "fabric", "paramiko", "yaml") if importlib.util.find_spec(m) is None
    ]
    fab = Path(sys.executable).parent / "fleet"
    if missing or not fab.exists():
        what = f"modules {', '.join(missing)}" if missing else f"the fleet script beside it ({fab})"
        venv_python = REPO / ".venv" / "bin" / "python"
        print(
            f"bench/run.py: {sys.executable} is not fleetops' venv (it lacks {what}); nothing "
            "was written.\nRun it with the project's venv python:\n    .venv/bin/python "
            f"bench/run.py {' '.join(sys.argv[1:])}".rstrip()
            + "\n"
            + (
                ""
                if venv_python.exists()
                else "(no .venv yet: ./scripts/lab-demo or bash scripts/setup makes it)\n"
            ),
            file=sys.stderr,
            end="",
        )
        sys.exit(2)


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
    # Byte-compiled, as pip leaves an installed wheel (and as the peers and fleetops' dependencies
    # are here): this machine sets PYTHONDONTWRITEBYTECODE=1, so an uncompiled snapshot would
    # recompile fleetops' sources on every run (~0.17 s of client CPU per `fab`, measured) and no
    # peer pays that.
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(SNAPSHOT)], check=True, capture_output=True
    )
    sys.path.insert(0, str(SNAPSHOT))
