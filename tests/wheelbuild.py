"""The wheel as a release would build it, and venvs that install it the way the README says: the
locked dependencies (every file checked against its sha256), then the wheel without dependencies.
Shared by test_install_wheel_lab.py and the client matrix (clientmatrix.py,
tests/test_client_matrix_py3*.py)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import REPO

BUILD_LOCK = Path(tempfile.gettempdir()) / "fleetops-wheel-build.lock"


def clean_env() -> dict[str, str]:
    """The environment with nothing that points Python at the checkout."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")
    }
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def tree_key() -> str | None:
    """What the checkout holds now (commit, changed and new files, their diff), or None outside a
    git checkout."""
    digest = hashlib.sha256()
    for args in (
        ["rev-parse", "HEAD"],
        ["status", "--porcelain", "--untracked-files=all"],
        ["diff", "HEAD"],
    ):
        proc = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, timeout=60)
        if proc.returncode != 0:
            return None
        digest.update(proc.stdout)
    return digest.hexdigest()[:16]


def the_wheel(scratch: Path, project: str = "fleetops") -> Path:
    """The checkout's wheel (`project`: "fleetops", or "fleetops-lab", the lab's own wheel), built
    once for what the checkout holds now and shared by the tests (and pytest workers) that install
    it; outside a git checkout, built into `scratch` each time."""
    key = tree_key()
    out = (Path(tempfile.gettempdir()) / "fleetops-wheels" / key if key else scratch) / project
    with open(BUILD_LOCK, "w") as lock:
        # two builds at once would share the checkout's fleetops.egg-info
        fcntl.flock(lock, fcntl.LOCK_EX)
        wheels = sorted(out.glob(f"{project.replace('-', '_')}-*-py3-none-any.whl"))
        return wheels[0] if len(wheels) == 1 else build_wheel(out, project)


def the_lab_wheel(scratch: Path) -> Path:
    return the_wheel(scratch, "fleetops-lab")


def build_wheel(out: Path, project: str = "fleetops") -> Path:
    """sdist first, then the wheel from the unpacked sdist (python -m build), as a release is made:
    a file the sdist leaves out is missing from the wheel too, and the version is the project's
    pyproject.toml's."""
    if out.exists():
        for old in out.iterdir():
            old.unlink()
    out.mkdir(parents=True, exist_ok=True)
    folder = REPO if project == "fleetops" else REPO / project
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(folder)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=600,
    )
    assert proc.returncode == 0, (
        f"python -m build failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    wheels = sorted(out.glob(f"{project.replace('-', '_')}-*-py3-none-any.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def make_venv(python: str | Path, where: Path, wheel: Path, lock: str, *more: Path) -> Path:
    """A venv at `where` made by `python`, with `lock`'s pins and then the wheel (and the wheels in
    `more`: the lab's); its python's path."""
    subprocess.run(
        [str(python), "-m", "venv", str(where)], check=True, capture_output=True, timeout=300
    )
    venv_python = where / "bin" / "python"
    pip = [str(venv_python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for args in (
        ["--require-hashes", "-r", str(REPO / lock)],
        ["--no-deps", str(wheel), *map(str, more)],
    ):
        proc = subprocess.run(
            [*pip, *args], capture_output=True, text=True, env=clean_env(), timeout=600
        )
        assert proc.returncode == 0, (
            f"pip install {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return venv_python
