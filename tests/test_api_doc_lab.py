"""docs/api.md's examples, each run against a fresh lab as the page says (from the project
directory): each prints exactly the output the page shows after it, and one the page shows no output
for prints nothing (quiet=True, the default, prints nothing)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.lab

PAGE = REPO / "docs" / "api.md"


def examples() -> list[tuple[str, str]]:
    """Each python block with the text block shown after it, before the next python block ("" when
    none)."""
    found = re.findall(r"```(python|text)\n(.*?)```", PAGE.read_text(), re.S)
    pairs: list[tuple[str, str]] = []
    for lang, body in found:
        if lang == "python":
            pairs.append((body, ""))
        else:
            assert pairs and not pairs[-1][1], f"a text block with no example before it:\n{body}"
            pairs[-1] = (pairs[-1][0], body)
    return pairs


def test_the_page_has_its_examples():
    pairs = examples()
    assert len(pairs) >= 3 and sum(1 for _, out in pairs if out) >= 2, pairs
    assert any("quiet=False" in code for code, _ in pairs)


@pytest.mark.parametrize("index", range(len(examples())))
def test_each_example_prints_the_output_the_page_shows(lab, index):
    for node in lab.nodes():  # every example starts from a fresh lab, as the page says
        lab.reset_packages(node)
        shutil.rmtree(node.state_dir / "backups", ignore_errors=True)
    code, shown = examples()[index]
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=lab.root,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), "FLEETOPS_NO_LIVE": "1"},
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    print(proc.stdout)
    assert proc.stdout == shown, proc.stdout
    assert proc.stderr == "", proc.stderr
