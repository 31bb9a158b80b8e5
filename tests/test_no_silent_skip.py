"""The suite's own guard (tests/conftest.py): under CI=true a skipped test fails the run, and every
run ends with one `summary:` line naming what ran and what was skipped and why, just above pytest's
closing line.

Checked by running a real pytest, in a scratch directory, on a copy of the real conftest and a small
test file that skips in each of the ways pytest offers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parent / "conftest.py"

SKIPPING = """
import pytest

def test_passes():
    pass

def test_skips_in_its_body():
    pytest.skip("no widget on this machine")

@pytest.mark.skipif(True, reason="needs a unicorn")
def test_skipped_by_a_mark():
    pass

@pytest.mark.xfail(strict=True, reason="a known defect, filed")
def test_expected_failure():
    assert False
"""

MODULE_SKIP = """
import pytest

pytest.skip("the whole module needs a lab", allow_module_level=True)

def test_never_collected():
    pass
"""


def run_pytest(
    tmp_path: Path, files: dict[str, str], ci: bool, strict_var: str = "CI=true"
) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {
        k: v for k, v in os.environ.items() if k not in ("CI", "FLEETOPS_NO_SKIP", "PYTEST_ADDOPTS")
    }
    if ci:
        name, value = strict_var.split("=")
        env[name] = value
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            *files,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def closing_lines(proc: subprocess.CompletedProcess) -> tuple[str, str]:
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return lines[-2], lines[-1]


def test_outside_ci_skips_are_allowed_and_the_summary_names_them(tmp_path):
    proc = run_pytest(tmp_path, {"test_skipping.py": SKIPPING}, ci=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary, last = closing_lines(proc)
    # pytest's own line stays last
    assert last.startswith("1 passed, 2 skipped, 1 xfailed in "), proc.stdout
    assert summary.startswith(
        "summary: 2 ran (1 passed, 0 failed), 1 xfailed, 0 xpassed, 2 skipped: "
    ), summary
    assert "1x no widget on this machine" in summary and "1x needs a unicorn" in summary
    assert summary.endswith("(under CI=true these skips would fail the run)")


@pytest.mark.parametrize("strict_var", ["CI=true", "FLEETOPS_NO_SKIP=1"])
def test_under_ci_every_skip_fails_the_run(tmp_path, strict_var):
    proc = run_pytest(tmp_path, {"test_skipping.py": SKIPPING}, ci=True, strict_var=strict_var)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary, last = closing_lines(proc)
    # A skip in the body becomes a failure, a skip mark (decided in setup) an error; the xfail stays
    # one.
    assert last.startswith("1 failed, 1 passed, 1 xfailed, 1 error in "), proc.stdout
    assert f"2 skips turned into failures ({strict_var})" in summary and "0 skipped" in summary, (
        summary
    )
    assert (
        f"skipped under {strict_var}, where a skip fails the run: no widget on this machine"
        in proc.stdout
    )
    assert f"skipped under {strict_var}, where a skip fails the run: needs a unicorn" in proc.stdout


def test_under_ci_a_module_level_skip_fails_the_run_too(tmp_path):
    files = {
        "test_passing.py": "def test_passes():\n    pass\n",
        "test_module_skip.py": MODULE_SKIP,
    }
    local = run_pytest(tmp_path, files, ci=False)
    assert local.returncode == 0 and "1x the whole module needs a lab" in local.stdout, local.stdout
    ci = run_pytest(tmp_path, files, ci=True)
    assert ci.returncode != 0, ci.stdout
    assert (
        "skipped under CI=true, where a skip fails the run: the whole module needs a lab"
        in ci.stdout
    )
    assert "1 skips turned into failures (CI=true)" in ci.stdout
