"""The audit log cannot lie, with real runs against the lab: on a full disk (a tiny tmpfs, so root
only) a record is whole or absent, every earlier line stays parseable, the next record starts on a
line of its own, and the run exits 5 (FLEETOPS_AUDIT_OPTIONAL=1 keeps its own status, still saying
so); a log replaced by a symlink in a group-writable directory is refused and the file it points to
is never appended to. The writer's own cases (short writes, torn lines, refused files) without the
lab: test_audit_integrity_units.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import run_fab

pytestmark = [pytest.mark.lab, pytest.mark.root("mounting a tmpfs needs root")]
PAGE = 4096
EXIT_AUDIT = 5  # README's exit-status table


def parsed(path: Path) -> list[dict]:
    """Every line of the log, each parsed alone: a torn or glued line raises."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def fill(mount: Path, log: Path, room: int) -> None:
    """Pad the log with a whole record so that its last page has `room` bytes left, then fill every
    other page of the file system."""
    size = log.stat().st_size
    pad = (PAGE - room - size) % PAGE
    base = json.dumps({"host": "padding", "msg": ""}) + "\n"
    if 0 < pad < len(base):
        pad += PAGE
    if pad:
        with log.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"host": "padding", "msg": "x" * (pad - len(base))}) + "\n")
    assert log.stat().st_size % PAGE == (PAGE - room) % PAGE
    subprocess.run(["dd", "if=/dev/zero", f"of={mount / 'filler'}", "bs=4k"], capture_output=True)


@pytest.fixture
def tiny_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mount)], check=True
    )
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize("room", [100, 0], ids=["short-write", "no-room"])
def test_a_full_disk_keeps_every_earlier_line_and_the_run_exits_non_zero(lab, tiny_disk, room):
    # Quote: "On a full disk a short write leaves a torn line, no error, exit 0; the next record is
    # glued on and both are lost to `fab history`; a plain ENOSPC prints an error and the run still
    # exits 0."
    log = tiny_disk / "audit.jsonl"
    env = {"FLEETOPS_AUDIT_LOG": str(log)}
    first = run_fab(lab.root, "-H", "lab01,lab02", "ping", env=env)
    assert first.returncode == 0 and len(parsed(log)) == 2, first.stdout + first.stderr
    fill(tiny_disk, log, room)
    before = log.read_bytes()
    full = run_fab(lab.root, "-H", "lab01", "ping", env=env)
    assert full.returncode == EXIT_AUDIT, full.stdout + full.stderr
    assert "No space left on device" in full.stderr and "not recorded" in full.stderr, full.stderr
    assert (
        "1 of 1 results not recorded in the audit log" in full.stderr
        and "exit status 5" in full.stderr
    )
    assert "Traceback" not in full.stderr
    assert log.read_bytes() == before  # nothing torn left behind
    as_json = json.loads(run_fab(lab.root, "-H", "lab01", "ping", "--json", env=env).stdout)
    assert as_json["exit_status"] == EXIT_AUDIT and as_json["audit_errors"], as_json
    optional = run_fab(lab.root, "-H", "lab01", "ping", env={**env, "FLEETOPS_AUDIT_OPTIONAL": "1"})
    assert optional.returncode == 0 and "not recorded" in optional.stderr, (
        optional.stdout + optional.stderr
    )
    (tiny_disk / "filler").unlink()
    after = run_fab(lab.root, "-H", "lab02", "ping", env=env)
    assert after.returncode == 0, after.stdout + after.stderr
    # every line whole: the earlier ones and the next record on a line of its own
    records = parsed(log)
    hosts = [r["host"] for r in records if r["host"] != "padding"]
    # the first run's two hosts answer in either order; the last record is the run after the disk
    # had room
    assert sorted(hosts[:2]) == ["lab01", "lab02"] and hosts[2:] == ["lab02"], records
    history = json.loads(run_fab(lab.root, "history", "--json", env=env).stdout)
    assert len(history) == len(records)


def test_a_log_replaced_by_a_symlink_in_a_shared_directory_is_refused(lab, tmp_path):
    # Quote: "A shared FLEETOPS_AUDIT_LOG in a group-writable directory replaced by a symlink made
    # root append to a 0600 root-owned file."
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    log = shared / "audit.jsonl"
    env = {"FLEETOPS_AUDIT_LOG": str(log)}
    assert run_fab(lab.root, "-H", "lab01", "ping", env=env).returncode == 0
    precious = tmp_path / "root-only"
    precious.write_text("root:x:0:0\n")
    precious.chmod(0o600)
    log.unlink()
    log.symlink_to(precious)  # what another member of the directory's group can do
    proc = run_fab(lab.root, "-H", "lab01", "ping", env=env)
    assert proc.returncode == EXIT_AUDIT, proc.stdout + proc.stderr
    assert "symbolic link" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert precious.read_text() == "root:x:0:0\n" and os.path.islink(log)
