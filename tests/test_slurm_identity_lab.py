"""Whose Slurm job it is, against the suite's real slurmctld (tests/test_slurm_lab.py's cluster:
Debian's Slurm 22.05, a lab sshd node as the login node):
- a job that wrote `JobState=COMPLETED ExitCode=0:0 NodeList=INJECTED` into its own Comment and
  exited 1 is reported failed with exit status 1, and `fab status` exits 1;
- after the controller forgot fleetops' finished job (restarted with its state removed: ids start at
  1 again, as when they wrap at MaxJobId) and uid 65534's `alice-training` got the same id: `status`
  says the id was reused (not "pending" or "running"), `stop` cancels nothing (alice's job is still
  queued, as Slurm itself says), and `extract` is not refused as if fleetops' job were still
  queued."""

from __future__ import annotations

import pytest
import test_slurm_lab
from conftest import REPO, fab_json
from polling import wait_for
from test_slurm_lab import sh, squeue, status

pytestmark = [pytest.mark.lab, pytest.mark.root("slurmd runs job steps as root")]
JOBS = str(REPO / "tests" / "playbooks" / "slurm-identity.yaml")
DEADLINE = 300
cluster = test_slurm_lab.cluster  # the same fixture: a Slurm and a lab of this module's own


def ended(project) -> dict:
    st = status(project)
    return st if st["data"]["state"] not in ("pending", "running") else {}


def test_a_job_that_forges_its_comment_is_reported_with_its_real_exit_status(cluster):
    project, slurm = cluster["project"], cluster["slurm"]
    rc, doc = fab_json(project, "-H", "login01", "extract", "--job", "liar", "--playbook", JOBS)
    assert rc == 0, doc
    sid = doc["results"][0]["data"]["slurm_job_id"]
    st = wait_for(lambda: ended(project), "the liar job to end", DEADLINE, every=1)
    # Slurm's own record, with the forged Comment
    record = sh(slurm, "scontrol", "-o", "show", "job", sid).stdout
    assert (
        "JobState=FAILED" in record
        and "Comment=ran JobState=COMPLETED ExitCode=0:0 NodeList=INJECTED" in record
    )
    assert st["rc"] == 1 and st["status"] == "failed", st
    assert (
        st["data"]["state"] == "failed" and "failed (task 0: FAILED exit status 1)" in st["msg"]
    ), st
    assert st["data"]["tasks"][0]["exit_code"] == 1 and st["data"]["nodes"] == [slurm.node], st
    assert st["data"]["tasks"][0]["node"] == slurm.node and "succeeded" not in st["msg"], st


def test_an_id_reused_by_another_users_job_is_never_taken_for_ours(cluster):
    project, slurm = cluster["project"], cluster["slurm"]
    rc, doc = fab_json(project, "-H", "login01", "extract", "--job", "quick", "--playbook", JOBS)
    assert rc == 0, doc
    ours = doc["results"][0]["data"]["job"]
    sid = ours["slurm_job_id"]
    # its identity, recorded at submission
    assert ours["slurm_user"] == "root" and ours["slurm_submit"], ours
    wait_for(lambda: ended(project), "the quick job to end", DEADLINE, every=1)
    slurm.restart_controller()  # forgets every job: the next ids start at 1 again
    alice = ""
    for _ in range(int(sid)):
        # Held: it stays in the queue without running (a job of uid 65534 could not reach its script
        # in this lab's spool, inside the test's private temp dir); for fleetops a queued job is as
        # live as a running one.
        got = sh(
            slurm,
            "sbatch",
            "--parsable",
            "--hold",
            "--uid=65534",
            "--job-name=alice-training",
            "--chdir=/tmp",
            "--output=/dev/null",
            "--wrap",
            "sleep 600",
        )
        assert got.returncode == 0, got.stderr
        if got.stdout.strip() == sid:
            alice = sid
            break
        assert sh(slurm, "scancel", got.stdout.strip()).returncode == 0
    assert alice == sid, f"uid 65534's job never got id {sid}"
    assert squeue(slurm, sid) == [(sid, "PENDING", "JobHeldUser")]
    try:
        st = status(project)
        # from fleetops' own exit file
        assert st["data"]["state"] == "succeeded" and st["rc"] == 0, st
        assert (
            st["data"]["reused"]
            and f"Slurm job {sid} is not fleetops' job {ours['id']}" in st["msg"]
        ), st
        assert "user nobody" in st["msg"] and "'alice-training'" in st["msg"], st
        rc, doc = fab_json(project, "-H", "login01", "stop")
        res = doc["results"][0]
        assert rc == 0 and res["status"] == "ok" and "nothing to cancel" in res["msg"], res
        assert "reused" in res["msg"] and res["data"]["reused"], res
        assert squeue(slurm, sid) == [(sid, "PENDING", "JobHeldUser")]  # alice's job, untouched
        rc, doc = fab_json(
            project, "-H", "login01", "extract", "--job", "quick", "--playbook", JOBS
        )
        # not "still in the queue"
        assert rc == 0 and "submitted job quick-" in doc["results"][0]["msg"], doc
        assert squeue(slurm, sid) == [(sid, "PENDING", "JobHeldUser")]
    finally:
        sh(slurm, "scancel", sid)
