"""Hostile lab hosts: a real lab node's sshd, whose `python` is a wrapper that execs
hostile_node_agent.py instead of the interpreter. The client connects, checks the host key and
starts "the agent" as for any node; what answers is the hostile script, in the mode written beside
it (`mode`, and `mb` for the floods)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import REPO

HOSTILE = Path(__file__).resolve().parent / "hostile_node_agent.py"


def hostile_inventory(
    lab,
    root: Path,
    modes: dict[str, str],
    mb: int = 400,  # fleetops.lab.Lab
    env: dict[str, str] | None = None,
) -> Path:
    """An inventory: the lab's own hosts, plus one host per name in `modes` on lab01's sshd,
    answering in that mode. `env`: exported by the wrapper before the hostile script starts."""
    node = lab.node("lab01")
    extra = []
    for name, mode in modes.items():
        home = root / name
        home.mkdir(parents=True)
        shutil.copy(HOSTILE, home / HOSTILE.name)
        (home / "mode").write_text(mode + "\n")
        (home / "mb").write_text(f"{mb}\n")
        (home / "state").mkdir(mode=0o700)
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in (env or {}).items())
        wrapper = home / "python"
        wrapper.write_text(
            f"#!/bin/sh\n{exports}exec {shlex.quote(str(node.python))} "
            f"{shlex.quote(str(home / HOSTILE.name))}\n"
        )
        wrapper.chmod(0o755)
        home.chmod(0o755)
        extra += [
            f"  {name}:",
            f"    port: {node.port}",
            f"    python: {wrapper}",
            f"    state_dir: {home / 'state'}",
        ]
    inventory = root / "inventory.yaml"
    inventory.write_text(lab.hosts_file.read_text().rstrip("\n") + "\n" + "\n".join(extra) + "\n")
    return inventory


def fab_with_peak_rss(
    project: Path, *args: str, timeout: float = 300
) -> tuple[subprocess.CompletedProcess, int]:
    """fab run as the only child of a small parent that reports the child's peak RSS (ru_maxrss), in
    bytes. The parent kills fab at `timeout` (nothing of it outlives the test) and the test fails
    saying so."""
    rss_file = project / f".peak-rss-{os.getpid()}"
    code = (
        "import resource, subprocess, sys\ntry:\n    code = subprocess.run(sys.argv[3:], "
        "timeout=float(sys.argv[2])).returncode\nexcept subprocess.TimeoutExpired:\n    code = "
        "124\nopen(sys.argv[1], "
        "'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
        "sys.exit(code)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        code = subprocess.run(
            [
                sys.executable,
                "-c",
                code,
                str(rss_file),
                str(timeout),
                sys.executable,
                "-m",
                "fabric",
                *args,
            ],
            cwd=project,
            stdout=out,
            stderr=err,
            env=env,
            timeout=timeout + 60,
        ).returncode
        out.seek(0)
        err.seek(0)
        proc = subprocess.CompletedProcess(args, code, out.read(), err.read())
    peak_kib = int(rss_file.read_text())
    rss_file.unlink()
    assert code != 124, (
        f"fab {' '.join(args)} ran past {timeout:.0f} s (killed; peak RSS {peak_kib // 1024} MiB)"
    )
    return proc, peak_kib * 1024  # Linux reports ru_maxrss in KiB
