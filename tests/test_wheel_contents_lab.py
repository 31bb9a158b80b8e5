"""The wheel a release builds (sdist first, then the wheel from it) holds fleetops/py.typed, so a type checker
reads fleetops' hints in a project that installed it. In the slow tier: it builds the wheel."""

from __future__ import annotations

import zipfile

import pytest
from wheelbuild import the_wheel

pytestmark = pytest.mark.lab


def test_the_wheel_ships_py_typed(tmp_path):
    wheel = the_wheel(tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    assert "fleetops/py.typed" in names, sorted(n for n in names if n.startswith("fleetops/"))[:40]
    assert "fleetops/api.py" in names
