"""What the operator reads at 80 columns in a real terminal (tmux, 80x40), without a lab: every job
id, path and fingerprint whole on the screen, never cut by the terminal or by an ellipsis."""

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
    ids = [
        "extract-20261130T110509-3f2a",
        "extract-20261130T121314-beef",
        "tail_job-20261130T131415-0c0c",
    ]
    records = [
        {
            "time": "2026-11-30T11:05:09+00:00",
            "operator": "op@laptop",
            "host": "gpu-node-017",
            "task": "extract",
            "result": "ok",
            "exit_status": 0,
            "duration_s": 3.2,
            "msg": f"launched {ids[0]} on 2 shards",
        },
        {
            "time": "2026-11-30T12:13:14+00:00",
            "operator": "op@laptop",
            "host": "lab01",
            "task": "extract",
            "result": "failed",
            "exit_status": 1,
            "duration_s": 1.0,
            "msg": f"job {ids[1]} ended: killed by signal 9 (out of memory); read why with status "
            * 2,
        },
        {
            "time": "2026-11-30T13:14:15+00:00",
            "operator": "op@laptop",
            "host": "lab02",
            "task": "tail",
            "result": "ok",
            "exit_status": 0,
            "duration_s": 9.9,
            "msg": f"{ids[2]}: done 64/64",
        },
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    rc, _ = t.run("fab history")
    assert rc == 0
    # line by line as the terminal drew them: an id cut across two lines is not whole
    drawn = t.visible()
    assert all(len(line) <= 80 for line in drawn.splitlines()), drawn
    assert "…" not in drawn, drawn
    for job in ids:
        assert job in drawn, (job, drawn)
    # one entry, one block: each id is drawn after its own host's row begins and before the next
    # one's
    where = [drawn.index(h) for h in ("gpu-node-017", "lab01", "lab02")]
    for n, job in enumerate(ids):
        at = drawn.index(job)
        assert where[n] < at and (n + 1 == len(where) or at < where[n + 1]), drawn


# 43 base64 characters, as ssh-keygen -l prints one
FINGERPRINT = "SHA256:" + "q" * 20 + "Zx9" * 7 + "w2"
LOG = "/var/tmp/fleetops/jobs/extract-20261130T110509-3f2a/logs/shard-0.log"

SAYS = f"""
import sys
sys.path.insert(0, {str(terminal.REPO)!r})
from fleetops.report.console import Reporter

rep = Reporter()
rep.note("lab01 | trust | the node offers a new ed25519 key {FINGERPRINT}; compare it on the \
console")
rep.note("lab01 | extract | the job writes its log to {LOG} while it runs")
rep.job_started("lab01", "extract", "extract-20261130T110509-3f2a", "log {LOG}")
rep.fold = True
rep.job_started("lab01", "extract", "extract-20261130T110509-3f2a", "log {LOG}")
rep.job_line("lab01", "shard 0 wrote its first batch; the full log of this shard is {LOG}", False, \
None)
rep.error("lab01: host key does not match known_hosts: expected {FINGERPRINT}, got \
{FINGERPRINT[::-1]}")
"""


def test_notes_and_errors_never_split_a_fingerprint_or_a_log_path(term, tmp_path):
    t, _ = term
    script = tmp_path / "says.py"
    script.write_text(SAYS)
    rc, _ = t.run(f"python3 {script} 2>&1")
    assert rc == 0
    # as the terminal drew them: a word cut across two lines is not whole
    drawn = t.visible().splitlines()
    assert all(len(line) <= 80 for line in drawn), drawn
    words = [w for line in drawn for w in line.split()]
    assert sum(FINGERPRINT in w for w in words) == 2 and any(
        FINGERPRINT[::-1] in w for w in words
    ), drawn
    assert sum(LOG in w for w in words) == 3, drawn  # the unfolded job's own result line says it
    assert any(line.startswith("error:") for line in drawn), drawn
