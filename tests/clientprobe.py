"""One harness for the client start-up tests (test_client_imports_units.py,
test_client_startup_units.py): a fresh Python running a probe against this checkout, and `fleet`'s
entry point run under `python -X importtime`, which names every module the process imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

# paramiko, cryptography and Fabric's connection code: what only the paramiko transport needs
SSH_MODULES = ("paramiko", "cryptography", "fabric.connection", "fabric")


def run_python(
    *argv: str, cwd: Path = REPO, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python ARGV...` with this checkout first on the path."""
    return subprocess.run(
        [sys.executable, *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO)},
    )


def fleet_imports(
    argv: list[str], cwd: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run the installed program's entry point with argv (argv[0] is the program's name), and the
    modules it imported."""
    probe = f"import sys\nsys.argv = {argv!r}\nfrom fleetops.entry import main\nmain()\n"
    proc = run_python("-X", "importtime", "-c", probe, cwd=cwd, env=env)
    names = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    assert "fleetops.entry" in names, proc.stderr[-2000:]
    return proc, names


def ssh_code(names: set[str]) -> list[str]:
    """The SSH_MODULES (and their submodules) among these module names."""
    return sorted(n for n in names if any(n == m or n.startswith(m + ".") for m in SSH_MODULES))


def loopback_project(root: Path) -> Path:
    """A project whose one inventory host, n1, is on loopback where nothing listens (a run reaches
    its connection attempt and reports it unreachable)."""
    (root / "fabfile.py").write_text("from fleetops.fab.tasks import ns  # noqa: F401\n")
    (root / "fabric.yaml").write_text(
        "tasks:\n  executor_class: fleetops.fab.executor.FleetExecutor\n"
        "fleetops:\n  inventory: hosts\n"
    )
    (root / "hosts").mkdir()
    (root / "hosts" / "lab.yaml").write_text(
        "hosts:\n  n1:\n    address: 127.0.0.1\n    port: 9\n    user: nobody\n"
        f"    known_hosts: {os.devnull}\n"
    )
    return root
