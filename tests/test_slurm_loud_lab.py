"""Slurm that fails loudly, against a real Slurm 22.05 started by `fab lab.slurm up`
(fleetops/lab/slurm.py) on a lab of its own: slurmctld stopped mid-job makes `status` and `stop`
exit non-zero naming the controller (never "not in the queue"/"nothing to cancel"), the job keeps
running, and once slurmctld is back (restarted with its saved state, no `-c`) it is reported running
and `stop` cancels it, confirmed by Slurm's state. A job cancelled while pending says so; a requeued
task says requeued; a refused sbatch leaves nothing behind. `fab lab.down` stops the cluster and
leaves no process of it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, fab_json, run_fab
from polling import wait_for
from slurmkit import alive, hold_every_gpu, sh, squeue, wait_pending_for_gpus

from fleetops.lab.slurm import SlurmLab, login_inventory

pytestmark = [pytest.mark.lab, pytest.mark.root("slurmd runs job steps as root")]
JOBS = str(REPO / "tests" / "playbooks" / "jobs.yaml")
DEADLINE = 300


@pytest.fixture(scope="module")
def cluster(lab_factory, slurm_tools, root_user):
    with lab_factory.own("slurmloud", 1) as lab:
        project = lab.root
        slurm = SlurmLab(project / ".lab" / "slurm")
        try:
            up = run_fab(project, "lab.slurm", "up", timeout=300)
            assert up.returncode == 0, up.stdout + up.stderr
            assert re.search(
                r"^inventory: .*lab-slurm\.yaml \(login01 on lab01's sshd", up.stdout, re.M
            ), up.stdout
            hosts = (project / "hosts" / "lab-slurm.yaml").read_text()
            assert "scheduler: slurm" in hosts and f"SLURM_CONF: {slurm.conf}" in hosts
            node = lab.node("lab01")
            # login02: the same login node, a partition the cluster does not have (sbatch refuses
            # the job).
            (project / "hosts" / "lab-slurm-bad.yaml").write_text(
                login_inventory(
                    slurm,
                    name="login02",
                    port=node.port,
                    python=node.python,
                    state_dir=node.state_dir,
                    user=lab.user,
                    client_key=lab.client_key,
                    known_hosts=lab.known_hosts,
                ).replace("partition: gpu", "partition: nosuch")
            )
            yield {"project": project, "slurm": slurm, "node": node}
            status = run_fab(project, "lab.slurm", "status")
            assert status.returncode == 0 and "slurmctld pid" in status.stdout, (
                status.stdout + status.stderr
            )
            down = run_fab(project, "lab.down", timeout=300)  # stops the cluster too
            assert down.returncode == 0 and "Slurm slurmctld" in down.stdout, (
                down.stdout + down.stderr
            )
        finally:
            left = slurm.leftovers()
            if left or slurm.running("slurmctld"):
                slurm.down()
            assert left == [], "a process of the test's Slurm outlived lab.down"


def fab(project: Path, *args: str) -> tuple[int, dict, float]:
    started = time.monotonic()
    rc, doc = fab_json(project, "-H", "login01", *args)
    return rc, doc["results"][0], time.monotonic() - started


def spawn(project: Path, job: str = "spawner") -> tuple[dict, str, int | None]:
    rc, doc = fab_json(project, "-H", "login01", "extract", "--job", job, "--playbook", JOBS)
    assert rc == 0, doc
    res = doc["results"][0]["data"]
    if job != "spawner":
        return res["job"], res["slurm_job_id"], None
    log = Path(res["job"]["logs"][0])
    m = wait_for(
        lambda: re.search(r"spawned (\d+)", log.read_text() if log.exists() else ""),
        "the job's child",
        DEADLINE,
    )
    return res["job"], res["slurm_job_id"], int(m.group(1))


def follow(project: Path) -> subprocess.Popen:
    """`fab -H login01 tail` in the background, as an operator leaves it following a job."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.Popen(
        [sys.executable, "-m", "fabric", "-H", "login01", "tail"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_controller_down_mid_job_status_and_stop_fail_naming_it_then_running_once_it_is_back(
    cluster,
):
    project, slurm = cluster["project"], cluster["slurm"]
    job, sid, child = spawn(project)
    assert slurm.stop_controller()
    # started while the controller is away: it follows the log, it does not end
    follower = follow(project)
    rc, st, took = fab(project, "status")
    assert rc != 0 and st["status"] == "failed" and st["data"]["state"] == "unknown", st
    assert (
        "UNKNOWN: Slurm's controller cannot be reached" in st["msg"] and "is DOWN" in st["msg"]
    ), st["msg"]
    assert "no longer lists it" not in st["msg"] and took < 20, (took, st["msg"])
    assert st["data"]["next"]["commands"] == [f"fab -H login01 status --job-id {job['id']}"], st[
        "data"
    ]
    rc, stop, took = fab(project, "stop")
    assert rc != 0 and stop["status"] == "failed", stop
    assert (
        f"job {job['id']} (Slurm job {sid}) was NOT cancelled: Slurm's controller cannot be reached"
        in stop["msg"]
    )
    assert (
        "nothing to cancel" not in stop["msg"]
        and "not in the queue" not in stop["msg"]
        and took < 20
    ), took
    assert alive(child)  # the job kept running under slurmd
    # The plain output says it too (not only --json), on the result's line.
    plain = run_fab(project, "-H", "login01", "status")
    assert plain.returncode != 0 and "controller cannot be reached" in plain.stdout, (
        plain.stdout + plain.stderr
    )
    # diagnose: the allocation's line is UNKNOWN (never OK) while the controller cannot say where
    # the job is.
    rc, diag = fab_json(project, "-H", "login01", "diagnose")
    found = {f["area"]: f for f in diag["results"][0]["data"]["findings"]}
    assert (
        found["slurm"]["verdict"] == "UNKNOWN"
        and "controller cannot be reached" in found["slurm"]["msg"]
    ), found
    assert rc >= 21, (rc, found["slurm"])

    assert follower.poll() is None, follower.communicate()[0]
    slurm.up()  # slurmctld again, with its saved state: the queue is kept
    assert slurm.running("slurmctld") and "-c" not in Path(
        f"/proc/{slurm.running('slurmctld')}/cmdline"
    ).read_bytes().split(b"\0")
    st = wait_for(
        lambda: (lambda s: s if s[0] == 0 and s[1]["data"]["state"] == "running" else None)(
            fab(project, "status")
        ),
        "status: running again",
        120,
        every=1,
    )[1]
    assert f"(Slurm job {sid}): running" in st["msg"] and alive(child), st
    rc, stop, _ = fab(project, "stop")
    assert rc == 0 and stop["status"] == "changed", stop
    assert (
        f"cancelled job {job['id']} (Slurm job {sid}) with scancel: Slurm says CANCELLED"
        in stop["msg"]
    ), stop
    assert squeue(slurm, sid) == []
    wait_for(lambda: not alive(child), "the job's child gone", 60)
    out = follower.communicate(timeout=120)[0]
    # ended by fleetops' own stop: 0
    assert follower.returncode == 0 and "Traceback" not in out, out
    gone = out.index("the job may still be running: following its log until Slurm answers again")
    assert "Slurm's controller cannot be reached" in out[:gone] and gone < out.index(
        "controller answers again"
    ) < out.index(f"job {job['id']} cancelled"), out
    rc, st, _ = fab(project, "status")
    # fleetops' own stop: 0, in the README's table
    assert rc == 0 and st["data"]["state"] == "cancelled", st
    assert re.search(r"cancelled by fab stop at \S+ \(its task got signal 15\)", st["msg"]), st[
        "msg"
    ]
    rc, again, _ = fab(project, "stop")
    assert (
        rc == 0
        and again["status"] == "ok"
        and "is not in the queue (cancelled by fab stop" in again["msg"]
    )


def test_tail_with_the_controller_down_ends_as_the_jobs_exit_record_says(cluster):
    project, slurm = cluster["project"], cluster["slurm"]
    job, sid, _ = spawn(project, "finisher")
    log = Path(job["logs"][0])
    where = log.parent
    # the job's own dir
    assert (where / "batch.py").exists(), sorted(p.name for p in where.iterdir())
    wait_for(
        lambda: "waiting for go" in (log.read_text() if log.exists() else ""),
        "the job running",
        DEADLINE,
    )
    assert slurm.stop_controller()
    try:
        follower = follow(project)
        (where / "go").touch()  # the job ends, exit 0, while nobody can ask Slurm about it
        out = follower.communicate(timeout=180)[0]
        ended = json.loads((where / "exit-0.json").read_text())
        assert ended["exit_code"] == 0 and not ended["signal"], ended
        assert "done: 64/64 samples" in out, out
        assert follower.returncode == 0 and "Traceback" not in out, out
        last = out.strip().splitlines()
        assert any(f"job {job['id']} succeeded (exit status 0)" in ln for ln in last[-8:]), out
        assert "may still be running" not in "\n".join(last[-8:]), out
        rc, st, _ = fab(project, "status")
        assert rc == 0 and st["data"]["state"] == "succeeded", st
    finally:
        slurm.up()
        # The controller learns from slurmd that the job ended only once it is back: until then it
        # still lists the job, and the next test's extract would be refused as one already in the
        # queue.
        wait_for(lambda: squeue(slurm, sid) == [], "Slurm no longer listing the finished job", 120)


def test_a_job_cancelled_while_pending_says_cancelled_and_never_ran(cluster):
    project, slurm = cluster["project"], cluster["slurm"]
    blocker = hold_every_gpu(slurm, "blocker.log")
    try:
        job, sid, _ = spawn(project, "numbers")
        wait_pending_for_gpus(slurm, sid, "our job PENDING")
        rc, stop, _ = fab(project, "stop")
        assert rc == 0 and stop["status"] == "changed" and "Slurm says CANCELLED" in stop["msg"], (
            stop
        )
        rc, st, _ = fab(project, "status")
        assert rc == 0 and st["data"]["state"] == "cancelled", st
        assert re.search(
            rf"\(Slurm job {sid}\): cancelled by fab stop at \S+ while pending: it never ran$",
            st["msg"],
        ), st["msg"]
        assert "signal" not in st["msg"] and not Path(job["logs"][0]).exists()
        # Cancelled by someone else (scancel outside fleetops): said so, and status fails.
        job, sid, _ = spawn(project, "numbers")
        wait_pending_for_gpus(slurm, sid, "the next job PENDING")
        assert sh(slurm, "scancel", sid).returncode == 0
        rc, st, _ = fab(project, "status")
        assert (
            rc == 1
            and "cancelled by scancel outside fleetops while pending: it never ran" in st["msg"]
        ), st
    finally:
        sh(slurm, "scancel", blocker)


def test_a_requeued_task_says_requeued_and_is_still_ours(cluster):
    project, slurm = cluster["project"], cluster["slurm"]
    job, sid, child = spawn(project)
    assert sh(slurm, "scontrol", "requeue", sid).returncode == 0
    wait_for(
        lambda: squeue(slurm, sid) and squeue(slurm, sid)[0][1] == "PENDING", "the job requeued", 60
    )
    rc, st, _ = fab(project, "status")
    assert rc == 0 and st["data"]["state"] == "pending" and not st["data"]["reused"], st
    assert (
        f"(Slurm job {sid}): requeued by Slurm (1 time), pending (waiting for the scheduler: "
        in st["msg"]
    ), st
    assert st["data"]["tasks"][0]["restarts"] == 1
    # still fleetops' job, though Slurm gave it a new submit time
    rc, stop, _ = fab(project, "stop")
    assert rc == 0 and stop["status"] == "changed" and "Slurm says CANCELLED" in stop["msg"], stop
    assert squeue(slurm, sid) == []
    wait_for(lambda: not alive(child), "the first run's child gone", 60)


def test_a_refused_sbatch_leaves_nothing_behind(cluster):
    project, node = cluster["project"], cluster["node"]
    base = node.state_dir / "slurm"
    before = sorted(p.name for p in base.iterdir()) if base.exists() else []
    current = (base / "current.json").read_text() if (base / "current.json").exists() else None
    rc, doc = fab_json(project, "-H", "login02", "extract", "--job", "numbers", "--playbook", JOBS)
    res = doc["results"][0]
    assert rc == 1 and res["status"] == "failed", res
    assert (
        "sbatch refused the job (exit 1)" in res["msg"] and "nothing was left behind" in res["msg"]
    ), res["msg"]
    assert "invalid partition" in res["msg"].lower(), res["msg"]
    assert sorted(p.name for p in base.iterdir()) == before  # no job dir, no batch.py, no job.json
    assert ((base / "current.json").read_text() if current is not None else None) == current
