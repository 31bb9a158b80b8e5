"""scripts/load-proof runs test modules with a CPU hog beside them and records each one's pass or
fail; the hog (busy loops, one per core unless --hogs) is gone when it ends, whatever the
verdict."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

from conftest import REPO

SCRIPT = REPO / "scripts" / "load-proof"


def run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str], list[int]]:
    out = tmp_path / "record.tsv"
    proc = subprocess.run(
        [str(SCRIPT), "--hogs", "1", "--out", str(out), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = re.search(r"\(pids ([\d ]+)\)", proc.stdout)
    assert said, proc.stdout + proc.stderr
    pids = [int(p) for p in said.group(1).split()]
    return proc, out.read_text().splitlines() if out.exists() else [], pids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_green_module_is_recorded_as_passed_and_the_hog_is_gone(tmp_path):
    proc, record, pids = run(tmp_path, "tests/test_tail_summary_units.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(pids) == 1 and not alive(pids[0])
    assert len(record) == 1, record
    run_no, word, module, took, load, tally = record[0].split("\t")
    assert (run_no, word, module) == ("1", "PASS", "tests/test_tail_summary_units.py")
    assert re.fullmatch(r"\d+s", took) and re.fullmatch(r"load [0-9.]+", load)
    assert re.match(r"\d+ ran \(\d+ passed, 0 failed\)", tally), tally


def test_a_red_module_is_recorded_as_failed_and_the_script_exits_1(tmp_path):
    red = REPO / "tests" / f"test_load_proof_red_{os.getpid()}_units.py"
    red.write_text("def test_red():\n    assert 1 + 1 == 3\n")
    try:
        proc, record, pids = run(tmp_path, "--runs", "2", str(red.relative_to(REPO)))
    finally:
        red.unlink()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert [line.split("\t")[:2] for line in record] == [["1", "FAIL"], ["2", "FAIL"]], record
    assert "FAILED tests/test_load_proof_red_" in proc.stdout
    assert "    E       assert (1 + 1) == 3" in proc.stdout  # why, without opening a log
    kept = sorted(p.name for p in tmp_path.glob("record.tsv.*.log"))
    assert kept == [f"record.tsv.{n}.{red.stem}.log" for n in (1, 2)], kept
    assert not any(alive(p) for p in pids)


def test_the_default_set_is_the_lab_modules_that_went_red_under_load():
    text = SCRIPT.read_text()
    default = re.search(r"modules=\((tests/.*?)\)", text, re.S)
    assert default, text
    modules = shlex.split(default.group(1))
    assert (
        "tests/test_oncall_80_columns_lab.py" in modules
        and "tests/test_interrupt_startup_lab.py" in modules
    )
    assert "tests/test_slurm_lab.py" in modules
    assert all((REPO / m).is_file() and m.endswith("_lab.py") for m in modules), modules


def test_options_are_checked_before_any_hog_starts(tmp_path):
    for args in (["--runs", "x"], ["--bogus"], ["tests/no_such_module.py"]):
        proc = subprocess.run(
            [str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert (
            proc.returncode == 2 and "load-proof: " in proc.stderr and "pids" not in proc.stdout
        ), args
