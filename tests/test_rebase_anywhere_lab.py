"""`rebase --out` anywhere: run from a folder that is not the playbook's, writing the candidate into
a third folder outside the project, against a real lab node. The candidate is whole in itself (its
diffs and a copy of each script it names, every path relative to it) and loads as `patch -p` loads
it; a candidate that cannot be put in place leaves nothing behind, not even its staging folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from fleetops.plans.playbook import load_playbook

pytestmark = pytest.mark.lab
SHIPPED = "speculators-0.3.0-vllm-0.16.yaml"


def rebase(lab, cwd: Path, out: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "fabric",
            "-r",
            str(lab.root),
            "-H",
            "lab01",
            "rebase",
            "-p",
            str(lab.root / "playbooks" / SHIPPED),
            "--out",
            out,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
    )


def test_rebase_out_in_another_folder_writes_a_candidate_that_loads(lab, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    proc = rebase(lab, tmp_path, "elsewhere/cand.yaml")
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both and "internal error" not in both, both
    candidate = tmp_path / "elsewhere" / "cand.yaml"
    assert candidate.is_file(), both
    book = load_playbook(candidate)
    probes = [c for c in book.checks if c["kind"] == "probe"]
    assert probes and all(
        Path(c["script"]).parent == tmp_path / "elsewhere" / "cand" for c in probes
    ), probes
    assert {p.diff_path.parent for p in book.patches} == {tmp_path / "elsewhere" / "cand"}
    assert "script: cand/probe_scheduler.py" in candidate.read_text()
    # no staging left
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == ["cand", "cand.yaml"]


def test_a_candidate_that_cannot_be_put_in_place_leaves_nothing(lab, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "cand").write_text("a file where the candidate's folder goes\n")
    proc = rebase(lab, tmp_path, "elsewhere/cand.yaml")
    both = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in both and "internal error" not in both, both
    assert "no candidate written" in both, both
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == ["cand"], both
