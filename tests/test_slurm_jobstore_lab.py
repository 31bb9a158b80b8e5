"""`jobs`, `fetch` and `diagnose` on a Slurm login node, against a real Slurm
(fleetops/lab/slurm.py: munged, slurmctld, slurmd 22.05 in the test's temp directory) with a lab
sshd node as its login node: they read the same job store as `status` and `logs`, so the Slurm job
is listed, its task log fetched, and a CUDA out-of-memory in its log is WARN with the line and its
next step (diagnose exits non-zero)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import fab_json, fab_json_output, run_fab
from slurmlogin import login_node_cluster

pytestmark = [pytest.mark.lab, pytest.mark.root("slurmd runs job steps as root")]
BOOK = "tests/playbooks/failing.yaml"
OOM = (
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)"
)
DEADLINE = 300


@pytest.fixture(scope="module")
def cluster(lab_factory, slurm_tools, root_user, tmp_path_factory):
    yield from login_node_cluster(lab_factory, tmp_path_factory, "slurm-store")


@pytest.fixture(scope="module")
def oom_job(cluster) -> dict:
    """The gpuoom job through sbatch, followed to its end: it died of a CUDA out-of-memory."""
    project, slurm = cluster["project"], cluster["slurm"]
    rc, doc = fab_json(project, "-H", "login01", "extract", "--job", "gpuoom", "--playbook", BOOK)
    res = doc["results"][0]
    assert rc == 0 and "submitted job gpuoom-" in res["msg"], res
    proc = run_fab(
        project,
        "-H",
        "login01",
        "tail",
        "--playbook",
        BOOK,
        "--job",
        "gpuoom",
        timeout=DEADLINE * 2,
    )
    assert proc.returncode == 1 and "failed (task 0: FAILED exit status 1)" in proc.stdout, (
        proc.stdout + proc.stderr
    )
    sid = res["data"]["slurm_job_id"]
    # Slurm's own word: the job failed with exit status 1 (squeue keeps an ended job for MinJobAge)
    seen = subprocess.run(
        ["squeue", "--noheader", "--states=all", "--format=%T", f"--jobs={sid}"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **slurm.env},
    ).stdout
    assert seen.strip() in ("FAILED", ""), seen
    return {"id": res["data"]["job"]["id"], "sid": sid, "log": Path(res["data"]["job"]["logs"][0])}


def test_jobs_lists_the_slurm_job(cluster, oom_job):
    rc, doc, _ = fab_json_output(cluster["project"], "-H", "login01", "jobs")
    res = doc["results"][0]
    assert rc == 0 and res["msg"].startswith("1 jobs, newest first; none running"), res
    [row] = res["data"]["table"]["rows"]
    assert row[0] == oom_job["id"] and row[1:3] == ["gpuoom", "failed"] and row[5] == "1", row
    assert (
        res["data"]["latest"] == oom_job["id"]
        and res["data"]["jobs"][0]["slurm_job_id"] == oom_job["sid"]
    )
    screen = run_fab(cluster["project"], "-H", "login01", "jobs")
    assert (
        screen.returncode == 0 and oom_job["id"] in screen.stdout and "no jobs" not in screen.stdout
    )


def test_fetch_takes_the_slurm_jobs_log(cluster, oom_job, tmp_path):
    for named in ((), ("--job-id", oom_job["id"])):  # the latest job, and the job by its id
        dest = tmp_path / ("by-id" if named else "latest")
        rc, doc, _ = fab_json_output(
            cluster["project"], "-H", "login01", "fetch", *named, "--dest", str(dest)
        )
        res = doc["results"][0]
        assert rc == 0 and res["data"]["job_id"] == oom_job["id"], res
        got = dest / "login01" / oom_job["id"] / "task-0.log"
        assert got.read_bytes() == oom_job["log"].read_bytes() and OOM in got.read_text(), res
    rc, doc = fab_json(
        cluster["project"], "-H", "login01", "fetch", "--job-id", "nope-1", "--dest", str(tmp_path)
    )
    assert (
        rc == 1
        and f"no job 'nope-1' on this node; its jobs, newest first: {oom_job['id']}"
        in doc["results"][0]["msg"]
    )


def test_diagnose_finds_the_gpu_out_of_memory_in_the_slurm_jobs_log(cluster, oom_job):
    for book in (("--playbook", BOOK), ()):  # its own failures: patterns, and the defaults
        rc, doc, _ = fab_json_output(cluster["project"], "-H", "login01", "diagnose", *book)
        res = doc["results"][0]
        [f] = [f for f in res["data"]["findings"] if f["area"] == "job"]
        assert rc >= 20 and f["verdict"] == "WARN", json.dumps(res["data"]["findings"], indent=1)
        assert f"job {oom_job['id']} (Slurm job {oom_job['sid']}) failed" in f["msg"], f
        assert f["msg"].endswith(f"out of GPU memory: {OOM}"), f
        assert f["next"] == [f"fab -H login01 logs --job-id {oom_job['id']} --lines 200"], f
        assert "nothing wrong found" not in res[
            "msg"
        ] and "no job has been started" not in json.dumps(res)
    screen = run_fab(cluster["project"], "-H", "login01", "diagnose", "--playbook", BOOK)
    assert (
        screen.returncode >= 20
        and OOM in screen.stdout
        and f"logs --job-id {oom_job['id']}" in screen.stdout
    )
    # the command it names shows the same line
    logs = run_fab(cluster["project"], "-H", "login01", "logs", "--job-id", oom_job["id"])
    assert logs.returncode == 0 and OOM in logs.stdout, logs.stdout + logs.stderr
