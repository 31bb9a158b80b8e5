"""The node Pythons fleetops supports, and where this machine has them: for lab nodes of another
Python than the client's (`fab lab.up --python 3.9`: which interpreter each node's venv is made
from) and for the tests that run the agent under each of them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .common import LabError

# What README states for nodes; the agent refuses anything older than the first
# (bootstrap.OLDEST_PYTHON).
NODE_PYTHONS = ("3.9", "3.10", "3.11", "3.12", "3.13")


def pyenv_versions() -> Path:
    return Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"


def _release(name: str) -> tuple[int, ...]:
    parts = name.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else ()


def find_python(spec: str) -> Path | None:
    """An interpreter for `spec`: a path to one as given, or for a version X.Y the newest pyenv
    build of it ($PYENV_ROOT or ~/.pyenv: versions/X.Y.*/bin/python), else pythonX.Y on PATH; any
    other word, a command on PATH. None when there is none."""
    if "/" in spec:
        path = Path(spec).expanduser()
        return path if path.is_file() and os.access(path, os.X_OK) else None
    if len(_release(spec)) != 2:
        found = shutil.which(spec)
        return Path(found) if found else None
    builds = [
        p
        for p in pyenv_versions().glob(f"{spec}.*")
        if _release(p.name)[:2] == _release(spec)[:2] and len(_release(p.name)) == 3
    ]
    for build in sorted(builds, key=lambda p: _release(p.name), reverse=True):
        python = build / "bin" / "python"
        if python.is_file() and os.access(python, os.X_OK):
            return python
    found = shutil.which(f"python{spec}")
    return Path(found) if found else None


def python_for(spec: str) -> Path:
    """find_python, or LabError saying where it looked and what to do."""
    found = find_python(spec)
    if found is None:
        where = (
            f"{spec} is not an executable file"
            if "/" in spec
            else f"no {pyenv_versions()}/{spec}.*/bin/python and no python{spec} on PATH"
            if len(_release(spec)) == 2
            else f"no {spec} on PATH"
        )
        raise LabError(
            f"no Python {spec} for a lab node: {where}; install it (pyenv install {spec}) or give "
            f"the interpreter's path"
        )
    return found


def interpreters(pythons: list[str] | None, count: int) -> list[tuple[str, str]]:
    """(interpreter, its X.Y) for each of `count` nodes: one Python for all, or one per node; [] for
    none."""
    if not pythons:
        return []
    if len(pythons) not in (1, count):
        raise LabError(
            f"{len(pythons)} Pythons for {count} nodes: give one for every node, or one per node "
            f"(--nodes {len(pythons)})"
        )
    found: dict[str, tuple[str, str]] = {}
    for spec in dict.fromkeys(pythons):
        python = python_for(spec)
        proc = subprocess.run(
            [str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise LabError(
                f"{python} (for Python {spec}) did not run: {proc.stderr.strip()[-500:]}"
            )
        found[spec] = (str(python), proc.stdout.strip())
    return [found[pythons[0] if len(pythons) == 1 else pythons[i]] for i in range(count)]
