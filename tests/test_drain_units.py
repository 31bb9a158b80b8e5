"""The drain mark and the re-run list, without a lab: the node's marker (who, when, why) written and
removed atomically, a damaged marker still counting as drained, a drained node refusing a launch and
a patch before anything is written, `drain` without a reason a usage error, and the re-run list
naming the hosts a stopped roll-out never ran."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetops.results import Result, Status
from fleetops.rollout import NOT_RUN
from fleetops.run import rerun_hosts
from fleetops.tasks.drain import _drain_plan
from fleetops.tasks.plan import UsageError
from remote_scripts.core import drainmark
from remote_scripts.core.nodeio import NodeError
from remote_scripts.health import guard
from remote_scripts.jobs.start import job_start


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    return path


def test_mark_read_clear(state):
    assert drainmark.read(str(state)) is None and drainmark.clear(str(state)) is None
    marker = drainmark.mark(str(state), "ops@laptop", "Xid 79 on GPU 1", "lab01")
    assert (
        marker["by"] == "ops@laptop"
        and marker["reason"] == "Xid 79 on GPU 1"
        and marker["host"] == "lab01"
    )
    assert (state / "drain.json").stat().st_mode & 0o777 == 0o600
    again = drainmark.mark(str(state), "other@laptop", "still bad", "lab01")
    assert again["first_at"] == marker["at"] and again["first_by"] == "ops@laptop"
    assert drainmark.read(str(state))["reason"] == "still bad"
    assert (
        drainmark.clear(str(state))["reason"] == "still bad" and not (state / "drain.json").exists()
    )


def test_a_damaged_marker_still_counts_as_drained(state):
    (state / "drain.json").write_text("{not json")
    os.chmod(state / "drain.json", 0o600)
    marker = drainmark.read(str(state))
    assert marker is not None and "cannot be read" in marker["reason"]
    with pytest.raises(NodeError) as refused:
        drainmark.refuse_if_drained(str(state), "patching")
    assert refused.value.kind == "drained"


def test_a_drained_node_launches_nothing_and_patches_nothing(state):
    drainmark.mark(str(state), "ops@laptop", "bad fan", "lab01")
    job = {"name": "extract", "kind": "command", "argv": ["true"], "env": {}}
    with pytest.raises(NodeError) as refused:
        job_start({"state_dir": str(state), "job": job})
    assert refused.value.kind == "drained" and "bad fan" in str(refused.value)
    assert not [p for p in (state / "jobs").iterdir() if p.is_dir()]  # no job dir was made
    with pytest.raises(NodeError) as refused:
        guard.patch({"state_dir": str(state), "patches": [], "requires": []})
    assert refused.value.kind == "drained" and refused.value.details["drain"]["reason"] == "bad fan"


def test_drain_needs_a_reason_on_one_line():
    for kwargs in ({}, {"reason": "  "}, {"reason": "two\nlines"}):
        with pytest.raises(UsageError):
            _drain_plan(None, kwargs)  # type: ignore[arg-type]
    plan = _drain_plan(None, {"reason": " Xid 79 "})  # type: ignore[arg-type]
    assert plan.request == {"reason": "Xid 79"}


def test_rerun_hosts_names_the_failed_and_the_not_run():
    results = [
        Result("lab01", "patch", Status.FAILED, "drifted"),
        Result(
            "lab02",
            "patch",
            Status.SKIPPED,
            "skipped: roll-out stopped after batch 1 had failures",
            data=dict(NOT_RUN),
        ),
        Result("lab03", "patch", Status.OK, "done"),
        Result("lab01", "verify", Status.SKIPPED, "skipped: patch failed on this host"),
        Result(
            "lab10",
            "patch",
            Status.SKIPPED,
            "skipped: not started (interrupted by Ctrl-C)",
            data=dict(NOT_RUN),
        ),
    ]
    assert rerun_hosts(results) == (["lab01", "lab02", "lab10"], ["lab02", "lab10"])
    assert rerun_hosts(results[2:3]) == ([], [])
