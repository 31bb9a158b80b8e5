"""The wheel a release builds (sdist first, then the wheel from it) holds fleetops/py.typed, so a
type checker reads fleetops' hints in a project that installed it, the client lock
(fleetops/requirements.lock) and the license file; one top-level package, fleetops, with the node
agent inside (fleetops/agent) and the lab outside: the lab is a wheel of its own (fleetops-lab, the
`lab` extra), and `fleet lab.*` without it says how to add it. Both wheels carry CHANGELOG's newest
release as their version. In the slow tier: it builds the wheels."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO
from wheelbuild import clean_env, make_venv, the_lab_wheel, the_wheel

pytestmark = pytest.mark.lab


def test_the_wheel_ships_py_typed(tmp_path):
    wheel = the_wheel(tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    assert "fleetops/py.typed" in names, sorted(n for n in names if n.startswith("fleetops/"))[:40]
    assert "fleetops/api.py" in names


def test_the_wheel_carries_the_client_lock_the_license_and_the_changelogs_version(tmp_path):
    wheel = the_wheel(tmp_path / "dist")
    archive = zipfile.ZipFile(wheel)
    assert archive.read("fleetops/requirements.lock") == (REPO / "requirements.lock").read_bytes()
    version = re.search(
        r"^## \[(\d+\.\d+\.\d+)\]", (REPO / "CHANGELOG.md").read_text(), re.M
    ).group(1)
    assert wheel.name == f"fleetops-{version}-py3-none-any.whl"
    assert f"fleetops-{version}.dist-info/licenses/LICENSE" in archive.namelist()
    metadata = archive.read(f"fleetops-{version}.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()


def newest_release() -> str:
    return re.search(r"^## \[(\d+\.\d+\.\d+)\]", (REPO / "CHANGELOG.md").read_text(), re.M).group(1)


def test_the_wheel_holds_one_top_level_package_with_the_agent_inside_and_no_lab(tmp_path):
    version = newest_release()
    archive = zipfile.ZipFile(the_wheel(tmp_path / "dist"))
    names = archive.namelist()
    assert {n.split("/")[0] for n in names} == {"fleetops", f"fleetops-{version}.dist-info"}
    assert archive.read(f"fleetops-{version}.dist-info/top_level.txt").decode().split() == [
        "fleetops"
    ]
    agent = sorted(n[len("fleetops/agent/") :] for n in names if n.startswith("fleetops/agent/"))
    checkout = sorted(
        p.relative_to(REPO / "remote_scripts").as_posix()
        for p in (REPO / "remote_scripts").rglob("*.py")
        if "__pycache__" not in p.parts
    )
    assert agent == checkout  # the agent's every module, as the checkout's remote_scripts/ has it
    assert not [n for n in names if n.startswith("fleetops/lab/")]
    metadata = archive.read(f"fleetops-{version}.dist-info/METADATA").decode().splitlines()
    assert f"Version: {version}" in metadata
    assert {
        "Provides-Extra: lab",
        f'Requires-Dist: fleetops-lab=={version}; extra == "lab"',
    } <= set(metadata)


def test_the_lab_wheel_holds_the_lab_alone_and_needs_this_fleetops(tmp_path):
    version = newest_release()
    archive = zipfile.ZipFile(the_lab_wheel(tmp_path / "dist"))
    names = archive.namelist()
    assert {n.split("/")[0] for n in names} == {"fleetops", f"fleetops_lab-{version}.dist-info"}
    ours = sorted(n for n in names if n.startswith("fleetops/"))
    # never fleetops/__init__.py
    assert ours and all(n.startswith("fleetops/lab/") for n in ours), ours
    lab = REPO / "fleetops" / "lab"
    shipped = sorted(
        f"fleetops/lab/{p.relative_to(lab).as_posix()}"
        for p in lab.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert ours == shipped  # its modules and the recordings the simulated GPUs replay
    metadata = archive.read(f"fleetops_lab-{version}.dist-info/METADATA").decode().splitlines()
    assert f"Version: {version}" in metadata and f"Requires-Dist: fleetops=={version}" in metadata


def test_fleet_lab_without_the_lab_says_how_to_add_it(tmp_path):
    python = make_venv(
        Path(sys.executable).resolve(),
        tmp_path / "venv",
        the_wheel(tmp_path / "dist"),
        "requirements.lock",
    )
    fleet = str(python.parent / "fleet")
    made = subprocess.run(
        [fleet, "init", "ops"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    work = tmp_path / "ops"
    for argv in (["lab.up"], ["lab.status"]):
        proc = subprocess.run(
            [fleet, *argv], cwd=work, capture_output=True, text=True, env=clean_env(), timeout=300
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
        assert "the lab is not installed with this fleetops" in proc.stderr, proc.stderr
        assert "pipx inject fleetops dist/fleetops_lab-*.whl" in proc.stderr, proc.stderr
    listed = subprocess.run(
        [fleet, "--list"], cwd=work, capture_output=True, text=True, env=clean_env(), timeout=300
    )
    assert listed.returncode == 0 and "lab.up" in listed.stdout, listed.stdout + listed.stderr


def test_the_stand_in_names_every_lab_task():
    from fleetops.fab.labhint import missing_lab
    from fleetops.lab.tasks import collection

    assert sorted(missing_lab().task_names) == sorted(collection().task_names)
