"""`fleet init -h` / `--help` asks for init's help: Invoke's positional DIRECTORY took the flag as
its value and made a project named `--help`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.parametrize(
    "words", [["init", "--help"], ["init", "-h"], ["init", "--force", "--help"]], ids=" ".join
)
def test_init_with_a_help_flag_prints_inits_help_and_makes_nothing(words, tmp_path):
    probe = (
        f"import sys\nsys.argv = {['fleet', *words]!r}\nfrom fleetops.entry import main\nmain()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage: fleet [--core-opts] init [--options]"), proc.stdout[:500]
    assert "--force" in proc.stdout
    assert list(tmp_path.iterdir()) == []
