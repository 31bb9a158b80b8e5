"""The wheel a release builds (sdist first, then the wheel from it) holds fleetops/py.typed, so a type checker
reads fleetops' hints in a project that installed it, the client lock (fleetops/requirements.lock) and the
license file. In the slow tier: it builds the wheel."""

from __future__ import annotations

import re
import zipfile

import pytest
from conftest import REPO
from wheelbuild import the_wheel

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
    version = re.search(r"^## \[(\d+\.\d+\.\d+)\]", (REPO / "CHANGELOG.md").read_text(), re.M).group(1)
    assert wheel.name == f"fleetops-{version}-py3-none-any.whl"
    assert f"fleetops-{version}.dist-info/licenses/LICENSE" in archive.namelist()
    metadata = archive.read(f"fleetops-{version}.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
