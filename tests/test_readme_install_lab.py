"""README's install lines, every one, run word for word as a new user would, in one shell: in a
clone without tags (the checkout's files, committed into a fresh git repository), `scripts/build`,
`pipx install dist/fleetops-*.whl`, `fleet init ops`, `cd ops`, then the lab from the installed
wheel's own `fleet lab.up` and the whole job on it (`fleet -H lab01 patch verify extract tail`),
with a PATH that holds only the system's programs and pipx. The lines are read from README.md when
the test runs, so the two cannot drift. pipx is the one in the dev lock (requirements-dev.lock),
given its own home and bin folder here, so nothing of the machine's pipx is touched; pipx's venv is
the clean venv, outside the checkout. Then the installed `fleet --version` and `fleet --help`. In
the slow tier: it builds the wheel and runs a job."""

from __future__ import annotations

import os
import re
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
    """The checkout's tracked and new files (as the working tree has them now) in a new git
    repository of one commit and no tag, as a fresh clone of a repository without tags is."""
    listed = (
        subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"],
            capture_output=True,
            check=True,
            timeout=60,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source, target = REPO / name, where / name
        if not source.is_symlink() and not source.exists():
            continue  # deleted in the working tree, not yet in the index
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    git = [
        "git",
        "-C",
        str(where),
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "-c",
        "commit.gpgsign=false",
    ]
    subprocess.run(["git", "init", "-q", str(where)], check=True, timeout=60)
    subprocess.run([*git, "add", "-A"], check=True, timeout=60)
    subprocess.run([*git, "commit", "-q", "-m", "clone"], check=True, timeout=60)
    assert subprocess.run([*git, "tag"], capture_output=True, text=True, timeout=60).stdout == ""
    return where


def test_readmes_install_lines_in_a_clone_without_tags_install_only_fleet_and_run_the_whole_job(
    lab_base, tmp_path
):
    lines = install_block()
    assert [line.split()[:2] for line in lines[-2:]] == [["fleet", "lab.up"], ["fleet", "-H"]], (
        lines
    )
    # the job, whole
    assert lines[-1].split()[3:] == ["patch", "verify", "extract", "tail"], lines[-1]
    clone = clone_without_tags(tmp_path / "fleetops")
    assert REPO not in clone.parents
    tools, bin_dir = tmp_path / "tools", tmp_path / "bin"
    tools.mkdir()
    (tools / "pipx").symlink_to(Path(sys.executable).parent / "pipx")
    # the system's python3, venv and all
    (tools / "python3").symlink_to(Path(sys.executable).resolve())
    env = {
        **clean_env(),
        "PATH": f"{bin_dir}:{tools}:/usr/local/bin:/usr/bin:/bin",
        "PIPX_HOME": str(tmp_path / "pipx"),
        "PIPX_BIN_DIR": str(bin_dir),
        "PIPX_MAN_DIR": str(tmp_path / "man"),
    }
    for name in ("VIRTUAL_ENV", "PIPX_DEFAULT_PYTHON", "COLUMNS"):
        env.pop(name, None)
    project = clone / "ops"
    script = "set -euo pipefail\n" + "\n".join(lines) + "\n"
    try:
        proc = subprocess.run(
            ["bash", "-c", script], cwd=clone, capture_output=True, text=True, env=env, timeout=1800
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{script}\n{proc.stdout[-6000:]}\n{proc.stderr[-4000:]}"
        # every path the clone's or pipx's
        assert "Traceback" not in out and str(REPO) not in out, out[-6000:]
        # The job ran from the installed wheel and the run ends with the job's summary: the job's
        # own last line, then tail's verdict with the samples and the speed (and its details: the
        # playbook the set chose), then the run's closing line.
        shown = proc.stdout.splitlines()
        assert "lab01 | patch | changed | 2 applied" in shown, proc.stdout[-6000:]
        assert "lab01 | verify | ok | 18/18 checks passed" in shown, proc.stdout[-6000:]
        assert any(
            line.startswith("lab01 | extract | changed | launched job extract-") for line in shown
        )
        verdict = next(n for n, line in enumerate(shown) if line.startswith("lab01 | tail | "))
        assert re.fullmatch(
            r"lab01 \| tail \| ok \| job extract-\S+ succeeded \(exit status 0\); "
            r"(\d+)/\1 samples, \d+ tok/s",
            shown[verdict],
        ), shown[verdict - 2 :]
        assert re.fullmatch(
            r"lab01 \| done: (\d+)/\1 samples, .* tok/s, output \S+", shown[verdict - 2]
        ), shown[verdict - 2 :]
        assert all(line.startswith("    ") for line in shown[verdict + 1 : -1]), shown[
            verdict - 2 :
        ]
        assert re.fullmatch(
            r"1 host: 0 ok, 1 changed, 0 failed, 0 unreachable in \S+ s", shown[-1]
        ), shown[-4:]
        assert (project / "hosts" / "lab.yaml").is_file()

        version = PYPROJECT["project"]["version"]
        assert sorted(p.name for p in (clone / "dist").iterdir()) == [
            f"fleetops-{version}-py3-none-any.whl",
            f"fleetops_lab-{version}-py3-none-any.whl",
        ]
        # not fab, inv, invoke, pygmentize ...
        assert sorted(p.name for p in bin_dir.iterdir()) == ["fleet"]
        assert (project / "fabric.yaml").is_file() and (project / "fabfile.py").is_file()
        assert shutil.which("fleet", path=env["PATH"]) == str(bin_dir / "fleet")
        said = subprocess.run(
            ["fleet", "--version"],
            cwd=project,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert said.returncode == 0, said.stderr
        assert said.stdout.splitlines()[0] == f"fleetops {version}", said.stdout
        helped = subprocess.run(
            ["fleet", "--help"], cwd=project, capture_output=True, text=True, env=env, timeout=120
        )
        assert helped.returncode == 0 and helped.stderr == "", helped.stderr
        assert "Usage: fleet" in helped.stdout and "patch" in helped.stdout, helped.stdout[:2000]
        venv = Path(env["PIPX_HOME"]) / "venvs" / "fleetops"
        assert os.path.realpath(bin_dir / "fleet") == str((venv / "bin" / "fleet").resolve())
    finally:
        if (bin_dir / "fleet").exists() and project.is_dir():  # whatever of the lab came up goes
            down = subprocess.run(
                ["fleet", "lab.down", "--purge"],
                cwd=project,
                capture_output=True,
                text=True,
                env=env,
                timeout=300,
            )
            assert down.returncode == 0, down.stdout + down.stderr
