"""One verdict on a job for every reader (`status`, `tail`, `diagnose`, `jobs`), SSH and Slurm
alike: each state a job can be in, as the node or Slurm reports it, through each reader's own code
path, must give the same word, the README's exit status (0 while it runs, when it succeeded or when
fleetops' `stop` ended it; 1 otherwise) and the diagnose verdict that agrees with it (a host counted
failed in the recap is one that exits non-zero). Slurm's rows are read from output recorded from a
real Slurm 22.05.8 (tests/fixtures/slurm/)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleetops.plans.jobspec import DEFAULT_FAILURES, DEFAULT_PROGRESS, describe_end, exit_code_of
from fleetops.plans.jobverdict import job_verdict
from fleetops.results import Status
from fleetops.tasks import diagnose as dg
from fleetops.tasks.deferred import jobs_list_plan
from fleetops.tasks.jobs import interpret_jobs_list
from fleetops.tasks.jobs.findings import job_findings
from fleetops.tasks.jobs.slurm.record import read_state
from fleetops.tasks.jobs.slurm.view import code, describe, tasks_view

FIX = Path(__file__).parent / "fixtures" / "slurm"
STOP_BY = {"operator": "ops", "at": "2026-12-02T12:39:40Z"}
SLURM_JOB = {
    "id": "extract-x-20261202T044857-0001",
    "shards": 2,
    "slurm_job_id": "2",
    "name": "extract-x",
    "slurm_user": "root",
    "slurm_submit": "2026-12-02T04:48:57",
    "started_ts": 1000.0,
}


def text(name: str) -> str:
    return "\n".join(ln for ln in (FIX / name).read_text().splitlines() if not ln.startswith("rc="))


def raw(stdout: str = "", rc: int = 0, stderr: str = "") -> dict:
    return {"rc": rc, "stdout": stdout, "stderr": stderr}


PING_DOWN = {
    "argv": ["scontrol", "ping"],
    "rc": 1,
    "stdout": text("scontrol_ping_down.txt"),
    "stderr": "",
}
GONE = raw("", 1, text("squeue_unknown.txt"))
OK0 = {"exit_code": 0, "signal": None, "ended_ts": 1064.0}

# (name, the node's state word, its exit record) -> (word, exit status, diagnose verdict)
SSH = [
    ("running", "running", None, "running", 0, "OK"),
    ("starting", "starting", None, "starting", 0, "OK"),
    ("succeeded", "succeeded", {"exit_code": 0, "signal": None}, "succeeded", 0, "OK"),
    ("failed", "failed", {"exit_code": 3, "signal": None}, "failed", 1, "WARN"),
    ("sigkilled", "killed", {"exit_code": None, "signal": 9}, "killed", 1, "WARN"),
    ("sigtermed by someone else", "killed", {"exit_code": None, "signal": 15}, "killed", 1, "WARN"),
    (
        "stopped by stop (SIGTERM)",
        "killed",
        {"exit_code": None, "signal": 15, "by": "stop"},
        "stopped",
        0,
        "OK",
    ),
    (
        "stopped by stop (caught, exit 143)",
        "failed",
        {"exit_code": 143, "signal": None, "by": "stop"},
        "stopped",
        0,
        "OK",
    ),
    (
        "stopped by stop (SIGKILL after grace)",
        "killed",
        {"exit_code": None, "signal": 9, "by": "stop"},
        "stopped",
        0,
        "OK",
    ),
    (
        "succeeded while stop asked",
        "succeeded",
        {"exit_code": 0, "signal": None},
        "succeeded",
        0,
        "OK",
    ),
    ("lost", "lost", None, "lost", 1, "WARN"),
    (
        "its own verdict read again",
        "stopped",
        {"exit_code": None, "signal": 15, "by": "stop"},
        "stopped",
        0,
        "OK",
    ),
    ("a word no reader knows", "zombie", None, "unknown", 1, "UNKNOWN"),
]

# (name, the node's answer about a Slurm job) -> (word, exit status, diagnose verdict)
SLURM = [
    (
        "running",
        {"query": {"squeue": raw(text("squeue_running.txt"))}, "exits": {}},
        {},
        "running",
        0,
        "OK",
    ),
    (
        "pending",
        {"query": {"squeue": raw(text("squeue_pending.txt"))}, "exits": {}},
        {},
        "pending",
        0,
        "OK",
    ),
    (
        "succeeded (exit files)",
        {"query": {"squeue": GONE}, "exits": {"0": OK0, "1": OK0}},
        {},
        "succeeded",
        0,
        "OK",
    ),
    (
        "failed (exit files)",
        {"query": {"squeue": GONE}, "exits": {"0": OK0, "1": {"exit_code": 2, "signal": None}}},
        {},
        "failed",
        1,
        "WARN",
    ),
    (
        "killed (exit files)",
        {"query": {"squeue": GONE}, "exits": {"0": OK0, "1": {"exit_code": None, "signal": 9}}},
        {},
        "killed",
        1,
        "WARN",
    ),
    (
        "cancelled outside fleetops",
        {"query": {"squeue": raw(text("squeue_cancelled.txt"))}, "exits": {}},
        {},
        "cancelled",
        1,
        "WARN",
    ),
    (
        "cancelled by fleetops' stop",
        {"query": {"squeue": raw(text("squeue_cancelled.txt"))}, "exits": {}},
        {"cancelled_by": STOP_BY},
        "cancelled",
        0,
        "OK",
    ),
    ("no trace left", {"query": {"squeue": GONE}, "exits": {}}, {}, "unknown", 1, "UNKNOWN"),
    (
        "controller down, nothing recorded",
        {"query": {"controller": PING_DOWN}, "exits": {}},
        {},
        "unknown",
        1,
        "UNKNOWN",
    ),
    (
        "controller down, every task recorded exit 0",
        {"query": {"controller": PING_DOWN}, "exits": {"0": OK0, "1": OK0}},
        {},
        "succeeded",
        0,
        "OK",
    ),
    (
        "controller down, a task's run ended by a signal (a requeue's)",
        {
            "query": {"controller": PING_DOWN},
            "exits": {"0": OK0, "1": {"exit_code": None, "signal": 15}},
        },
        {},
        "unknown",
        1,
        "UNKNOWN",
    ),
]


def _diagnose(job: dict) -> tuple[str, Status, int]:
    """diagnose's job finding for it, and the host's result (status, exit) when it is the only
    finding."""
    found = job_findings(
        "h1", job, [], True, re.compile(DEFAULT_PROGRESS), [re.compile(p) for p in DEFAULT_FAILURES]
    )
    result = dg._result("h1", found, {})
    return found[0].verdict, result.status, result.code


def _listed(job: dict) -> str:
    plan = jobs_list_plan(None, {})  # type: ignore[arg-type]  # `jobs` reads no run state to plan
    result = interpret_jobs_list(
        "h1", plan, {"jobs": [job], "total": 1, "jobs_dir": "/x", "now_ts": 2000.0}
    )
    return result.data["table"]["rows"][0][2]


@pytest.mark.parametrize(
    ("name", "state", "ended", "word", "status", "health"), SSH, ids=[c[0] for c in SSH]
)
def test_every_ssh_job_state_reads_the_same_in_every_reader(
    name, state, ended, word, status, health
):
    job = {
        "id": "extract-1",
        "name": "extract",
        "state": state,
        "exit": ended,
        "pid": 10,
        "started": "x",
        "runtime_s": 5.0,
        "log": "/s/jobs/extract-1/output.log",
    }
    verdict = job_verdict(state, ended)
    assert (verdict.word, verdict.code, verdict.health) == (word, status, health)
    assert exit_code_of(job) == status  # status and tail exit with it
    assert _listed(job) == word  # jobs
    found, result_status, result_code = _diagnose(job)
    assert found == health
    # diagnose's host agrees with status: counted failed exactly when it exits non-zero
    assert (result_status is Status.FAILED) == (result_code != 0) == (health != "OK")
    if word == "stopped":
        assert describe_end(job).startswith("stopped by fleetops' `stop`"), describe_end(job)
        assert "killed" not in describe_end(job)


@pytest.mark.parametrize(
    ("name", "answer", "extra", "word", "status", "health"), SLURM, ids=[c[0] for c in SLURM]
)
def test_every_slurm_job_state_reads_the_same_in_every_reader(
    name, answer, extra, word, status, health
):
    job = {**SLURM_JOB, **extra}
    rows = tasks_view({"job": job, **answer})
    assert code(rows, job) == status  # status and tail exit with it
    stored = {
        "id": job["id"],
        "name": job["name"],
        "scheduler": "slurm",
        "record": job,
        "slurm_job_id": "2",
        "query": answer["query"],
        "exits": answer["exits"],
        "started": "2026-12-02T04:48:57Z",
    }
    assert _listed(stored) == word  # jobs
    state = {**stored, **read_state(job, answer["query"], answer["exits"], 2000.0)}
    found, result_status, result_code = _diagnose(state)
    assert found == health, describe(rows, job)
    assert (result_status is Status.FAILED) == (result_code != 0) == (health != "OK")
    if name.startswith("controller down, every task"):
        assert "may still be running" not in describe(rows, job)
