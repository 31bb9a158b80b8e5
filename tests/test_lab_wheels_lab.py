"""The wheel the lab packs from the base venv's installed speculators (what each lab node's pip
cache holds, so `capture` proves pristine bytes with no index): pip installs it with no index, every
installed file has the base's bytes, the wheel is the same bytes on every build, and a file that no
longer has RECORD's sha256 is refused. The base venv is only read: its files are copied into a
scratch site-packages first."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from fleetops.lab import LabError, site_packages
from fleetops.lab.wheels import build_wheel

pytestmark = pytest.mark.base_venv
WORKER = "speculators/data_generation/custom_worker.py"


@pytest.fixture
def site(lab_base, tmp_path):
    base = site_packages(lab_base)
    copy = tmp_path / "site"
    copy.mkdir()
    shutil.copytree(
        base / "speculators", copy / "speculators", ignore=shutil.ignore_patterns("__pycache__")
    )
    info = next(base.glob("speculators-*.dist-info"))
    shutil.copytree(info, copy / info.name)
    return copy


def test_the_packed_wheel_installs_with_no_index_to_the_base_venvs_very_bytes(
    site, tmp_path, lab_base
):
    wheel = build_wheel(site, "speculators", tmp_path / "w1")
    assert wheel.name == "speculators-0.3.0-py3-none-any.whl"
    assert build_wheel(site, "speculators", tmp_path / "w2").read_bytes() == wheel.read_bytes()
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert (
        not [n for n in names if n.startswith(("../", "/"))]
        and "speculators-0.3.0.dist-info/RECORD" in names
    )
    target = tmp_path / "installed"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    base = site_packages(lab_base)
    files = [p.relative_to(base / "speculators") for p in (base / "speculators").rglob("*.py")]
    assert len(files) > 30
    for rel in files:
        got = (target / "speculators" / rel).read_bytes()
        assert (
            hashlib.sha256(got).hexdigest()
            == hashlib.sha256((base / "speculators" / rel).read_bytes()).hexdigest()
        )


def test_a_file_that_lost_records_sha256_is_no_pristine_copy(site, tmp_path):
    (site / WORKER).write_text((site / WORKER).read_text() + "# edited\n")
    with pytest.raises(LabError, match=f"{site / WORKER} does not have RECORD's sha256"):
        build_wheel(site, "speculators", tmp_path / "w")
    assert not list((tmp_path / "w").iterdir())  # nothing half-written left behind
