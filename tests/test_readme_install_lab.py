"""README's install lines, run word for word as a new user would: in a clone without tags (the checkout's files,
committed into a fresh git repository), `scripts/build` then `pipx install dist/fleetops-*.whl`, then
`fleet init ops` and `cd ops`, with a PATH that holds only the system's programs and pipx. pipx is the one in the
dev lock (requirements-dev.lock), given its own home and bin folder here, so nothing of the machine's pipx is
touched. Then the installed `fleet --version` and `fleet --help`. In the slow tier: it builds the wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_install_units import PYPROJECT, install_block
from wheelbuild import clean_env

pytestmark = pytest.mark.lab


def clone_without_tags(where: Path) -> Path:
    """The checkout's tracked and new files (as the working tree has them now) in a new git repository of one
    commit and no tag, as a fresh clone of a repository without tags is."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"],
                            capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    for name in filter(None, listed):
        source, target = REPO / name, where / name
        if not source.is_symlink() and not source.exists():
            continue  # deleted in the working tree, not yet in the index
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    git = ["git", "-C", str(where), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(where)], check=True, timeout=60)
    subprocess.run([*git, "add", "-A"], check=True, timeout=60)
    subprocess.run([*git, "commit", "-q", "-m", "clone"], check=True, timeout=60)
    assert subprocess.run([*git, "tag"], capture_output=True, text=True, timeout=60).stdout == ""
    return where


def test_readmes_install_lines_in_a_clone_without_tags_give_fleet_and_only_fleet(tmp_path):
    lines = install_block()
    upto = next(i for i, line in enumerate(lines) if line.startswith("fleet lab."))
    clone = clone_without_tags(tmp_path / "fleetops")
    tools, bin_dir = tmp_path / "tools", tmp_path / "bin"
    tools.mkdir()
    (tools / "pipx").symlink_to(Path(sys.executable).parent / "pipx")
    (tools / "python3").symlink_to(Path(sys.executable).resolve())  # the system's python3, venv and all
    env = {**clean_env(), "PATH": f"{bin_dir}:{tools}:/usr/local/bin:/usr/bin:/bin",
           "PIPX_HOME": str(tmp_path / "pipx"), "PIPX_BIN_DIR": str(bin_dir), "PIPX_MAN_DIR": str(tmp_path / "man")}
    for name in ("VIRTUAL_ENV", "PIPX_DEFAULT_PYTHON"):
        env.pop(name, None)
    script = "set -euo pipefail\n" + "\n".join(lines[:upto]) + "\n"
    proc = subprocess.run(["bash", "-c", script], cwd=clone, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, f"{script}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    version = PYPROJECT["project"]["version"]
    assert sorted(p.name for p in (clone / "dist").iterdir()) == [f"fleetops-{version}-py3-none-any.whl",
                                                                  f"fleetops_lab-{version}-py3-none-any.whl"]
    assert sorted(p.name for p in bin_dir.iterdir()) == ["fleet"]  # not fab, inv, invoke, pygmentize ...
    project = clone / "ops"
    assert (project / "fabric.yaml").is_file() and (project / "fabfile.py").is_file()
    assert shutil.which("fleet", path=env["PATH"]) == str(bin_dir / "fleet")

    shown = subprocess.run(["fleet", "--version"], cwd=project, capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == f"fleetops {version}", shown.stdout
    helped = subprocess.run(["fleet", "--help"], cwd=project, capture_output=True, text=True, env=env, timeout=120)
    assert helped.returncode == 0 and helped.stderr == "", helped.stderr
    assert "Usage: fleet" in helped.stdout and "patch" in helped.stdout, helped.stdout[:2000]
    venv = Path(env["PIPX_HOME"]) / "venvs" / "fleetops"
    assert os.path.realpath(bin_dir / "fleet") == str((venv / "bin" / "fleet").resolve())
