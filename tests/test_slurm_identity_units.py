"""Whose Slurm job a line is, and what it says, on squeue output recorded from a real Slurm 22.05.8
(tests/fixtures/slurm/README.md says how each was made): a job whose name carries `|` and state
words cannot shift a field, a job that wrote `JobState=COMPLETED ExitCode=0:0` into its own Comment
and exited 3 is reported failed with exit status 3, and an id reused by another user's job is never
read as fleetops' job. The node's own reading (remote_scripts/jobs/slurm.py, which decides what to
cancel) agrees with the client's. tests/test_slurm_identity_lab.py replays both against the suite's
real slurmctld."""

from __future__ import annotations

from pathlib import Path

from fleetops.plans import slurm as sp
from fleetops.tasks.jobs.slurm.view import code, describe, tasks_view
from remote_scripts.jobs import slurmquery

FIX = Path(__file__).parent / "fixtures" / "slurm"
LIAR = {
    "id": "liar-20261202T044914-0001",
    "shards": 1,
    "slurm_job_id": "4",
    "name": "evil|0|COMPLETED|x",
    "slurm_user": "root",
    "slurm_submit": "2026-12-02T04:49:14",
}
BLOCKER = {
    "id": "blocker-20261202T044857-0002",
    "shards": 1,
    "slurm_job_id": "1",
    "name": "blocker",
    "slurm_user": "root",
    "slurm_submit": "2026-12-02T04:48:57",
}


def text(name: str) -> str:
    return "\n".join(ln for ln in (FIX / name).read_text().splitlines() if not ln.startswith("rc="))


def answer(job: dict, squeue: str, exits: dict | None = None) -> dict:
    return {
        "job": job,
        "exits": exits or {},
        "query": {
            "squeue": {"rc": 0, "stdout": squeue, "stderr": ""},
            "sacct": {"rc": 1, "stdout": "", "stderr": text("sacct_disabled.txt")},
        },
    }


def test_a_name_with_bars_and_state_words_cannot_shift_a_field():
    (row,) = sp.parse_squeue(text("squeue_failed_injected.txt"))
    assert (row.state, row.reason, row.nodes, row.user, row.name) == (
        "FAILED",
        "NonZeroExitCode",
        "vm",
        "root",
        "evil|0|COMPLETED|x",
    )
    assert row.submit == "2026-12-02T04:49:14" and row.extra["partition"] == "gpu"


def test_a_job_that_forged_its_comment_and_exited_3_is_failed_with_exit_status_3():
    rows = tasks_view(
        answer(LIAR, text("squeue_failed_injected.txt"), {"0": {"exit_code": 3, "signal": None}})
    )
    assert [(r["state"], r["exit_code"], r["slurm_state"]) for r in rows] == [
        ("failed", 3, "FAILED")
    ]
    assert describe(rows, LIAR) == "failed (task 0: FAILED exit status 3)" and code(rows, LIAR) == 1
    # An exit file that says otherwise (the job wrote one itself) does not turn Slurm's FAILED into
    # success.
    forged = tasks_view(
        answer(LIAR, text("squeue_failed_injected.txt"), {"0": {"exit_code": 0, "signal": None}})
    )
    assert [(r["state"], r["exit_code"]) for r in forged] == [("failed", None)]
    assert code(forged, LIAR) == 1 and "Slurm's word is kept" in forged[0]["notes"][-1]


def test_an_id_reused_by_another_users_job_is_never_read_as_ours():
    rows = tasks_view(answer(BLOCKER, text("squeue_reused.txt")))
    # not "running": that is alice's
    assert [(r["state"], r["source"]) for r in rows] == [("unknown", "none")]
    note = rows[0]["reused"]
    assert "Slurm job 1 is not fleetops' job blocker-" in note and "user nobody" in note, note
    assert "'alice-training'" in note and "submitted 2026-12-02T04:49:41" in note, note
    ended = tasks_view(
        answer(BLOCKER, text("squeue_reused.txt"), {"0": {"exit_code": 0, "signal": None}})
    )
    assert [(r["state"], r["exit_code"], r["source"]) for r in ended] == [
        ("succeeded", 0, "exit-file")
    ]
    # The same job's own line (before the controller forgot it) is ours.
    ours, others = sp.split_owned(
        sp.parse_squeue(text("squeue_pending.txt")),
        sp.Identity("root", "extract-x", "2026-12-02T04:48:57"),
    )
    assert len(ours) == 2 and others == []
    assert (
        sp.split_owned(
            sp.parse_squeue(text("squeue_pending.txt")),
            # submitted later
            sp.Identity("root", "extract-x", "2026-12-02T05:00:00"),
        )[0]
        == []
    )


def test_the_node_reads_whose_job_it_is_as_the_client_does():
    for job, name in (
        (BLOCKER, "squeue_reused.txt"),
        (LIAR, "squeue_failed_injected.txt"),
        ({**BLOCKER, "name": "extract-x", "slurm_job_id": "2"}, "squeue_pending.txt"),
    ):
        node_ours, node_others = slurmquery.ours(job, text(name))
        ours, others = sp.split_owned(sp.parse_squeue(text(name)), sp.Identity.of(job))
        assert [r["id"] for r in node_ours] == [r.job_id for r in ours], name
        assert [r["id"] for r in node_others] == [r.job_id for r in others], name
    assert [r["state"] for r in slurmquery.ours(BLOCKER, text("squeue_reused.txt"))[1]] == [
        "RUNNING"
    ]
