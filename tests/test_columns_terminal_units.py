"""What the operator reads at 80 columns in a real terminal (tmux, 80x40), without a lab: every job id, path
and fingerprint whole on the screen, never cut by the terminal or by an ellipsis."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import terminal

JOB_ID = re.compile(r"\b[a-z][a-z0-9_]*-\d{8}T\d{6}-[0-9a-f]{4}\b")


@pytest.fixture
def term(tmp_path: Path):
    if not terminal.available():
        pytest.skip("needs tmux (Debian's tmux package; scripts/setup installs it)")
    log = tmp_path / "audit.jsonl"
    with terminal.Terminal(terminal.REPO, {"FLEETOPS_AUDIT_LOG": str(log)}) as t:
        yield t, log


def test_history_at_80_columns_shows_every_job_id_whole_and_each_entry_as_one_block(term):
    t, log = term
    ids = ["extract-20261130T110509-3f2a", "extract-20261130T121314-beef", "tail_job-20261130T131415-0c0c"]
    records = [
        {"time": "2026-11-30T11:05:09+00:00", "operator": "op@laptop", "host": "gpu-node-017", "task": "extract",
         "result": "ok", "exit_status": 0, "duration_s": 3.2, "msg": f"launched {ids[0]} on 2 shards"},
        {"time": "2026-11-30T12:13:14+00:00", "operator": "op@laptop", "host": "lab01", "task": "extract",
         "result": "failed", "exit_status": 1, "duration_s": 1.0,
         "msg": f"job {ids[1]} ended: killed by signal 9 (out of memory); read why with status " * 2},
        {"time": "2026-11-30T13:14:15+00:00", "operator": "op@laptop", "host": "lab02", "task": "tail",
         "result": "ok", "exit_status": 0, "duration_s": 9.9, "msg": f"{ids[2]}: done 64/64"},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    rc, _ = t.run("fab history")
    assert rc == 0
    drawn = t.visible()  # line by line as the terminal drew them: an id cut across two lines is not whole
    assert all(len(line) <= 80 for line in drawn.splitlines()), drawn
    assert "…" not in drawn, drawn
    for job in ids:
        assert job in drawn, (job, drawn)
    # one entry, one block: each id is drawn after its own host's row begins and before the next one's
    where = [drawn.index(h) for h in ("gpu-node-017", "lab01", "lab02")]
    for n, job in enumerate(ids):
        at = drawn.index(job)
        assert where[n] < at and (n + 1 == len(where) or at < where[n + 1]), drawn
