"""On a real lab node: corrupt state files are quarantined (renamed aside, reported), never fatal
forever. The job records (jobs/current.json, jobs/<id>/job.json) are moved aside like lock.json, and
whatever the node quarantined or tidied on the way is shown under any task's result, not only
patch's."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from conftest import REPO, run_fab
from polling import wait_for

from fleetops.wire.bundle import agent_bundle

pytestmark = pytest.mark.lab
JOBS = str(REPO / "tests" / "playbooks" / "jobs.yaml")
EXIT_FAILED = 1


def fab(lab, *args: str, as_json: bool = True) -> tuple[int, dict, str]:
    """`fab -H lab01 ...`: (exit status, the --json document or {}, stdout+stderr); never a
    traceback."""
    proc = run_fab(
        lab.root,
        "-H",
        "lab01",
        *args,
        *(["--json"] if as_json else []),
        env={"COLUMNS": "300"},
        timeout=600,
    )
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both, both
    return proc.returncode, json.loads(proc.stdout) if as_json else {}, both


def only(doc: dict) -> dict:
    (result,) = doc["results"]
    return result


@pytest.fixture
def node(lab):
    node = lab.node("lab01")
    for sub in ("jobs",):
        shutil.rmtree(node.state_dir / sub, ignore_errors=True)
    for entry in node.state_dir.iterdir():
        if ".corrupt-" in entry.name:
            entry.unlink()
    yield node
    run_fab(lab.root, "-H", "lab01", "stop", "--grace", "1")


def launch(lab, node) -> dict:
    """A short job (envecho: one line, then it ends), waited for until its end is recorded."""
    rc, doc, both = fab(lab, "extract", "--job", "envecho", "--playbook", JOBS)
    assert rc == 0, both
    job = only(doc)["data"]["job"]
    wait_for(
        lambda: (node.state_dir / "jobs" / job["id"] / "exit.json").exists(),
        f"job {job['id']}'s end",
        timeout=120,
    )
    return job


def test_a_corrupt_lock_json_is_shown_under_a_successful_ping(lab, node):
    info = node.state_dir / "lock.json"
    info.write_text("{not json")
    info.chmod(0o600)
    rc, _, both = fab(lab, "ping", as_json=False)
    assert rc == 0, both
    (aside,) = node.state_dir.glob("lock.json.corrupt-*")
    assert f"node: quarantined corrupt state file {info} (not JSON" in both, both
    assert f"moved to {aside}" in both, both
    info.write_text("{not json")
    info.chmod(0o600)
    rc, doc, both = fab(lab, "ping")
    assert rc == 0, both
    (moved,) = only(doc)["data"]["quarantined"]
    assert (
        moved["path"] == str(info)
        and "not JSON" in moved["why"]
        and Path(moved["moved_to"]).exists()
    )
    assert not info.exists()


def test_a_dead_uploads_temp_file_is_shown_under_a_ping(lab, node):
    fab(lab, "ping")
    dead = node.state_dir / "bin" / f"{agent_bundle().filename}.0000dead.tmp"
    dead.write_bytes(b"half a zip")
    old = time.time() - 3600
    os.utime(dead, (old, old))
    rc, _, both = fab(lab, "ping", as_json=False)
    assert rc == 0, both
    assert f"node: removed a dead upload's temp file {dead}" in both, both
    assert not dead.exists()
    dead.write_bytes(b"half a zip")
    os.utime(dead, (old, old))
    rc, doc, both = fab(lab, "ping")
    assert rc == 0 and only(doc)["data"]["removed_temp_files"] == [str(dead)], both


def test_a_corrupt_current_json_is_quarantined_and_the_newest_job_answers(lab, node):
    launch(lab, node)
    newest = launch(lab, node)
    current = node.state_dir / "jobs" / "current.json"
    current.write_text('{"id": ')
    rc, doc, both = fab(lab, "status")
    assert rc == 0, both
    result = only(doc)
    assert result["data"]["job"]["id"] == newest["id"], result
    (moved,) = result["data"]["quarantined"]
    assert moved["path"] == str(current) and Path(moved["moved_to"]).name.startswith(
        "current.json.corrupt-"
    )
    assert not current.exists()
    again = launch(lab, node)  # a new extract works, and is the latest again
    assert json.loads(current.read_text()) == {"id": again["id"]}
    rc, doc, both = fab(lab, "status")
    assert (
        rc == 0
        and only(doc)["data"]["job"]["id"] == again["id"]
        and "quarantined" not in only(doc)["data"]
    )


def test_a_corrupt_job_json_fails_that_job_clearly_and_later_runs_work(lab, node):
    older = launch(lab, node)
    newest = launch(lab, node)
    record = node.state_dir / "jobs" / newest["id"] / "job.json"
    record.write_text("\x00\x00garbage")
    rc, doc, both = fab(lab, "status", "--job-id", newest["id"])
    result = only(doc)
    assert rc == EXIT_FAILED and result["status"] == "failed", both
    (moved,) = result["data"]["quarantined"]
    assert moved["path"] == str(record) and Path(moved["moved_to"]).exists() and not record.exists()
    msg = result["msg"]
    for part in (newest["id"], "quarantined", moved["moved_to"], newest["log"]):
        assert part in msg, (part, msg)
    assert "\n" not in msg and "mv " not in msg, msg
    rc, doc, both = fab(lab, "jobs")  # the rest is listed
    assert rc == 0 and [j["id"] for j in only(doc)["data"]["jobs"]] == [older["id"]], both
    rc, doc, both = fab(lab, "status")  # the latest readable job answers
    assert rc == 0 and only(doc)["data"]["job"]["id"] == older["id"], both
    # listing meets a corrupt record too: moved aside, reported, the rest listed
    (node.state_dir / "jobs" / older["id"] / "job.json").write_text("{")
    rc, doc, both = fab(lab, "jobs")
    assert rc == 0 and only(doc)["data"]["jobs"] == [], both
    assert [m["path"] for m in only(doc)["data"]["quarantined"]] == [
        str(node.state_dir / "jobs" / older["id"] / "job.json")
    ]
    assert launch(lab, node)["id"]  # and a new job starts
