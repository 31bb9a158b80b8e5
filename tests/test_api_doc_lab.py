"""docs/api.md's example, run against the lab as the page says (from the project directory), prints exactly
the output the page shows."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.lab

PAGE = REPO / "docs" / "api.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", PAGE.read_text(), re.S)


def test_the_pages_example_prints_the_output_it_shows(lab):
    code = blocks("python")[-1]
    proc = subprocess.run([sys.executable, "-c", code], cwd=lab.root, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    print(proc.stdout)
    assert proc.stdout == blocks("text")[-1], proc.stdout
