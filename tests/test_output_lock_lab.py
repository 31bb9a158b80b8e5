"""Two hosts that share a filesystem never write one extraction output at once, against a real Slurm
(tests/slurmlogin.py): lab01 (jobs over SSH) and login01 (lab01's sshd as the cluster's login node,
jobs through sbatch) have one state dir, so the lab playbook's extract writes the same output from
either. While a run of one holds the output's lock, an `extract --again` on the other is refused
before anything is submitted, naming the job that holds it; the holder SIGKILLed (as the OOM killer
does) leaves its lock, which the host that took it judges stale, and the next run goes ahead; two at
once leave one writer, and the other says why in one line."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from conftest import REPO, fab_json, run_fab
from polling import wait_for
from slurmlogin import login_node_cluster

pytestmark = [pytest.mark.lab, pytest.mark.root("slurmd runs job steps as root")]
DEADLINE = 600
JOBS = str(REPO / "tests" / "playbooks" / "jobs.yaml")


@pytest.fixture(scope="module")
def cluster(lab_factory, slurm_tools, root_user, tmp_path_factory):
    yield from login_node_cluster(lab_factory, tmp_path_factory, "outlock")


@pytest.fixture
def shared(cluster):
    project, node = cluster["project"], cluster["node"]
    rc, doc = fab_json(project, "-H", "lab01", "patch")
    assert rc == 0, doc
    yield cluster
    (node.faults_dir / "failpoints.json").unlink(missing_ok=True)
    for host in ("lab01", "login01"):
        run_fab(project, "-H", host, "stop", "--grace", "1")


def _output(node) -> Path:
    return node.state_dir / "hidden-states"


def _slurm_jobs(node) -> list[str]:
    where = node.state_dir / "slurm"
    return sorted(p.name for p in where.iterdir() if p.is_dir()) if where.exists() else []


def test_a_run_holding_the_output_refuses_the_other_host_then_a_killed_holder_is_judged_stale(
    shared,
):
    project, node = shared["project"], shared["node"]
    hit = node.faults_dir / "failpoint-extract.locked.hit"
    (node.faults_dir / "failpoints.json").write_text(
        json.dumps({"extract.locked": {"action": "pause", "seconds": 300}})
    )
    rc, doc = fab_json(project, "-H", "lab01", "extract", "--again")
    assert rc == 0, doc
    job = doc["results"][0]["data"]["job"]
    wait_for(hit.exists, "lab01's run holding its output's lock", 120)
    lock = json.loads((_output(node) / ".fleetops-output.lock").read_text())
    assert lock["job"] == job["id"], lock
    before = _slurm_jobs(node)
    rc, doc = fab_json(project, "-H", "login01", "extract", "--again")
    r = doc["results"][0]
    assert rc == 1 and r["status"] == "failed", r
    assert f"its output is in use: job {job['id']} (pid {lock['pid']} on this host" in r["msg"], r[
        "msg"
    ]
    # sbatch never ran
    assert "nothing submitted" in r["msg"] and _slurm_jobs(node) == before, r["msg"]
    # The holder dies as the OOM killer ends it: its lock stays behind, and only its own host may
    # judge it.
    os.kill(lock["pid"], signal.SIGKILL)
    hit.unlink()
    (node.faults_dir / "failpoints.json").unlink()
    wait_for(
        lambda: (Path(job["log"]).parent / "exit.json").exists(),
        "the killed run's exit record",
        120,
    )
    assert (_output(node) / ".fleetops-output.lock").exists()
    rc, doc = fab_json(project, "-H", "login01", "extract", "--again", "tail", timeout=DEADLINE)
    assert rc == 0, doc
    submitted = {r["task"]: r for r in doc["results"]}["extract"]["data"]["job"]["id"]
    manifest = json.loads((_output(node) / "manifest.json").read_text())
    assert manifest["runs"][-1]["job"] == submitted and len(manifest["samples"]) == 64, manifest[
        "runs"
    ]
    # released by the run that took it
    assert not (_output(node) / ".fleetops-output.lock").exists()


def test_two_hosts_extract_again_at_once_one_writes_the_other_says_why(shared):
    project, node = shared["project"], shared["node"]
    runs_before = (
        len(json.loads((_output(node) / "manifest.json").read_text())["runs"])
        if (_output(node) / "manifest.json").exists()
        else 0
    )
    # Each run waits 10 s with its lock taken, so that the two overlap whichever the scheduler
    # starts first.
    (node.faults_dir / "failpoints.json").write_text(
        json.dumps({"extract.locked": {"action": "sleep", "seconds": 10}})
    )
    proc = run_fab(project, "-H", "lab01,login01", "extract", "--again", "--json", timeout=DEADLINE)
    doc = json.loads(proc.stdout)
    by = {r["host"]: r for r in doc["results"]}
    launched = {h: r["data"]["job"]["id"] for h, r in by.items() if r["status"] == "changed"}
    refused = {h: r for h, r in by.items() if r["status"] == "failed"}
    for r in refused.values():
        assert "its output is in use: job " in r["msg"], r["msg"]
    for host, job_id in launched.items():
        tail = run_fab(project, "-H", host, "tail", "--job-id", job_id, timeout=DEADLINE)
        assert "Traceback" not in tail.stdout + tail.stderr, tail.stdout
    statuses = {
        h: fab_json(project, "-H", h, "status", "--job-id", j)[1]["results"][0]
        for h, j in launched.items()
    }
    won = [h for h, s in statuses.items() if s["data"]["state"] == "succeeded"]
    lost = [h for h, s in statuses.items() if s["data"]["state"] != "succeeded"]
    assert len(won) == 1, statuses
    for host in lost:  # launched, but its run found the output taken: one line, no sample written
        assert (
            "its output " in statuses[host]["msg"] and "is in use: job " in statuses[host]["msg"]
        ), statuses[host]
    manifest = json.loads((_output(node) / "manifest.json").read_text())
    assert (
        len(manifest["runs"]) == runs_before + 1 and manifest["runs"][-1]["job"] == launched[won[0]]
    ), manifest


def test_a_login_node_refuses_a_missing_dataset_before_sbatch(shared):
    project, node = shared["project"], shared["node"]
    dataset = node.state_dir / "lostdata" / "prompts.jsonl"
    assert not dataset.exists()
    before = _slurm_jobs(node)
    rc, doc = fab_json(project, "-H", "login01", "extract", "--job", "lostdata", "--playbook", JOBS)
    r = doc["results"][0]
    assert rc == 1 and r["status"] == "failed", r
    assert (
        f"its dataset {dataset} cannot be read on this login node: No such file or directory"
        in r["msg"]
    ), r
    assert "nothing submitted" in r["msg"] and _slurm_jobs(node) == before, r["msg"]
