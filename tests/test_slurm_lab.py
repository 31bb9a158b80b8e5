"""Jobs through a real Slurm: Debian's munged, slurmctld and slurmd (22.05), started by this module
in its own temp directory (fleetops/lab/slurm.py: one node, two fake GPU device files as gres,
linuxproc, no accounting), and a lab sshd node that is the cluster's login node in the inventory
(`scheduler: slurm`, partition, gres gpu:1, time limit). The lab's tiny-model extract job runs
through sbatch: pending while another job holds the GPUs, running, followed by tail to its end;
stopped with scancel; split into a 2-task job array. The module stops the daemons at the end and
fails if any process of the cluster is left."""

from __future__ import annotations

import io
import json
import re
import subprocess
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO, fab_json, run_fab
from faultkit import hit_file
from hiddenstates import compare_to_reference
from pausekit import fab_paused_at
from polling import wait_for
from slurmkit import alive, hold_every_gpu, sh, squeue, wait_pending_for_gpus
from slurmlogin import login_node_cluster

from fleetops.lab.slurm import SlurmLab

pytestmark = [pytest.mark.lab, pytest.mark.root("slurmd runs job steps as root")]
JOBS = str(REPO / "tests" / "playbooks" / "jobs.yaml")
# a loaded 2-core machine: the tiny model's extraction takes tens of seconds per task
DEADLINE = 300


@pytest.fixture(scope="module")
def cluster(lab_factory, slurm_tools, root_user, tmp_path_factory):
    yield from login_node_cluster(lab_factory, tmp_path_factory, "slurm")


def squeue_all(slurm: SlurmLab) -> list[str]:
    return sh(slurm, "squeue", "--noheader", "--array", "--format=%i").stdout.split()


def status(project: Path, *extra: str) -> dict:
    rc, doc = fab_json(project, "-H", "login01", "status", *extra)
    return {"rc": rc, **doc["results"][0]}


def test_extract_through_slurm_pending_then_running_then_tail_to_the_end(cluster):
    project, slurm, node = cluster["project"], cluster["slurm"], cluster["node"]
    out = node.state_dir / "hidden-states"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    # The playbook's fast checks run on the login node first: unpatched, nothing reaches sbatch.
    rc, doc = fab_json(project, "-H", "login01", "extract")
    res = doc["results"][0]
    assert (
        rc == 1
        and res["msg"].startswith("refused to submit extract: check ")
        and "[grep]" in res["msg"]
    ), res
    assert not list((node.state_dir / "slurm").glob("extract-*")) and squeue_all(slurm) == []
    assert fab_json(project, "-H", "login01", "patch")[0] == 0
    # Another user's job holds both GPUs: ours must wait in the queue.
    blocker_id = hold_every_gpu(slurm, "blocker.log")
    wait_for(
        lambda: "RUNNING" in {s for _, s, _ in squeue(slurm, blocker_id)},
        "the blocker running",
        DEADLINE,
    )

    # Two `extract` at the same moment: the login node's submit lock lets exactly one reach sbatch.
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda _: fab_json(project, "-H", "login01", "extract"), range(2)))
    assert sorted(rc for rc, _ in both) == [0, 1], both
    (rc, doc), (_, refused) = sorted(both, key=lambda x: x[0])
    res = doc["results"][0]
    assert (
        res["status"] == "changed"
        and "submitted job extract-" in res["msg"]
        and "gres gpu:1" in res["msg"]
    )
    assert (
        f"(Slurm job {res['data']['slurm_job_id']}) is still in the Slurm queue"
        in refused["results"][0]["msg"]
    )
    sid = res["data"]["slurm_job_id"]
    argv = res["data"]["job"]["sbatch_argv"]
    assert "--gres=gpu:1" in argv and "--partition=gpu" in argv and "--time=00:30:00" in argv
    # Slurm's own view: our job is queued for resources.
    wait_pending_for_gpus(slurm, sid, "Slurm to hold our job PENDING")
    st = status(project)
    assert st["rc"] == 0 and st["data"]["state"] == "pending", st
    assert "pending (waiting for the scheduler: Resources)" in st["msg"]
    assert st["data"]["tasks"][0]["slurm_id"] == sid

    assert sh(slurm, "scancel", blocker_id).returncode == 0
    wait_for(
        lambda: status(project)["data"]["state"] == "running",
        "fleetops status: running",
        DEADLINE,
        every=1,
    )
    st = status(project)
    assert st["data"]["nodes"] == [slurm.node] and f"on node {slurm.node}" in st["msg"]
    assert squeue(slurm, sid)[0][1] in ("RUNNING", "COMPLETING")

    proc = run_fab(project, "-H", "login01", "tail", timeout=DEADLINE * 3)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"login01 .*progress samples=64/64", proc.stdout), proc.stdout[-3000:]
    assert "succeeded (exit status 0)" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["total"] == 64 and len(manifest["samples"]) == 64
    assert all((out / s["file"]).stat().st_size > 0 for s in manifest["samples"].values())
    # The job ran inside Slurm's allocation (the batch script's first line names Slurm's job id and
    # node).
    log = Path(res["data"]["job"]["logs"][0]).read_text()
    assert f"fleetops: slurm job {sid} task 0 on {slurm.node}" in log
    st = status(project)
    assert (
        st["rc"] == 0
        and st["data"]["state"] == "succeeded"
        and st["data"]["tasks"][0]["exit_code"] == 0
    )
    logs = run_fab(project, "-H", "login01", "logs", "--lines", "3")
    assert logs.returncode == 0 and "done: 64/64 samples" in logs.stdout, logs.stdout
    # the 2-shard test compares its shards with it
    reference = node.state_dir / "reference-hidden-states"
    subprocess.run(["rm", "-rf", str(reference)], check=True)
    out.rename(reference)
    cluster["reference"] = reference


def test_stop_is_scancel_and_leaves_no_process(cluster):
    project, slurm = cluster["project"], cluster["slurm"]
    rc, doc = fab_json(project, "-H", "login01", "extract", "--job", "spawner", "--playbook", JOBS)
    assert rc == 0, doc
    job = doc["results"][0]["data"]["job"]
    sid = doc["results"][0]["data"]["slurm_job_id"]
    log = Path(job["logs"][0])
    m = wait_for(
        lambda: re.search(r"spawned (\d+)", log.read_text() if log.exists() else ""),
        "the job's child",
        DEADLINE,
    )
    child = int(m.group(1))
    assert Path(f"/proc/{child}").exists()
    rc, doc = fab_json(project, "-H", "login01", "stop")
    res = doc["results"][0]
    assert rc == 0 and res["status"] == "changed", res
    assert f"cancelled job {job['id']} (Slurm job {sid}) with scancel" in res["msg"]
    assert squeue(slurm, sid) == []  # Slurm no longer lists it
    wait_for(lambda: not alive(child), "the job's child process gone", 60)
    st = status(project)
    assert st["data"]["state"] == "cancelled" and "cancelled by fab stop at" in st["msg"], st
    assert st["rc"] == 0  # ended as fleetops' own stop asked
    again = fab_json(project, "-H", "login01", "stop")[1]["results"][0]
    assert again["status"] == "ok" and "nothing to cancel" in again["msg"]


def test_two_shard_job_array(cluster):
    project, slurm, node = cluster["project"], cluster["slurm"], cluster["node"]
    out = node.state_dir / "hidden-states"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    # the playbook's checks pass (already applied)
    assert fab_json(project, "-H", "login01", "patch")[0] == 0
    rc, doc = fab_json(project, "-H", "login01", "extract", "--shards", "2")
    assert rc == 0, doc
    res = doc["results"][0]
    sid = res["data"]["slurm_job_id"]
    assert (
        "as a job array of 2 tasks" in res["msg"]
        and "--array=0-1" in res["data"]["job"]["sbatch_argv"]
    )
    seen = wait_for(lambda: squeue(slurm, sid), "the array in squeue", 60)
    assert {i for i, _, _ in seen} <= {f"{sid}_0", f"{sid}_1"}
    # --from-start: each task from its first line (a later command's tail shows only the last 20
    # lines).
    proc = run_fab(project, "-H", "login01", "tail", "--from-start", timeout=DEADLINE * 3)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "earlier lines not shown" not in proc.stdout
    for task in (0, 1):
        assert re.search(rf"login01\[{task}\] .*progress samples=32/32", proc.stdout), proc.stdout[
            -3000:
        ]
        assert (
            f"login01[{task}] | fleetops: slurm job {sid}_{task} task {task} on {slurm.node}"
            in proc.stdout
        )
    st = status(project)
    assert (
        st["data"]["state"] == "succeeded"
        and [t["state"] for t in st["data"]["tasks"]] == ["succeeded"] * 2
    )
    assert st["msg"].endswith("; 2 tasks: 2 succeeded"), st["msg"]
    # Run again: every shard is complete, so nothing is submitted (no model loaded to write
    # nothing).
    jobs_before = sorted(p.name for p in (node.state_dir / "slurm").iterdir())
    rc, again = fab_json(project, "-H", "login01", "extract", "--shards", "2")
    res = again["results"][0]
    assert (
        rc == 0 and res["status"] == "ok" and "nothing to do: all 2 shards complete" in res["msg"]
    ), res
    assert res["data"]["job"] is None and squeue_all(slurm) == []
    assert sorted(p.name for p in (node.state_dir / "slurm").iterdir()) == jobs_before
    # Shard i of 2 did rows [32*i, 32*(i+1)) of the dataset: together every row once.
    dataset = [
        ln
        for ln in (node.state_dir / "lab-data" / "prompts.jsonl").read_text().splitlines()
        if ln.strip()
    ]
    rows = []
    for task in (0, 1):
        shard = out / "shards" / f"output-{task}-of-2"
        manifest = json.loads((shard / "manifest.json").read_text())
        assert manifest["total"] == 32 and len(manifest["samples"]) == 32
        rows += (out / "shards" / f"dataset-{task}-of-2.jsonl").read_text().splitlines()
    assert rows == dataset
    # The same hidden states as the single-task run of test 1 (sample 32*i + j is shard i's sample
    # j).
    reference = cluster.get("reference")
    assert reference is not None, (
        "run the whole module: test 1's single-task output is the reference"
    )
    parts = [(f"{out}/shards/output-{task}-of-2", 32 * task) for task in (0, 1)]
    result = compare_to_reference(reference, parts)
    assert result["checked"] == 64 and result["worst"] < 1e-5, result


def test_stop_a_job_that_ignores_sigterm_and_a_pending_one(cluster):
    project, slurm = cluster["project"], cluster["slurm"]
    # `stubborn` ignores SIGTERM (so does its child `sleep`): Slurm's SIGKILL after KillWait (5 s
    # here) ends it.
    rc, doc = fab_json(project, "-H", "login01", "extract", "--job", "stubborn", "--playbook", JOBS)
    assert rc == 0, doc
    log = Path(doc["results"][0]["data"]["job"]["logs"][0])
    child = int(
        wait_for(
            lambda: re.search(r"spawned (\d+)", log.read_text() if log.exists() else ""),
            "the stubborn job's child",
            DEADLINE,
        ).group(1)
    )
    rc, doc = fab_json(project, "-H", "login01", "stop")
    assert rc == 0 and doc["results"][0]["status"] == "changed", doc
    # scancel's SIGTERM arrived and was ignored; SIGKILL followed
    assert "got SIGTERM" in log.read_text()
    wait_for(lambda: not alive(child), "the child gone", 60)
    assert status(project)["data"]["state"] == "cancelled"
    # A job still waiting for GPUs is cancelled before it ever runs: no log, state cancelled.
    blocker = hold_every_gpu(slurm, "blocker2.log")
    rc, doc = fab_json(project, "-H", "login01", "extract", "--job", "numbers", "--playbook", JOBS)
    assert rc == 0, doc
    sid = doc["results"][0]["data"]["slurm_job_id"]
    never_ran = Path(doc["results"][0]["data"]["job"]["logs"][0])
    wait_pending_for_gpus(slurm, sid, "our job PENDING")
    rc, doc = fab_json(project, "-H", "login01", "stop")
    assert rc == 0 and "with scancel" in doc["results"][0]["msg"], doc
    st = status(project)
    assert (
        st["data"]["state"] == "cancelled" and st["data"]["tasks"][0]["slurm_state"] == "CANCELLED"
    ), st
    assert "while pending: it never ran" in st["msg"] and "signal" not in st["msg"], st
    # Slurm creates the output file when the task starts: it never did
    assert not never_ran.exists()
    assert sh(slurm, "scancel", blocker).returncode == 0


def test_gpu_looks_into_the_running_jobs_allocation(cluster):
    """`fab -H login01 gpu` on a Slurm login node (tasks/gpu.py asks the host's job backend: the
    Slurm one's run_gpu): the agent's own gpu op run inside the job with srun --overlap, on the
    allocation's node."""
    from fleetops.plans.gpugate import Gate
    from fleetops.state import RunState
    from fleetops.tasks.jobs.slurm.jobs import run_gpu
    from fleetops.tasks.plan import Plan

    project, slurm = cluster["project"], cluster["slurm"]
    rc, doc = fab_json(project, "-H", "login01", "extract", "--job", "spawner", "--playbook", JOBS)
    assert rc == 0, doc
    sid = doc["results"][0]["data"]["slurm_job_id"]
    log = Path(doc["results"][0]["data"]["job"]["logs"][0])
    wait_for(
        lambda: "spawned" in (log.read_text() if log.exists() else ""), "the job running", DEADLINE
    )
    state = RunState(project, {"inventory": "hosts"})
    state.reporter.json_mode = True
    plan = Plan("gpu", {}, 60, None, options={"gate": Gate()})
    try:
        node = state.connections().get(state.host("login01"))
        res = run_gpu(state, plan, node)
        assert res.data["node"] == slurm.node and res.data["task_job_id"] == sid, res
        assert res.data["srun_argv"][:3] == ["srun", f"--jobid={sid}", "--overlap"]
        # the lab's two GPUs
        assert len(res.data["gpus"]) == 2 and f"on node {slurm.node}" in res.msg, res
        # Slurm's own record of the extra step inside the job (the first srun step of job ID is
        # ID.0).
        slurmd = slurm.log_file("slurmd").read_text()
        assert re.search(rf"StepId={sid}\.0\b", slurmd), slurmd[-3000:]
        # the task as typed reaches the same code
        rc, through_fab = fab_json(project, "-H", "login01", "gpu")
        got = through_fab["results"][0]
        assert (
            rc == 0 and got["data"]["node"] == slurm.node and f"on node {slurm.node}" in got["msg"]
        ), got
        # diagnose on the login node names the allocation's node (gpu/diagnose report it).
        _, diag = fab_json(project, "-H", "login01", "diagnose")
        [alloc] = [f for f in diag["results"][0]["data"]["findings"] if f["area"] == "slurm"]
        assert f"(Slurm job {sid}) running on node {slurm.node}" in alloc["msg"], alloc
        assert fab_json(project, "-H", "login01", "stop")[0] == 0
        idle = run_gpu(state, plan, node)
        assert idle.status.value == "ok" and "no task of the job is running" in idle.msg, idle
    finally:
        state.connections().close_all()


def _login01_lines(text: str) -> list[int]:
    return [int(m[1]) for m in re.finditer(r"^login01 \| line (\d+)$", text, re.M)]


def test_tail_attaching_later_shows_the_last_20_lines_and_extract_tail_the_first(cluster):
    """On a Slurm login node, as on an SSH node: `tail` attaching to a job an earlier command
    submitted shows each task's last 20 lines (--lines N) and says what it left out; --from-start
    and `extract tail` in one command show it from its first line."""
    project, slurm = cluster["project"], cluster["slurm"]
    wide = {"COLUMNS": "300"}
    rc, doc = fab_json(project, "-H", "login01", "extract", "--job", "numbers", "--playbook", JOBS)
    assert rc == 0, doc
    job_id = doc["results"][0]["data"]["job"]["id"]
    sid = doc["results"][0]["data"]["slurm_job_id"]
    wait_for(
        lambda: status(project)["data"]["state"] == "succeeded",
        "the numbers job to end",
        DEADLINE,
        every=1,
    )
    later = run_fab(project, "-H", "login01", "tail", env=wide, timeout=DEADLINE)
    assert later.returncode == 0, later.stdout + later.stderr
    assert _login01_lines(later.stdout) == list(range(100, 120)), later.stdout[-3000:]
    # 101 lines left out: the batch script's own first line and lines 0-99.
    assert re.search(
        rf"^login01 \| job {job_id}: 101 earlier lines "
        r"not shown \(\d+ bytes\); --from-start replays "
        "them$",
        later.stdout,
        re.M,
    ), later.stdout[-3000:]
    assert f"fleetops: slurm job {sid} task 0" not in later.stdout
    five = run_fab(project, "-H", "login01", "tail", "--lines", "5", env=wide, timeout=DEADLINE)
    assert five.returncode == 0 and _login01_lines(five.stdout) == list(range(115, 120)), (
        five.stdout[-3000:]
    )
    assert f"job {job_id}: 116 earlier lines not shown" in five.stdout
    replay = run_fab(project, "-H", "login01", "tail", "--from-start", env=wide, timeout=DEADLINE)
    assert replay.returncode == 0 and _login01_lines(replay.stdout) == list(range(120)), (
        replay.stdout[-3000:]
    )
    assert f"login01 | fleetops: slurm job {sid} task 0 on {slurm.node}" in replay.stdout
    assert "earlier lines not shown" not in replay.stdout
    # `extract tail` in one command: the run submitted the job and has shown none of it, so all of
    # it.
    both = run_fab(
        project,
        "-H",
        "login01",
        "extract",
        "--job",
        "numbers",
        "--playbook",
        JOBS,
        "tail",
        env=wide,
        timeout=DEADLINE * 2,
    )
    assert both.returncode == 0, both.stdout + both.stderr
    assert _login01_lines(both.stdout) == list(range(120)), both.stdout[-3000:]
    assert re.search(r"^login01 \| fleetops: slurm job \d+ task 0 on ", both.stdout, re.M), (
        both.stdout[-3000:]
    )
    assert "earlier lines not shown" not in both.stdout


def test_corrupt_job_records_are_quarantined_not_fatal(cluster):
    """A corrupt state file is moved aside and reported, never fatal for every later run: the Slurm
    login node's current.json and a job's job.json, like the SSH jobs' records."""
    project, node = cluster["project"], cluster["node"]
    rc, doc = fab_json(project, "-H", "login01", "extract", "--job", "spawner", "--playbook", JOBS)
    assert rc == 0, doc
    job_id = doc["results"][0]["data"]["job"]["id"]
    assert fab_json(project, "-H", "login01", "stop")[0] == 0
    base = node.state_dir / "slurm"
    current = base / "current.json"
    current.write_text("{torn")
    st = status(project)
    assert st["data"]["job"]["id"] == job_id, st  # the newest job, found without the pointer
    assert [q["path"] for q in st["data"]["quarantined"]] == [str(current)], st["data"]
    assert not current.exists() and list(base.glob("current.json.corrupt-*"))
    record = base / job_id / "job.json"
    record.write_text("not json at all")
    rc, doc = fab_json(project, "-H", "login01", "status", "--job-id", job_id)
    res = doc["results"][0]
    assert rc == 1 and res["status"] == "failed", res
    assert (
        f"Slurm job {job_id}'s record was corrupt" in res["msg"]
        and "quarantined: moved to" in res["msg"]
    ), res
    assert [q["path"] for q in res["data"]["quarantined"]] == [str(record)], res["data"]
    later = status(project)  # every later run works: the next newest job, or a plain "no job"
    assert "corrupt" not in later["msg"] and (
        (later.get("data") or {}).get("job") or "no Slurm job has been submitted" in later["msg"]
    ), later
    rc, doc = fab_json(project, "-H", "login01", "extract", "--job", "spawner", "--playbook", JOBS)
    assert rc == 0, doc  # and a new job is submitted and becomes the latest
    assert fab_json(project, "-H", "login01", "stop")[0] == 0
    assert status(project)["data"]["job"]["id"] == doc["results"][0]["data"]["job"]["id"]


def test_the_batch_step_runs_only_the_agent_bytes_the_client_sent(cluster, tmp_path):
    """The batch script is the verifying bootstrap, started with the sha256 of the agent that
    submitted it: an agent zip swapped on the node between the submission and the step
    (deterministic: a failpoint holds the login node's agent after it wrote the batch script, before
    sbatch) never runs."""
    project, slurm, node = cluster["project"], cluster["slurm"], cluster["node"]
    marks = tmp_path / "marks"
    marks.mkdir()
    marker = marks / "step-ran"
    assert fab_json(project, "-H", "login01", "ping")[0] == 0
    target = sorted(
        (node.state_dir / "bin").glob("fleetops-agent-*.pyz"), key=lambda p: p.stat().st_mtime_ns
    )[-1]
    real = target.read_bytes()
    code = (
        f"import os\nopen({str(marker)!r}, 'w').write('planted "
        "code ran as uid %d' % os.geteuid())\n"
    )
    planted = io.BytesIO()
    with zipfile.ZipFile(planted, "w") as zf:
        for name in (
            "__main__.py",
            "remote_scripts/__init__.py",
            "remote_scripts/core/__init__.py",
            "remote_scripts/core/agent.py",
        ):
            zf.writestr(name, code)
    point = "slurm.script.after_rename"
    hit = hit_file(node, point)
    try:
        with fab_paused_at(
            project,
            [node],
            point,
            ["-H", "login01", "extract", "--job", "badmodel", "--playbook", JOBS, "--json"],
            seconds=120,
            timeout=DEADLINE,
            what=f"failpoint {point}",
        ) as proc:
            swap = target.with_name(target.name + ".swap")
            swap.write_bytes(planted.getvalue())
            swap.chmod(0o600)
            swap.replace(target)
            hit.unlink()
            out, err = proc.communicate(timeout=DEADLINE)
            assert proc.returncode == 0, out + err
            res = json.loads(out)["results"][0]
            sid, log = res["data"]["slurm_job_id"], Path(res["data"]["job"]["logs"][0])
            wait_for(
                lambda: squeue(slurm, sid) == [] and log.exists(),
                "the step to run and leave the queue",
                DEADLINE,
            )
            assert not marker.exists(), marker.read_text() + log.read_text()
            assert f"{target} is not the agent fleetops sent" in log.read_text(), log.read_text()
    finally:
        swap = target.with_name(target.name + ".swap")
        swap.write_bytes(real)
        swap.replace(target)
