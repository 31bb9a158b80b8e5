"""`diagnose` reads an ended SSH job's log with its playbook's failures: patterns, against a real
sshd lab node: a job that died of a CUDA out-of-memory is WARN with the matched line and its next
step, a job that exited 0 but logged an error line is WARN too, and a line only the playbook's own
patterns call a failure counts. The run's exit status is its worst finding's: 20 for WARN, 21 when
the test playbook's missing fast checks leave the patch state UNKNOWN; never 0. On a Slurm login
node: test_slurm_jobstore_lab.py."""

from __future__ import annotations

import pytest
from conftest import fab_json, run_fab

from fleetops.lab import Lab

BOOK = "tests/playbooks/failing.yaml"
OOM = (
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)"
)
pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab(lab_factory) -> Lab:
    lab = lab_factory.shared(1, __name__)
    lab.start_node(lab.node("lab01"))
    return lab


def run_job(lab: Lab, name: str) -> str:
    """The job launched and followed to its end; its id."""
    proc = run_fab(lab.root, "-H", "lab01", "extract", "--job", name, "--playbook", BOOK, "tail")
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    rc, doc = fab_json(lab.root, "-H", "lab01", "status", "--playbook", BOOK, "--job", name)
    job = doc["results"][0]["data"]["job"]
    assert job["name"] == name and doc["results"][0]["data"]["state"] in ("failed", "succeeded"), (
        doc
    )
    return job["id"]


def job_finding(lab: Lab, *extra: str) -> tuple[int, dict]:
    rc, doc = fab_json(lab.root, "-H", "lab01", "diagnose", *extra)
    [finding] = [f for f in doc["results"][0]["data"]["findings"] if f["area"] == "job"]
    return rc, finding


def test_a_gpu_out_of_memory_in_an_ended_jobs_log_is_warn_with_the_line_and_next_step(lab):
    job_id = run_job(lab, "gpuoom")
    rc, f = job_finding(lab, "--playbook", BOOK)
    assert rc >= 20 and f["verdict"] == "WARN", f
    assert f"job {job_id} (pid " in f["msg"] and "failed (exit status 1)" in f["msg"]
    assert f["msg"].endswith(f"out of GPU memory: {OOM}") and f["details"]["gpu_oom_line"] == OOM
    assert (
        f["next"] == [f"fab -H lab01 logs --job-id {job_id} --lines 200"]
        and "GPU memory" in f["why"]
    )
    screen = run_fab(lab.root, "-H", "lab01", "diagnose", "--playbook", BOOK)
    assert (
        screen.returncode >= 20
        and OOM in screen.stdout
        and f"logs --job-id {job_id}" in screen.stdout
    ), screen.stdout
    # without the playbook (its job unknown to the default one) the default failure patterns read it
    # the same
    rc, f = job_finding(lab)
    assert rc >= 20 and f["verdict"] == "WARN" and OOM in f["msg"], f


def test_an_error_line_in_a_job_that_exited_0_is_warn(lab):
    job_id = run_job(lab, "quietfail")
    rc, f = job_finding(lab, "--playbook", BOOK)
    assert rc >= 20 and f["verdict"] == "WARN", f
    assert (
        "succeeded (exit status 0), but its log has 1 line(s) its failures: patterns match; "
        "last: ValueError: sample 3 has no tokens"
        in f["msg"]
        and f["next"][0].endswith(f"--job-id {job_id} --lines 200")
    )


def test_the_playbooks_own_failure_patterns_are_the_ones_applied(lab):
    run_job(lab, "ownpattern")
    rc, f = job_finding(lab, "--playbook", BOOK)
    assert rc >= 20 and f["verdict"] == "WARN" and "last: WORKER LOST: shard 2" in f["msg"], f
    # the default patterns do not know that line: the same job, read without its playbook, is fine
    rc, f = job_finding(lab)
    assert f["verdict"] == "OK" and "succeeded" in f["msg"], f
