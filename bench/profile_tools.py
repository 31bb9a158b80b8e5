"""What the profile's parts share: where the measured fleetops lives, a timed subprocess, `-X
importtime`."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path


def src_root() -> Path:
    """Where the fleetops being measured lives (bench/run.py's snapshot, or the checkout)."""
    import fleetops

    return Path(fleetops.__file__).resolve().parent.parent


def timed_run(
    cmd: list[str], cwd: Path, env: dict, timeout: float = 300
) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall s, CPU s of the child, the finished process)."""
    t = time.perf_counter()
    r0 = os.times()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    r1 = os.times()
    return (
        time.perf_counter() - t,
        (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system),
        proc,
    )


def importtime(text: str) -> tuple[float, dict[str, float]]:
    """Total and per-top-level-package self time (s) from -X importtime output."""
    per: dict[str, float] = {}
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if not m:
            continue
        self_us, name = int(m.group(1)), m.group(4)
        top = name.split(".")[0]
        per[top] = per.get(top, 0.0) + self_us / 1e6
        total += self_us / 1e6
    return total, per


def module_times(text: str, pattern: str) -> dict[str, float]:
    """Self time (s) of each module whose name matches `pattern` (a regex) in -X importtime
    output."""
    mods = {}
    for line in text.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(" + pattern + ")", line)
        if m:
            mods[m.group(4)] = int(m.group(1)) / 1e6
    return mods


def fmt_pkgs(per: dict[str, float], total: float, k: int = 8) -> str:
    top = sorted(per.items(), key=lambda kv: -kv[1])[:k]
    return (
        ", ".join(f"{name} {sec * 1e3:.0f} ms" for name, sec in top)
        + f" (all imports {total * 1e3:.0f} ms)"
    )
