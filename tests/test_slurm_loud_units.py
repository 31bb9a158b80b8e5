"""How a Slurm job is reported when Slurm says something other than "running": a controller that
cannot be reached (UNKNOWN, never "not in the queue"), a job cancelled while pending, a requeued
task (whose submit time moved), an array's counts, and the exit status `status` asks for. On output
recorded from a real Slurm 22.05.8 (tests/fixtures/slurm/README.md); tests/test_slurm_loud_lab.py
does the same against the suite's slurmctld."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

from fleetops.plans import slurm as sp
from fleetops.results import EXIT_FAILED, EXIT_OK
from fleetops.tasks.jobs.slurm.view import code, controller_problem, counts, describe, tasks_view
from remote_scripts.jobs import slurmquery

FIX = Path(__file__).parent / "fixtures" / "slurm"


def text(name: str) -> str:
    return "\n".join(ln for ln in (FIX / name).read_text().splitlines() if not ln.startswith("rc="))


def raw(stdout: str = "", rc: int = 0, stderr: str = "") -> dict:
    return {"rc": rc, "stdout": stdout, "stderr": stderr}


DISABLED = raw("", 1, text("sacct_disabled.txt"))
REQUEUE = {
    "id": "requeue-me-20261202T123943-0001",
    "shards": 2,
    "slurm_job_id": "3",
    "name": "requeue-me",
    "slurm_user": "root",
    "slurm_submit": "2026-12-02T12:39:43",
}
WAITER = {
    "id": "waiter-20261202T123934-0002",
    "shards": 1,
    "slurm_job_id": "2",
    "name": "waiter",
    "slurm_user": "root",
    "slurm_submit": "2026-12-02T12:39:34",
}


def test_a_controller_that_cannot_be_reached_is_unknown_and_named_never_not_in_the_queue():
    ping = {
        "argv": ["scontrol", "ping"],
        "rc": 1,
        "stdout": text("scontrol_ping_down.txt"),
        "stderr": "",
    }
    # What a requeue leaves of the task's earlier run: its SIGTERM, forwarded to the job, recorded
    # as its end.
    answer = {
        "job": REQUEUE,
        "query": {"controller": ping},
        "exits": {"0": {"exit_code": None, "signal": 15}},
    }
    rows = tasks_view(answer)
    # An exit file of an earlier run must not turn "cannot ask" into an answer.
    assert [(r["state"], r["source"]) for r in rows] == [("unknown", "none"), ("unknown", "none")]
    said = describe(rows, REQUEUE)
    assert said.startswith(
        "UNKNOWN: Slurm's controller cannot be reached (scontrol ping exit 1: "
        "Slurmctld(primary) at vm is DOWN"
    ), said
    assert "no longer lists it" not in said and "may still be running" in said
    assert code(rows, REQUEUE) == EXIT_FAILED
    # squeue's own message, when the ping passed but squeue then could not reach it.
    late = {"squeue": raw("", 1, text("squeue_controller_down.txt")), "sacct": DISABLED}
    assert controller_problem(late).startswith(
        "Slurm's controller did not answer squeue (exit 1: slurm_load_jobs "
        "error: Unable to contact slurm controller"
    )
    rows = tasks_view({"job": WAITER, "query": late, "exits": {}})
    assert rows[0]["state"] == "unknown" and "Unable to contact slurm controller" in describe(
        rows, WAITER
    )
    assert not controller_problem(
        {"squeue": raw("", 1, "slurm_load_jobs error: Invalid job id specified")}
    )


def test_the_node_asks_the_controller_first_and_reads_its_ping():
    assert slurmquery.controller_down(
        {"rc": 1, "stdout": text("scontrol_ping_down.txt"), "stderr": ""}
    )
    assert slurmquery.controller_down(
        {"rc": 124, "stdout": "", "stderr": "scontrol did not answer in 10s"}
    )
    assert not slurmquery.controller_down(
        {"rc": 0, "stdout": text("scontrol_ping_up.txt"), "stderr": ""}
    )
    assert not slurmquery.controller_down(
        {"rc": 127, "stdout": "", "stderr": "scontrol: command not found"}
    )
    assert slurmquery.query({"slurm_job_id": None}, {}) == {}  # never submitted: nothing is asked


def test_a_job_cancelled_while_pending_says_cancelled_and_that_it_never_ran():
    answer = {
        "job": WAITER,
        "query": {"squeue": raw(text("squeue_cancelled_pending.txt")), "sacct": DISABLED},
        "exits": {},
    }
    rows = tasks_view(answer)
    assert [(r["state"], r["slurm_state"], r["signal"]) for r in rows] == [
        ("cancelled", "CANCELLED", None)
    ]
    assert (
        describe(rows, WAITER)
        == "cancelled by scancel outside fleetops while pending: it never ran"
    )
    assert code(rows, WAITER) == EXIT_FAILED  # someone else ended it: not what was asked
    ours = {**WAITER, "cancelled_by": {"operator": "ops", "at": "2026-12-02T12:39:40Z"}}
    assert (
        describe(rows, ours)
        == "cancelled by fab stop at 2026-12-02T12:39:40Z while pending: it never ran"
    )
    # ended as fleetops' own stop asked: 0, in the README's table
    assert code(rows, ours) == EXIT_OK
    assert "signal" not in describe(rows, ours)


def test_a_requeued_task_is_ours_though_its_submit_time_moved_and_says_requeued():
    listed = text("squeue_requeued.txt")
    restarts = text("squeue_restarts.txt")
    assert sp.parse_restarts(restarts) == {"3_1": 1, "3_0": 0}
    # Without the restart count, the moved submit time reads as another job's (the reused-id guard).
    without = tasks_view(
        {"job": REQUEUE, "query": {"squeue": raw(listed), "sacct": DISABLED}, "exits": {}}
    )
    assert [r["state"] for r in without] == ["running", "unknown"] and without[0]["reused"]
    answer = {
        "job": REQUEUE,
        "query": {"squeue": raw(listed), "restarts": raw(restarts), "sacct": DISABLED},
        # the first run's end, before the requeue
        "exits": {"1": {"exit_code": None, "signal": 15}},
    }
    rows = tasks_view(answer)
    assert [(r["task"], r["state"], r["restarts"]) for r in rows] == [
        (0, "running", 0),
        (1, "pending", 1),
    ]
    assert not rows[0]["reused"]
    assert counts(rows) == "2 tasks: 1 running, 1 pending"
    pending = [r for r in rows if r["state"] == "pending"]
    assert describe(pending, REQUEUE) == (
        "requeued by Slurm (1 time), pending (waiting for the scheduler: BeginTime)"
    )
    assert code(rows, REQUEUE) == EXIT_OK
    # The node decides the same (what it cancels, whether a new submit must wait).
    node_ours, node_others = slurmquery.ours(REQUEUE, listed, restarts)
    assert sorted(r["id"] for r in node_ours) == ["3_0", "3_1"] and node_others == []
    assert [r["id"] for r in slurmquery.ours(REQUEUE, listed)[0]] == ["3_0"]
    assert slurmquery.active(REQUEUE, {"squeue": raw(listed), "restarts": raw(restarts)}) is True
    assert slurmquery.active(REQUEUE, {"controller": raw("", 1)}) is None


def test_an_arrays_counts_and_words():
    job = {
        "id": "extract-1",
        "shards": 2,
        "slurm_job_id": "2",
        "name": "extract-x",
        "slurm_user": "root",
        "slurm_submit": "2026-12-02T04:48:57",
    }
    running = tasks_view(
        {"job": job, "query": {"squeue": raw(text("squeue_running.txt"))}, "exits": {}}
    )
    assert counts(running) == "2 tasks: 2 running" and describe(running, job) == "running"
    done = tasks_view(
        {
            "job": job,
            "query": {"squeue": raw("", 1, text("squeue_unknown.txt"))},
            "exits": {"0": {"exit_code": 0, "signal": None}, "1": {"exit_code": 0, "signal": None}},
        }
    )
    assert counts(done) == "2 tasks: 2 succeeded" and code(done, job) == EXIT_OK
    mixed = tasks_view(
        {"job": job, "query": {"squeue": raw(text("squeue_after_cancel_one.txt"))}, "exits": {}}
    )
    assert counts(mixed) == "2 tasks: 1 running, 1 cancelled"
    assert counts(mixed[:1]) == ""  # one task: no count


def test_status_exit_codes_stay_in_the_readmes_table():
    job = {"id": "x", "shards": 1, "slurm_job_id": "9", "name": "x", "slurm_user": "root"}
    killed = tasks_view(
        {
            "job": job,
            "query": {"squeue": raw("", 1, text("squeue_unknown.txt"))},
            "exits": {"0": {"exit_code": None, "signal": 9}},
        }
    )
    assert killed[0]["state"] == "killed" and code(killed, job) == EXIT_FAILED  # not 137
    assert "killed by signal 9" in describe(killed, job)
    gone = tasks_view(
        {
            "job": job,
            "query": {"squeue": raw("", 1, text("squeue_unknown.txt")), "sacct": DISABLED},
            "exits": {},
        }
    )
    assert describe(gone, job) == (
        "unknown: the scheduler no longer lists it (no accounting on this cluster) and "
        "it left no exit file; see its log with fab logs"
    )
    assert code(gone, job) == EXIT_FAILED


class _SlowNode:
    """A connector whose `slurm` call takes `delay` seconds, as one waiting on a slow controller
    does."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.host = SimpleNamespace(
            name="login01", env_values=(("SLURM_CONF", "/etc/slurm/slurm.conf"),)
        )

    def call(self, op: str, request: dict, timeout: float = 300) -> tuple[dict, None]:
        time.sleep(self.delay)
        return {
            "ok": True,
            "op": op,
            "action": request["action"],
            "env": request["scheduler_env"],
        }, None


def test_a_slurm_call_that_waits_says_what_it_waits_for(tmp_path):
    from fleetops.state import RunState
    from fleetops.tasks.jobs.slurm.jobs import _call

    run = RunState(tmp_path / "project", {})
    said: list[tuple[str, str, str, float]] = []
    lock = threading.Lock()

    def waiting(host: str, task: str, what: str, left_s: float) -> None:
        with lock:
            said.append((host, task, what, left_s))

    run.reporter.waiting = waiting
    answer = _call(_SlowNode(1.2), "status", {}, timeout=30, run=run, task="status", quiet_s=0.3)
    assert answer["action"] == "status" and answer["env"] == {"SLURM_CONF": "/etc/slurm/slurm.conf"}
    assert said, "a call quiet for longer than quiet_s said nothing"
    host, task, what, left = said[0]
    assert (
        (host, task) == ("login01", "status")
        and "scontrol ping, squeue, sacct" in what
        and "20 s" in what
    )
    assert 0 < left <= 30
    count = len(said)
    time.sleep(1.2)
    assert len(said) == count  # nothing more once the answer came
    said.clear()
    _call(_SlowNode(0.05), "status", {}, timeout=30, run=run, task="status", quiet_s=0.3)
    assert said == []  # a quick answer: no line
