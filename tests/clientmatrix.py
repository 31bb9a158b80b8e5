"""The client on each Python it supports: the wheel and requirements-dev.lock in a fresh venv made
by that Python (pyenv's, ~/.pyenv/versions/3.X.*), then the client's tests that need no lab run
there: the fast tier but LEFT_OUT, with hypothesis at its `dev` count (the suite's own Python runs
the full count). One test file per Python (test_client_matrix_py3XX.py), so pytest-xdist spreads
them over its workers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NO_SKIP, REPO
from wheelbuild import clean_env, make_venv, the_lab_wheel, the_wheel

# pyproject's requires-python and classifiers, the README
CLIENT_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
# Left out here, run on the suite's own Python: pytest checking pytest, the diff engine's fuzzer
# (pure string logic; a fifth of the tier's time), and the agent's house rules, which read the
# checkout's import graph of the top-level remote_scripts (the installed wheel names the same files
# fleetops.agent).
LEFT_OUT = (
    "tests/test_suite_tiers.py",
    "tests/test_no_silent_skip.py",
    "tests/test_diff_engine.py",
    "tests/test_agent_house_units.py",
)
PYENV = Path.home() / ".pyenv" / "versions"


def interpreter(version: str) -> Path | None:
    """The newest pyenv build of `version` (3.12 -> ~/.pyenv/versions/3.12.N/bin/python), if any."""
    found = [
        p
        for p in PYENV.glob(f"{version}.*/bin/python")
        if re.fullmatch(rf"{re.escape(version)}\.\d+", p.parent.parent.name)
    ]
    return max(found, key=lambda p: int(p.parent.parent.name.rsplit(".", 1)[1]), default=None)


def run_client_tests(version: str, tmp_path: Path) -> None:
    assert version in CLIENT_PYTHONS and f"{sys.version_info[0]}.{sys.version_info[1]}" != version
    python = interpreter(version)
    if python is None:
        why = f"no Python {version} under {PYENV} (pyenv install {version})"
        if NO_SKIP:
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    venv_python = make_venv(
        python,
        tmp_path / "venv",
        the_wheel(tmp_path / "dist"),
        "requirements-dev.lock",
        the_lab_wheel(tmp_path / "dist"),
    )  # the tests bring up lab nodes
    # -I: not the working directory's (the checkout's) fleetops, the installed one.
    probe = subprocess.run(
        [
            str(venv_python),
            "-I",
            "-c",
            "import sys, fleetops; print(fleetops.__file__); print('%d.%d' % sys.version_info[:2])",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    where, running = probe.stdout.split()
    assert running == version and Path(where).is_relative_to(tmp_path / "venv"), probe.stdout
    # The venv's pytest script puts its own bin/ first on sys.path, not the working directory: the
    # tests import the installed fleetops (the programs they start get the checkout's PYTHONPATH, as
    # on the suite's Python).
    env = {**clean_env(), "HYPOTHESIS_PROFILE": "dev"}
    ignore = [arg for path in LEFT_OUT for arg in ("--ignore", path)]
    proc = subprocess.run(
        [
            str(venv_python.parent / "pytest"),
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "not lab and not base_venv and not matrix",
            *ignore,
            "tests",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"the client's tests on Python {version} ({python}):\n{tail}"
    summary = re.search(
        r"^summary: (\d+) ran \((\d+) passed, (\d+) failed\), .*?(\d+) skipped", proc.stdout, re.M
    )
    assert summary and int(summary.group(3)) == 0 and int(summary.group(4)) == 0, tail
    assert int(summary.group(2)) >= 850, tail  # the tier, not a handful
