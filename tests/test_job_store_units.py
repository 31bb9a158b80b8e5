"""One job store for SSH and Slurm jobs, without a lab: `jobs`, `fetch` and `diagnose` on the node
read both kinds of record (remote_scripts/jobs/records.py), and the client reads a Slurm job's state
as `status` does; `diagnose` reads any ended job's log with the playbook's failures: patterns (a
CUDA out-of-memory line is WARN, shown, with its next step). The real sbatch/sshd runs are in
test_slurm_jobstore_lab.py and test_diagnose_failures_lab.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from fleetops.plans.inventory import Host
from fleetops.plans.jobspec import DEFAULT_FAILURES, DEFAULT_PROGRESS
from fleetops.tasks import diagnose
from fleetops.tasks.jobs import interpret_jobs_list
from fleetops.tasks.plan import Plan
from remote_scripts.core.nodeio import NodeError
from remote_scripts.health.diagnose import latest_job
from remote_scripts.jobs.fetch import fetch_plan
from remote_scripts.jobs.records import every_job, find_job
from remote_scripts.jobs.status import jobs_list

OOM = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
SSH_ID = "numbers-20261202T101010-aaaa"
SLURM_ID = "boom-20261202T111111-bbbb"
FAILURES = [re.compile(p) for p in DEFAULT_FAILURES]
PROGRESS = re.compile(DEFAULT_PROGRESS)


def _write(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def ssh_job(state: Path, started: float, lines: list[str], code: int = 0) -> Path:
    job_dir = state / "jobs" / SSH_ID
    log = job_dir / "output.log"
    _write(
        job_dir / "job.json",
        {
            "id": SSH_ID,
            "name": "numbers",
            "kind": "command",
            "started": "2026-12-02T10:10:10Z",
            "started_ts": started,
            "log": str(log),
            "pid": 999999,
        },
    )
    log.write_text("".join(f"{ln}\n" for ln in lines))
    _write(job_dir / "exit.json", {"exit_code": code, "signal": None, "ended_ts": started + 5})
    _write(state / "jobs" / "current.json", {"id": SSH_ID})
    return job_dir


def slurm_job(state: Path, started: float, lines: list[str], code: int | None = 1) -> Path:
    job_dir = state / "slurm" / SLURM_ID
    log = job_dir / "task-0.log"
    _write(
        job_dir / "job.json",
        {
            "id": SLURM_ID,
            "name": "boom",
            "kind": "command",
            "scheduler": "slurm",
            "shards": 1,
            "logs": [str(log)],
            "started": "2026-12-02T11:11:11Z",
            "started_ts": started,
            "slurm_job_id": "42",
            "slurm_user": "someone",
            "slurm_submit": "2026-12-02T11:11:11",
        },
    )
    log.write_text("".join(f"{ln}\n" for ln in lines))
    if code is not None:
        _write(
            job_dir / "exit-0.json",
            {"exit_code": code, "signal": None, "ended_ts": started + 7, "task": 0},
        )
    _write(state / "slurm" / "current.json", {"id": SLURM_ID})
    return job_dir


@pytest.fixture
def state(tmp_path: Path) -> Path:
    now = time.time()
    ssh_job(tmp_path, now - 100, ["line 0", "line 1"])
    slurm_job(tmp_path, now - 50, ["fleetops: slurm job 42 task 0 on node1", OOM])
    return tmp_path


def test_every_reader_of_the_store_sees_both_kinds(state: Path):
    assert [j["id"] for j in every_job(str(state))] == [SLURM_ID, SSH_ID]  # newest first
    assert find_job(str(state), None)[1]["id"] == SLURM_ID  # the newer of the two kinds' latest
    assert find_job(str(state), SSH_ID)[1]["id"] == SSH_ID
    assert find_job(str(state), SLURM_ID)[0] == str(state / "slurm" / SLURM_ID)
    with pytest.raises(NodeError) as no:
        find_job(str(state), "nope-1")
    assert no.value.kind == "no_job" and f"{SLURM_ID}, {SSH_ID}" in str(no.value)


def test_only_slurm_jobs_on_a_login_node(tmp_path: Path):
    slurm_job(tmp_path, time.time(), ["x"])
    assert find_job(str(tmp_path), None)[1]["id"] == SLURM_ID
    with pytest.raises(NodeError, match="no job has been started on this node"):
        find_job(str(tmp_path / "empty"), None)


def test_jobs_lists_the_slurm_job_with_its_state_exit_and_log(state: Path):
    answer = jobs_list({"state_dir": str(state)})
    assert [r["id"] for r in answer["jobs"]] == [SLURM_ID, SSH_ID] and answer["latest"] == SLURM_ID
    result = interpret_jobs_list("login01", Plan("jobs_list", {}, 60, None), answer)
    rows = {r[0]: r for r in result.data["table"]["rows"]}
    assert rows[SLURM_ID][1:3] == ["boom", "failed"] and rows[SLURM_ID][5] == "1", rows
    assert rows[SLURM_ID][4] == "7s"  # from submission to its task's end
    assert rows[SSH_ID][2] == "succeeded", rows
    assert result.data["jobs"][0]["scheduler"] == "slurm"


def test_fetch_takes_a_slurm_jobs_task_logs(state: Path):
    plan = fetch_plan({"state_dir": str(state), "job_id": SLURM_ID})
    assert plan["job_id"] == SLURM_ID
    [log] = [f for f in plan["files"] if f["role"] == "log"]
    assert log["local"] == f"{SLURM_ID}/task-0.log" and log["size"] == len(
        Path(log["path"]).read_bytes()
    )
    assert fetch_plan({"state_dir": str(state)})["job_id"] == SLURM_ID  # the latest, of either kind


def _assess(job: dict, book=None) -> list[diagnose.Finding]:
    return [
        f
        for f in diagnose.assess_answer(
            Host("login01", "127.0.0.1", scheduler="slurm"),
            {"job": job, "kernel": {"lines": []}},
            0,
            1,
            book,
        )
        if f.area == "job"
    ]


def test_diagnose_reads_a_failed_slurm_jobs_log_with_the_failure_patterns(state: Path):
    job = latest_job({"scheduler_env": {}}, str(state))
    assert job["id"] == SLURM_ID and job["scheduler"] == "slurm" and OOM in job["log_tail"]
    [f] = _assess(job)
    assert f.verdict == "WARN" and f"out of GPU memory: {OOM}" in f.msg, f
    # status's words
    assert "failed after 7s: failed (task 0: " in f.msg and "(Slurm job 42)" in f.msg
    assert (
        f.next == [f"fab -H login01 logs --job-id {SLURM_ID} --lines 200"] and "GPU memory" in f.why
    )
    assert diagnose.verdict_of([f]) == "WARN" and diagnose.EXIT_FOR["WARN"] != 0


def test_an_ended_ssh_jobs_log_is_read_with_the_failure_patterns():
    ended = {"id": SSH_ID, "pid": 7, "state": "failed", "exit": {"exit_code": 1}, "runtime_s": 3}
    [oom] = diagnose.job_findings(
        "lab01", {**ended, "log_tail": ["x", OOM, "y"]}, [], True, PROGRESS, FAILURES
    )
    assert oom.verdict == "WARN" and oom.msg.endswith(f"out of GPU memory: {OOM}") and oom.next
    # exit status 0, but the log says it failed: WARN with the matched line, not OK
    ok = {**ended, "state": "succeeded", "exit": {"exit_code": 0}}
    [bad] = diagnose.job_findings(
        "lab01",
        {**ok, "log_tail": ["Traceback (most recent call last):", "ValueError: x"]},
        [],
        True,
        PROGRESS,
        FAILURES,
    )
    assert bad.verdict == "WARN" and "last: ValueError: x" in bad.msg and "--lines" in bad.next[0]
    [clean] = diagnose.job_findings(
        "lab01", {**ok, "log_tail": ["done"]}, [], True, PROGRESS, FAILURES
    )
    assert clean.verdict == "OK"
    # the playbook's own patterns decide what a failure line is
    [own] = diagnose.job_findings(
        "lab01", {**ok, "log_tail": ["WEIRD thing"]}, [], True, PROGRESS, [re.compile("WEIRD")]
    )
    assert own.verdict == "WARN" and "last: WEIRD thing" in own.msg


def test_a_slurm_job_nothing_knows_any_more_is_still_read_for_failures(tmp_path: Path):
    job_dir = slurm_job(tmp_path, time.time() - 60, ["progress", OOM], code=None)
    record = json.loads((job_dir / "job.json").read_text())
    # squeue no longer lists it, no accounting, no exit file: its state is unknown, its log still
    # read
    job = {
        "id": SLURM_ID,
        "scheduler": "slurm",
        "slurm_job_id": "42",
        "record": record,
        "query": {},
        "exits": {},
        "log_tail": ["progress", OOM],
    }
    [f] = _assess(job)
    assert (
        f.verdict == "WARN"
        and "unknown: the scheduler no longer lists it" in f.msg
        and OOM in f.msg
    ), f
    running = {
        **job,
        "query": {
            "squeue": {
                "rc": 0,
                "stderr": "",
                "stdout": (
                    "42|42|N/A|N/A|RUNNING|None|node1|0:05|30:00|gpu:1|gpu|someone|"
                    "2026-12-02T11:11:11|boom\n"
                ),
            }
        },
    }
    [r] = _assess(running)
    assert r.verdict == "OK" and r.msg.startswith(f"job {SLURM_ID} (Slurm job 42) running"), r


def test_an_ssh_only_op_asked_for_a_slurm_job_says_what_to_change(state: Path):
    from remote_scripts.jobs.records import load_job

    with pytest.raises(
        NodeError,
        match=f"job {SLURM_ID} is a Slurm job: the inventory does not mark this host "
        "`scheduler: slurm`",
    ):
        load_job(str(state), SLURM_ID)


def test_jobs_goes_ahead_unless_it_carries_a_login_nodes_slurm_values():
    from fleetops.tasks.registry import ahead_request

    plan = Plan("jobs_list", {"limit": 0}, 120, None)
    assert ahead_request("jobs", plan, Host("n1", "127.0.0.1")) == {"limit": 0}
    login = Host(
        "l1", "127.0.0.1", scheduler="slurm", env_values=(("SLURM_CONF", "/etc/x/slurm.conf"),)
    )
    # run_jobs_list adds SLURM_CONF to the request
    assert ahead_request("jobs", plan, login) is None
