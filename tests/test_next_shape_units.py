"""Every result's `next` has one shape, a Next: in data and --json {"why": ..., "commands": [...]},
and the human view prints it one way (why, then each command on its own line)."""

from __future__ import annotations

import json

from fleetops.report.lines import next_lines
from fleetops.results import Next, Result, Status
from fleetops.results.drain import Drained
from fleetops.tasks.drain import _with_slurm
from fleetops.tasks.patching import _refused
from fleetops.tasks.plan import Plan, drained


def _next_of(result: Result) -> Next:
    """The `next` of a result as --json carries it, read back: its two keys and nothing else."""
    data = json.loads(json.dumps(result.to_json()))["data"]["next"]  # as --json writes it
    assert isinstance(data, dict) and set(data) == {"why", "commands"}, data
    assert isinstance(data["why"], str) and data["why"], data
    assert isinstance(data["commands"], list) and all(
        isinstance(c, str) for c in data["commands"]
    ), data
    return Next(data["why"], data["commands"])


def test_a_drained_nodes_refusal_says_why_and_the_command_that_undrains_it():
    result = drained("lab01", "patch", {"by": "ops", "at": "now", "reason": "Xid 79"}, "patch")
    nxt = _next_of(result)
    assert nxt.commands == ["fab -H lab01 undrain"]
    assert "undrain" in nxt.why or "service" in nxt.why


def test_a_patch_refused_while_a_job_runs_says_why_and_the_command_that_follows_the_job():
    plan = Plan("patch", {}, 60, None)
    answer = {
        "ok": False,
        "error": "job 7 is still running",
        "error_kind": "job_running",
        "details": {"job": {"id": "7"}},
    }
    nxt = _next_of(_refused("lab01", plan, answer))
    assert nxt.commands == ["fab -H lab01 tail --job-id 7"]


def test_slurm_refusing_a_drain_says_why_and_the_command_to_run_by_hand():
    result = Result(
        "login01", "drain", Status.CHANGED, "drained by ops", payload=Drained({"by": "ops"}, None)
    )
    slurm = {
        "node": "c1",
        "command": {
            "rc": 1,
            "argv": ["scontrol", "update", "nodename=c1", "state=drain"],
            "stderr": "Invalid user for SlurmUser\n",
        },
    }
    nxt = _next_of(_with_slurm(result, slurm, Plan("drain", {}, 60, None)))
    assert nxt.commands == ["scontrol update nodename=c1 state=drain"]


def test_the_human_view_prints_a_next_as_why_then_each_command_alone():
    lines = next_lines(
        Next("see what it does", ["fab -H lab01 patch --check", "fab -H lab01 verify"]), "  "
    )
    text = ["".join(seg for seg, _ in line) for line in lines]
    assert text == [
        "  next: see what it does",
        "    fab -H lab01 patch --check",
        "    fab -H lab01 verify",
    ]
    assert next_lines(Next("", []), "  ") == []
