"""The audit log cannot lie, without the lab: whole lines or none (a short write is cut back, a torn
last line gets its newline first, a glued pair is read back), and a log file that is a symlink, a
FIFO, another user's, writable by everyone or hard-linked elsewhere is refused with the reason. A
short write is made real with RLIMIT_FSIZE in a child process (the kernel writes up to the limit and
fails the rest, as a full disk does); test_audit_integrity_lab.py fills a real tmpfs and checks the
run's exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from fleetops import audit
from fleetops.results import Result, Status


@pytest.fixture
def log(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "audit.jsonl"
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(path))
    return path


def record(host: str = "lab01", msg: str = "pong") -> dict:
    return audit.entry(Result(host, "ping", Status.OK, msg), None, None)


def lines_parse(path: Path) -> list[dict]:
    """Every line of the file, each parsed on its own (json.loads raises on a torn or glued
    line)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_short_write_is_cut_back_and_raises(log):
    for i in range(3):
        audit.append(record(f"lab0{i}"))
    before = log.read_bytes()
    child = f"""
import os, resource, sys
sys.path.insert(0, {str(REPO)!r})
from fleetops import audit
from fleetops.results import Result, Status
resource.setrlimit(resource.RLIMIT_FSIZE, ({len(before) + 40}, resource.RLIM_INFINITY))
try:
    audit.append(audit.entry(Result("lab09", "ping", Status.OK, "x" * 400), None, None))
except audit.AuditError as exc:
    print("refused:", exc)
    sys.exit(7)
"""
    proc = subprocess.run(
        [sys.executable, "-c", child],
        capture_output=True,
        text=True,
        env={**os.environ, "FLEETOPS_AUDIT_LOG": str(log)},
    )
    assert proc.returncode == 7, proc.stdout + proc.stderr  # before: a torn line, no error, exit 0
    assert "not written" in proc.stdout and str(log) in proc.stdout, proc.stdout
    assert log.read_bytes() == before  # cut back: the earlier lines are exactly as they were
    assert [r["host"] for r in lines_parse(log)] == ["lab00", "lab01", "lab02"]


def test_a_torn_last_line_does_not_swallow_the_next_record(log):
    audit.append(record("lab01"))
    with log.open("a", encoding="utf-8") as f:
        f.write('{"host": "lab02", "msg": "torn by a crash')  # no newline: a writer died mid-line
    audit.append(record("lab03"))
    text = log.read_text(encoding="utf-8")
    assert (
        text.endswith("\n")
        and text.splitlines()[-1].startswith("{")
        and json.loads(text.splitlines()[-1])
    )
    assert [r["host"] for r in audit.read()] == ["lab01", "lab03"]


def test_a_record_an_older_writer_glued_onto_a_torn_line_is_read_back(log):
    good = json.dumps(record("lab02"), sort_keys=True)
    log.write_text(
        json.dumps(record("lab01"), sort_keys=True) + '\n{"host": "torn", "msg": "ha' + good + "\n",
        encoding="utf-8",
    )
    assert [r["host"] for r in audit.read()] == ["lab01", "lab02"]


def test_a_symlinked_log_is_refused_and_its_target_untouched(log, tmp_path):
    target = tmp_path / "root-only"
    target.write_text("precious\n")
    target.chmod(0o600)
    log.symlink_to(target)
    with pytest.raises(audit.AuditError, match="symbolic link"):
        audit.append(record())
    assert target.read_text() == "precious\n"


def test_a_fifo_in_the_logs_place_is_refused_without_blocking(log):
    os.mkfifo(log)
    with pytest.raises(audit.AuditError, match="not a regular file"):
        audit.append(record())


def test_a_log_writable_by_everyone_or_hard_linked_is_refused(log, tmp_path):
    audit.append(record())
    log.chmod(0o666)
    with pytest.raises(audit.AuditError, match="writable by everyone"):
        audit.append(record())
    log.chmod(0o600)
    other = tmp_path / "other-name"
    os.link(log, other)
    with pytest.raises(audit.AuditError, match="hard links"):
        audit.append(record())
    other.unlink()
    log.chmod(0o660)  # a team's shared log may be group-writable
    audit.append(record())
    assert len(lines_parse(log)) == 2


@pytest.mark.root("chown to another uid needs root")
def test_a_log_owned_by_another_user_is_refused(log):
    audit.append(record())
    os.chown(log, 65534, 65534)
    before = log.read_bytes()
    with pytest.raises(audit.AuditError, match="owned by uid 65534"):
        audit.append(record())
    assert log.read_bytes() == before


def test_the_opt_out_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(audit.OPTIONAL_ENV, raising=False)
    assert not audit.optional()
    monkeypatch.setenv(audit.OPTIONAL_ENV, "1")
    assert audit.optional()
