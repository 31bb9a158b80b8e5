"""fleetops as a team installs it: the wheel (built from an sdist, as a release) and the lab's own
wheel, installed into a fresh venv outside the checkout with the locked dependencies
(requirements.lock, hashes checked), `fleet init` in an empty folder outside the checkout, the lab
brought up from there (it reuses the cached base venv) and the whole job, `patch verify extract
tail`, run against it, with no checkout on sys.path. Then Fabric's own `fab` in the same project."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from wheelbuild import clean_env, make_venv, the_lab_wheel, the_wheel

pytestmark = pytest.mark.lab


def test_the_wheel_installed_outside_the_checkout_inits_a_project_and_patches_a_lab_node(
    lab_base, tmp_path
):
    assert REPO not in tmp_path.parents
    wheel = the_wheel(tmp_path / "dist")
    python = make_venv(
        Path(sys.executable).resolve(),
        tmp_path / "venv",
        wheel,
        "requirements.lock",
        the_lab_wheel(tmp_path / "dist"),
    )
    venv_bin = python.parent
    env = clean_env()

    def sh(cwd: Path, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*argv], cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout
        )

    # The installed package, not the checkout: where Python finds it from the project, and no path
    # file (an editable install's .pth) leading back.
    work = tmp_path / "work"
    work.mkdir()
    probe = sh(
        work,
        str(python),
        "-c",
        "import json, sys, importlib.util, fleetops.agent, fleetops.lab; "
        "print(json.dumps([fleetops.agent.__file__, fleetops.lab.__file__, sys.path, "
        "importlib.util.find_spec('remote_scripts') is None]))",
    )
    assert probe.returncode == 0, probe.stderr
    agent_file, lab_file, path, no_top_level_agent = json.loads(probe.stdout)
    venv = tmp_path / "venv"
    assert Path(agent_file).is_relative_to(venv) and Path(lab_file).is_relative_to(venv), (
        probe.stdout
    )
    assert no_top_level_agent, "the wheel installs a top-level remote_scripts"
    assert not [p for p in path if p and Path(p).resolve().is_relative_to(REPO)], path
    pth = [f for f in venv.glob("lib/python*/site-packages/*.pth") if str(REPO) in f.read_text()]
    assert not pth, pth

    version = re.match(r"fleetops-([^-]+)-", wheel.name).group(1)  # type: ignore[union-attr]
    shown = sh(work, str(venv_bin / "fleet"), "--version")
    assert shown.returncode == 0 and shown.stdout.splitlines()[0] == f"fleetops {version}", (
        shown.stdout
    )

    made = sh(work, str(venv_bin / "fleet"), "init", "ops")
    assert made.returncode == 0, made.stdout + made.stderr
    project = work / "ops"
    books = sh(project, str(venv_bin / "fleet"), "runbooks", "--json")  # shipped with the package
    assert books.returncode == 0, books.stderr
    files = [Path(b["file"]) for b in json.loads(books.stdout)]
    assert len(files) >= 8 and all(f.is_relative_to(venv) and f.is_file() for f in files), files
    try:
        up = sh(project, str(venv_bin / "fleet"), "lab.up", timeout=1200)
        assert up.returncode == 0, up.stdout + up.stderr
        assert (project / "hosts" / "lab.yaml").is_file()
        # The whole job, -v: every check shown
        card = sh(
            project,
            str(venv_bin / "fleet"),
            "-H",
            "lab01",
            "-v",
            "patch",
            "verify",
            "extract",
            "tail",
        )
        assert card.returncode == 0, card.stdout[-4000:] + card.stderr[-4000:]
        assert "lab01 | patch | changed | 2 applied" in card.stdout, card.stdout[-4000:]
        assert "lab01 | verify | ok | 18/18 checks passed" in card.stdout, card.stdout[-4000:]
        assert re.search(
            r"^lab01 \| tail \| ok \| job extract-\S+ succeeded "
            r"\(exit status 0\); (\d+)/\1 samples, \d+ tok/s$",
            card.stdout,
            re.M,
        ), card.stdout[-4000:]
        assert "Traceback" not in card.stdout + card.stderr
        for kind in ("[probe]", "[callsites]", "[import]", "[grep]"):  # the deep checks too
            assert kind in card.stdout, kind
        # every path is the project's or the venv's
        assert str(REPO) not in card.stdout + card.stderr
        # Fabric's own fab, from the same venv and project: the one-line fabfile gives it the same
        # tasks.
        fab = sh(project, str(venv_bin / "fab"), "-H", "lab01", "verify", "--kinds", "grep,compile")
        assert fab.returncode == 0 and "lab01 | verify | ok" in fab.stdout, fab.stdout + fab.stderr
        assert "from fabric.main import program" in (venv_bin / "fab").read_text()
    finally:
        down = sh(project, str(venv_bin / "fleet"), "lab.down", "--purge")
        assert down.returncode == 0, down.stdout + down.stderr
