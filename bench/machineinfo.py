"""The machine a bench run ran on, and what it measured (versions of every tool, the snapshot's git
commit)."""

from __future__ import annotations

import datetime as dt
import platform
import subprocess
from pathlib import Path

import benchpaths
from benchpaths import NCPU, REPO


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
    head = benchpaths.SNAPSHOT_HEAD or out(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = benchpaths.SNAPSHOT_DIRTY
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
