"""What a result says, as the operator reads it: no raw `None` where a value is missing, and no exit
status beside a result that says another."""

from __future__ import annotations

from fleetops.report.fold import LABEL
from fleetops.report.lines import draw
from fleetops.results import Evidence, Next, Result, Status
from fleetops.results.adhoc import CommandOutput


def said(r: Result, verbose: bool = False) -> str:
    lines, _table = draw(r, verbose)
    return "\n".join(
        "".join("lab01" if text == LABEL else text for text, _ in line) for line in lines
    )


def test_a_call_with_no_exit_status_says_so_not_none():
    r = Result(
        "lab01",
        "facts",
        Status.FAILED,
        "the agent's answer was cut short",
        evidence=Evidence("python3 -m agent facts", None, ["Killed"], 0.4),
    )
    text = said(r)
    assert "None" not in text, text
    assert "command: python3 -m agent facts" in text and "no exit status" in text, text


def test_a_shell_command_that_exited_127_is_not_shown_beside_the_agents_exit_0():
    r = Result(
        "lab01",
        "run",
        Status.FAILED,
        "'nosuchcmd': exit 127",
        evidence=Evidence("python3 -m agent run", 0, [], 0.2),
        payload=CommandOutput(
            "nosuchcmd", 127, "", "bash: line 1: nosuchcmd: command not found\n", False, 0, 0
        ),
    )
    text = said(r)
    assert "exit: 0" not in text, text
    assert "exit 127" in text and "command not found" in text, text


def test_facts_with_no_driver_found_say_so_not_none():
    from fleetops.plans.tables import fact_row

    row = fact_row(
        {
            "os": "Debian 12",
            "python": "3.11.2",
            "packages": {"vllm": "0.16.0", "speculators": None},
            "driver": None,
            "cuda": None,
            "gpu_count": None,
            "gpu_names": [],
            "disk_free_gib": {},
        }
    )
    assert "None" not in " ".join(row), row
    assert row[6] == "not found" and row[7] == "not found" and row[3] == "not installed", row


def test_a_pending_slurm_task_with_no_reason_says_pending_not_none():
    from fleetops.tasks.jobs.slurm.jobs import _row

    job = {"id": "extract-20260101T000000-abcd", "shards": 1}
    row = _row(job, {"state": "pending", "reason": "None", "slurm_id": "12"}, None)
    assert row[2] == "pending", row
    row = _row(job, {"state": "pending", "reason": "Priority", "slurm_id": "12"}, None)
    assert row[2] == "pending (Priority)", row


def test_next_is_never_said_bare():
    from fleetops.report.lines import next_lines

    def text(lines):
        return ["".join(t for t, _ in line) for line in lines]

    assert text(next_lines(Next("", []), "    ")) == []
    said = text(next_lines(Next("", ["fab -H lab01 verify"]), "    "))
    assert said[0].strip() != "next:" and said[1] == "      fab -H lab01 verify", said
    assert text(next_lines(Next("", ["fab -H lab01 verify"]), "")) == [
        "next: run",
        "  fab -H lab01 verify",
    ]


def test_a_table_with_no_rows_is_not_drawn():
    import io

    from rich.console import Console

    from fleetops.report.console import Reporter

    out = io.StringIO()
    rep = Reporter(console=Console(file=out, width=80, highlight=False, soft_wrap=True))
    table = {"title": "lab01: GPUs", "columns": ["gpu", "name", "memory"], "rows": []}
    rep.result(
        Result(
            "lab01", "gpu", Status.FAILED, "UNKNOWN: nvidia-smi not found", data={"table": table}
        )
    )
    said = out.getvalue()
    assert "GPUs" not in said and "memory" not in said, said
    assert said.startswith("lab01 | gpu | failed | UNKNOWN: nvidia-smi not found"), said


def test_runbooks_at_80_columns_name_each_file_whole():
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(repo)}
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", "runbooks"],
        cwd=repo,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    names = sorted(
        p.name for p in (repo / "docs" / "runbooks").glob("*.md") if p.name != "README.md"
    )
    assert names, "no runbooks shipped"
    for name in names:
        assert any(name in line for line in proc.stdout.splitlines()), (name, proc.stdout)
    assert all(len(line.rstrip()) <= 80 for line in proc.stdout.splitlines()), proc.stdout
