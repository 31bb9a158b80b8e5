"""Jobs on real lab nodes: extract (CPU backend, the lab's tiny local model), tail (progress,
--job-id, a cut link), status (every state, `lost` included), logs, stop (SIGTERM, SIGKILL
escalation, GPU release proven by /proc and by the simulated GPU, which shows memory held exactly as
long as the job's processes live)."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, fab_json, run_fab
from polling import Follower, live_members, proc_state, wait_for

from fleetops.lab import base_dir

pytestmark = pytest.mark.lab
JOBS = str(REPO / "tests" / "playbooks" / "jobs.yaml")
ENV = {"PYTHONPATH": str(REPO), "COLUMNS": "300"}
GONE = ("gone", "Z")  # no process left, or only its exit status waiting to be collected


@pytest.fixture
def jobs(lab):
    """A lab node with no job running and no extraction output; stops whatever a test left
    running."""
    for node in lab.nodes()[:2]:
        lab.set_gpu_state(node, "idle")
        for sub in ("hidden-states", "bad-output", "jobs"):
            target = node.state_dir / sub
            if target.exists():
                subprocess.run(["rm", "-rf", str(target)], check=True)
    yield lab
    for node in lab.nodes()[:2]:
        run_fab(lab.root, "-H", node.name, "stop", "--grace", "1")


def start_job(lab, name: str) -> dict:
    rc, doc = fab_json(lab.root, "-H", "lab01", "extract", "--job", name, "--playbook", JOBS)
    assert rc == 0, doc
    return doc["results"][0]["data"]["job"]


def wait_log(job: dict, pattern: str, what: str, timeout: float = 60) -> re.Match:
    log = Path(job["log"])
    rx = re.compile(pattern, re.M)
    return wait_for(
        lambda: rx.search(log.read_text() if log.exists() else ""), f"{what} in {log}", timeout
    )


def gpu_holders(lab) -> tuple[int, list[dict]]:
    """`fab gpu` on lab01: its exit status and every process it says holds a GPU."""
    rc, doc = fab_json(lab.root, "-H", "lab01", "gpu")
    return rc, [p for i in doc["results"][0]["items"] for p in i["details"].get("processes", [])]


def assert_the_job_alone_holds_the_gpu(lab, job: dict) -> None:
    """`fab gpu` says exactly one process holds a GPU: the job's own, labelled with its id."""
    rc, procs = gpu_holders(lab)
    assert rc == 10 and [(p["pid"], p["job"]) for p in procs] == [(job["pid"], job["id"])], procs


def assert_no_gpu_holder(lab) -> None:
    """`fab gpu`, asked separately from whatever ended the job: no process holds a GPU."""
    rc, procs = gpu_holders(lab)
    assert rc == 0 and procs == [], procs


def assert_group_gone(job: dict, child: int) -> None:
    """The node's own evidence (/proc): no live process in the job's group or session, and none of
    its pids (the job, its child, the wrapper) left but as a zombie."""
    assert live_members(job["pgid"]) == []
    for pid in (job["pid"], child, job["wrapper_pid"]):
        assert proc_state(pid) in GONE, f"pid {pid} of the job outlived it ({proc_state(pid)})"


def child_of(job: dict) -> int:
    """The pid of the child the spawner jobs start, once their log names it."""
    return int(wait_log(job, r"^spawned (\d+)", "the job's child")[1])


def wait_exit_record(job: dict, what: str, timeout: float = 60) -> None:
    """Until the job's wrapper has written exit.json beside the log: the job is over, by its own
    record."""
    wait_for(lambda: (Path(job["log"]).parent / "exit.json").exists(), what, timeout)


def extract_and_tail(lab, name: str, **kw) -> subprocess.CompletedProcess:
    """`fab -H lab01 extract --job NAME ... tail --job NAME ...`: the playbook's job NAME launched
    and followed to its end, as one command."""
    return run_fab(
        lab.root,
        *("-H", "lab01", "extract", "--job", name, "--playbook", JOBS),
        *("tail", "--job", name, "--playbook", JOBS),
        **kw,
    )


def test_extract_tail_to_completion_and_outputs_match_a_direct_run(jobs):
    node = jobs.node("lab01")
    rc, doc = fab_json(jobs.root, "-H", "lab01", "patch", "extract", "tail")
    assert rc == 0, doc
    by = {r["task"]: r for r in doc["results"]}
    assert by["extract"]["status"] == "changed" and "launched job extract-" in by["extract"]["msg"]
    assert by["tail"]["status"] == "ok" and "succeeded (exit status 0)" in by["tail"]["msg"]
    out = node.state_dir / "hidden-states"
    manifest = json.loads((out / "manifest.json").read_text())
    assert (
        manifest["total"] == 64
        and len(manifest["samples"]) == 64
        and manifest["layer_ids"] == [0, 1, 2, 3]
    )
    # An independent in-process run of the same model on the same inputs. Layers 0..2 against
    # Hugging Face's own output_hidden_states. Layer 3 is the last decoder layer, whose entry there
    # comes after the final norm: it is compared with the last layer's own output (a forward hook,
    # before the norm), and that output put through the model's final norm must give Hugging Face's
    # last hidden state, which ties the hook to HF.
    script = f"""
import json, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
model_dir = {str(node.state_dir / "lab-model")!r}
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
assert len(model.model.layers) == 4
last = {{}}
model.model.layers[3].register_forward_hook(
    lambda mod, inp, out: last.update(h=out[0] if isinstance(out, tuple) else out))
rows = [json.loads(l) for l in open({str(node.state_dir / "lab-data" / "prompts.jsonl")!r})]
worst, worst3, worst_norm, gap, checked = 0.0, 0.0, 0.0, float("inf"), 0
for i, row in enumerate(rows):
    ids = row["input_ids"] if "input_ids" in row else tok(row["text"])["input_ids"]
    ids = ids[:511]
    saved = load_file({str(out)!r} + f"/sample_{{i:07d}}.safetensors")
    assert saved["input_ids"].tolist() == ids, i
    with torch.no_grad():
        hs = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        for layer in (0, 1, 2):
            worst = max(worst, (saved[f"hidden_states.{{layer}}"] - hs[layer + \
1][0]).abs().max().item())
        assert saved["hidden_states.3"].shape == (len(ids), 64), saved["hidden_states.3"].shape
        worst3 = max(worst3, (saved["hidden_states.3"] - last["h"][0]).abs().max().item())
        normed = model.model.norm(saved["hidden_states.3"].unsqueeze(0))[0]
        worst_norm = max(worst_norm, (normed - hs[4][0]).abs().max().item())
        # how far the saved layer 3 is from the normed value: the norm must make a difference on \
this model,
        # else comparing before/after it could not tell them apart
        gap = min(gap, (saved["hidden_states.3"] - hs[4][0]).abs().max().item())
    checked += 1
print(json.dumps({{"checked": checked, "worst": worst, "worst3": worst3, "worst_norm": worst_norm, \
"gap": gap}}))
"""
    proc = subprocess.run(
        [str(base_dir() / "bin" / "python"), "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["checked"] == 64, result
    assert result["worst"] < 1e-5 and result["worst3"] < 1e-5 and result["worst_norm"] < 1e-4, (
        result
    )
    assert result["gap"] > 1e-3, result


def test_failing_job_tail_exits_nonzero_with_traceback_and_status_says_failed(jobs):
    proc = extract_and_tail(jobs, "badmodel")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback (most recent call last)" in proc.stdout
    assert "failed (exit status 1)" in proc.stdout
    rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
    assert rc == 1 and doc["results"][0]["data"]["state"] == "failed"
    assert "failed" in doc["results"][0]["msg"]


def test_tail_survives_a_dropped_connection_and_sshd_restart_without_gap_or_duplicate(jobs):
    node = jobs.node("lab01")
    job = start_job(jobs, "gated")
    wait_log(job, r"^line 59$", "the job's first 60 lines")
    with Follower(
        jobs.root, ["-H", "lab01", "tail", "--job", "gated", "--playbook", JOBS], ENV
    ) as tail:
        # Mid-stream for certain: tail has shown line 59 and the job holds line 60 back until
        # <job_dir>/go exists.
        tail.wait_line(r"^lab01 \| line 59$", "tail to show line 59")
        # A job an earlier command launched: the last 20 lines, and what was skipped.
        assert re.search(
            r"^lab01 \| job \S+: 40 earlier lines not shown "
            r"\(\d+ bytes\); --from-start replays them$",
            tail.text(),
            re.M,
        ), tail.text()
        listener = node.pid()
        sessions = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(listener)], capture_output=True, text=True
        ).stdout.split()
        assert sessions, "tail's SSH session is not a child of the node's sshd"
        jobs.stop_node(node)  # sshd down: no new connections...
        for pid in sessions:  # ...and the live one cut
            os.kill(int(pid), signal.SIGKILL)
        tail.wait_line(r"^lab01 \| connection lost", "tail to notice the cut")
        (Path(job["log"]).parent / "go").touch()  # lines 60-119 are written while the link is down
        wait_log(job, r"^line 119$", "the job's last line")
        jobs.start_node(node)
        rc, out, err = tail.finish(timeout=300)
    assert rc == 0, out + err
    numbers = [int(m.group(1)) for m in re.finditer(r"^lab01 \| (?:\S+ )*?line (\d+)$", out, re.M)]
    assert numbers == list(range(40, 120)), (numbers[:5], len(numbers), out[-2000:])
    assert "reconnecting" in out
    rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
    assert doc["results"][0]["data"]["state"] == "succeeded"


def test_killed_job_reports_signal_9_and_extraction_resumes_from_the_manifest(jobs):
    node = jobs.node("lab01")
    (node.faults_dir / "failpoints.json").write_text(
        json.dumps({"extract.after_batch": {"action": "kill", "skip": 3}})
    )
    proc = run_fab(jobs.root, "-H", "lab01", "patch", "extract", "tail")
    (node.faults_dir / "failpoints.json").unlink()
    # A failed job is exit 1 (the README's table); its signal is in the message, not in the exit
    # status.
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "killed by signal 9" in proc.stdout
    rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
    assert rc == 1 and "killed by signal 9" in doc["results"][0]["msg"]
    out = node.state_dir / "hidden-states"
    first = json.loads((out / "manifest.json").read_text())
    assert len(first["samples"]) == 16  # four batches of four, then the kill
    stamps = {i: os.stat(out / s["file"]).st_mtime_ns for i, s in first["samples"].items()}

    proc = run_fab(jobs.root, "-H", "lab01", "patch", "extract", "tail")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resuming: 16/64 samples already done" in proc.stdout
    final = json.loads((out / "manifest.json").read_text())
    assert sorted(int(i) for i in final["samples"]) == list(range(64))  # none skipped
    # none redone
    assert {i: os.stat(out / final["samples"][i]["file"]).st_mtime_ns for i in stamps} == stamps
    assert sum(1 for s in final["samples"].values() if s["run"] == 1) == 48
    assert len(list(out.glob("sample_*.safetensors"))) == 64


def test_stop_kills_the_whole_group_and_confirms_gpu_memory_released(jobs):
    job = start_job(jobs, "spawner")
    child = child_of(job)
    # While it runs, the (simulated) GPU shows the job's process, labelled with its job id.
    assert_the_job_alone_holds_the_gpu(jobs, job)
    # A second job while this one runs is refused.
    rc, doc = fab_json(jobs.root, "-H", "lab01", "extract", "--job", "numbers", "--playbook", JOBS)
    assert rc == 1 and f"job {job['id']} is still running" in doc["results"][0]["msg"]
    # The spawner dies on SIGTERM: a long grace, so a slow machine never turns this into the SIGKILL
    # case.
    rc, doc = fab_json(jobs.root, "-H", "lab01", "stop", "--grace", "60")
    r = doc["results"][0]
    assert rc == 0, (r["msg"], r["items"])
    assert (
        r["status"] == "changed"
        and r["msg"] == f"stopped job {job['id']} with SIGTERM; no process of its group is left"
    ), r["msg"]
    assert r["items"][0]["label"] == "GPU memory" and r["items"][0]["msg"].startswith("released"), (
        r["items"]
    )
    assert_group_gone(job, child)
    assert_no_gpu_holder(jobs)
    rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
    assert rc == 0 and doc["results"][0]["data"]["state"] == "stopped", doc["results"][0]
    assert "stopped by fleetops' `stop` (signal 15)" in doc["results"][0]["msg"], doc["results"][0][
        "msg"
    ]
    rc, doc = fab_json(jobs.root, "-H", "lab01", "stop")
    assert (
        rc == 0
        and doc["results"][0]["status"] == "ok"
        and "nothing to stop" in doc["results"][0]["msg"]
    )


def test_stop_escalates_to_sigkill_when_the_job_ignores_sigterm(jobs):
    node = jobs.node("lab01")
    job = start_job(jobs, "stubborn")
    child = child_of(job)
    assert_the_job_alone_holds_the_gpu(jobs, job)
    grace = 10
    with Follower(
        jobs.root, ["-H", "lab01", "stop", "--grace", str(grace), "--json"], ENV
    ) as stopper:
        rx = re.compile(r"^got SIGTERM at ([0-9.]+); ignoring it", re.M)

        def termed_at() -> re.Match | None:
            if stopper.proc.poll() is not None:
                rc, out, err = stopper.finish()
                r = (
                    json.loads(out)["results"][0]
                    if out.startswith("{")
                    else {"msg": out + err, "items": []}
                )
                raise AssertionError(
                    f"stop ended (exit {rc}) before SIGTERM reached the job: {r['msg']}; "
                    f"{r['items']}"
                )
            return rx.search(Path(job["log"]).read_text())

        termed = float(wait_for(termed_at, "SIGTERM reaching the job")[1])
        # Inside the grace: the job ignored SIGTERM and lives, so the GPU still shows its memory
        # held. (Asked of the node's nvidia-smi directly; the job being alive after the answer means
        # it was alive during it.)
        smi = subprocess.run(
            [
                str(node.dir / "bin" / "nvidia-smi"),
                "--format=csv,noheader,nounits",
                "--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid,gpu_bus_id",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc_state(job["pid"]) not in GONE, (
            "the job died within the grace: SIGKILL came too early"
        )
        rows = [[f.strip() for f in ln.split(",")] for ln in smi.stdout.splitlines() if ln.strip()]
        assert [(int(r[0]), int(r[2])) for r in rows] == [(job["pid"], 21090)], smi.stdout
        rc, out, err = stopper.finish(timeout=300)
    r = json.loads(out)["results"][0]
    assert rc == 0, (r["msg"], r["items"], err)
    assert (
        r["status"] == "changed"
        and r["msg"]
        == f"stopped job {job['id']} with SIGTERM, then SIGKILL after "
        "the grace period; no process of its group is left"
    ), r["msg"]
    assert r["items"][0]["label"] == "GPU memory" and r["items"][0]["msg"].startswith("released"), (
        r["items"]
    )
    # The job outlived SIGTERM for the whole grace (its heartbeat went on), then stopped at once
    # (SIGKILL).
    beats = [
        float(t) for t in re.findall(r"^alive at ([0-9.]+)$", Path(job["log"]).read_text(), re.M)
    ]
    assert beats and beats[-1] - termed >= grace * 0.7, (termed, beats[-3:])
    # every pid of the group is gone, the child's too (it ignored SIGTERM: only SIGKILL ended it)
    assert_group_gone(job, child)
    assert_no_gpu_holder(jobs)
    rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
    data = doc["results"][0]["data"]
    # Ended by fleetops' own stop: status is 0 (an expected end), the signal and who sent it in the
    # data.
    assert (
        rc == 0
        and data["state"] == "stopped"
        and data["exit"]["signal"] == 9
        and data["exit"]["by"] == "stop"
    )


def test_a_job_whose_wrapper_and_group_are_sigkilled_reads_as_lost(jobs):
    job = start_job(jobs, "spawner")
    child = child_of(job)
    # The wrapper (session and group leader), the job and its child all at once: nobody is left to
    # write exit.json, as after a node crash or an OOM kill of the whole group.
    os.killpg(job["pgid"], signal.SIGKILL)
    wait_for(lambda: not live_members(job["pgid"]), "the job's group to be gone")
    assert_group_gone(job, child)
    assert not (Path(job["log"]).parent / "exit.json").exists()
    rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
    r = doc["results"][0]
    assert (
        rc == 1
        and r["status"] == "failed"
        and r["data"]["state"] == "lost"
        and r["data"]["exit"] is None
    ), r
    rc, doc = fab_json(jobs.root, "-H", "lab01", "tail")
    r = doc["results"][0]
    assert (
        rc == 1
        and r["msg"]
        == f"job {job['id']} lost: its wrapper is gone and left no exit status (node "
        "rebooted, or the group was SIGKILLed)"
    ), r["msg"]
    assert_no_gpu_holder(jobs)  # nothing of it is alive, so nothing holds the GPU
    rc, doc = fab_json(jobs.root, "-H", "lab01", "stop")
    assert (
        rc == 0
        and doc["results"][0]["status"] == "ok"
        and "not running (lost)" in doc["results"][0]["msg"]
    )
    start_job(jobs, "envecho")  # a lost job does not block the next one


def test_tail_shows_progress_and_follows_the_job_named_by_job_id(jobs):
    proc = extract_and_tail(jobs, "steps", env={"COLUMNS": "300"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps_id = re.search(r"launched job (steps-\S+) ", proc.stdout)[1]
    bars = re.findall(
        r"^lab01 \| \[(#*)(\.*)\] (\d+)/(\d+) (\d+)% (\d+) tok/s ETA (\d+):(\d\d) progress "
        r"samples=(\d+)/64 ",
        proc.stdout,
        re.M,
    )
    assert len(bars) == 8, proc.stdout
    for k, (filled, empty, done, total, pct, rate, minutes, seconds, printed) in enumerate(
        bars, start=1
    ):
        # The job printed samples 8k/64, tok/s 250k and eta 10.5*(8-k) s: the bar must say the same.
        assert int(done) == int(printed) == 8 * k and int(total) == 64
        assert len(filled) + len(empty) == 24 and len(filled) == 3 * k
        assert abs(int(pct) - 100 * k / 8) <= 0.5
        assert int(rate) == 250 * k
        assert int(minutes) * 60 + int(seconds) == int(10.5 * (8 - k)) and int(seconds) < 60
    assert f"job {steps_id} succeeded (exit status 0)" in proc.stdout
    # A later job becomes the node's current one; --job-id still follows the one it names.
    run_fab(
        jobs.root,
        "-H",
        "lab01",
        "extract",
        "--job",
        "envecho",
        "--playbook",
        JOBS,
        "tail",
        check=True,
    )
    latest = run_fab(jobs.root, "-H", "lab01", "tail", env={"COLUMNS": "300"})
    assert (
        latest.returncode == 0 and "X=$(touch" in latest.stdout and "samples=" not in latest.stdout
    )
    named = run_fab(jobs.root, "-H", "lab01", "tail", "--job-id", steps_id, env={"COLUMNS": "300"})
    assert named.returncode == 0, named.stdout + named.stderr
    assert "X=" not in named.stdout and len(re.findall(r"progress samples=", named.stdout)) == 8
    assert re.search(
        rf"^lab01 \| tail \| ok \| job {re.escape(steps_id)} succeeded", named.stdout, re.M
    ), named.stdout


def test_environment_values_are_passed_verbatim_never_through_a_shell(jobs):
    canary = Path("/tmp/fleetops-pwned")
    canary.unlink(missing_ok=True)
    proc = extract_and_tail(jobs, "envecho")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "X=$(touch /tmp/fleetops-pwned) `id` ; echo hi" in proc.stdout
    assert not canary.exists()


def test_logs_shows_the_last_lines(jobs):
    extract_and_tail(jobs, "envecho")
    rc, doc = fab_json(jobs.root, "-H", "lab01", "logs", "--lines", "5")
    assert rc == 0
    assert doc["results"][0]["data"]["lines"][-1].startswith("X=$(touch")


def test_extract_refuses_when_checks_or_gpus_fail_and_force_overrides(jobs):
    rc, doc = fab_json(jobs.root, "-H", "lab01", "rollback", "extract")
    assert rc == 1
    r = [r for r in doc["results"] if r["task"] == "extract"][0]
    # never "--force"
    assert r["msg"] == "refused to launch extract: 10 of the job's checks fail", r["msg"]
    assert r["data"]["next"]["commands"] == ["fab -H lab01 patch verify", "fab -H lab01 extract"], (
        r["data"]
    )
    assert any("kv-cache-config-call" in i["label"] for i in r["items"])
    jobs.set_gpu_state(jobs.node("lab01"), "busy")
    rc, doc = fab_json(jobs.root, "-H", "lab01", "patch", "extract")
    r = [r for r in doc["results"] if r["task"] == "extract"][0]
    assert rc == 1 and "GPU gate" in r["msg"] and "2 busy" in r["msg"]
    rc, doc = fab_json(jobs.root, "-H", "lab01", "extract", "--force", "tail")
    assert rc == 0, doc
    r = [r for r in doc["results"] if r["task"] == "extract"][0]
    notes = [i["msg"] for i in r["items"]]
    assert r["status"] == "changed" and notes == ["settings for group 'lab' applied", notes[1]]
    assert notes[1].startswith("--force: launched despite: GPU gate")


def test_ctrl_c_detaches_tail_and_the_job_keeps_running(jobs):
    job = start_job(jobs, "spawner")
    with Follower(jobs.root, ["-H", "lab01", "tail"], ENV) as tail:
        tail.wait_line(r"^lab01 \| spawned \d+", "tail to be attached and streaming")
        tail.proc.send_signal(signal.SIGINT)
        rc, out, err = tail.finish(timeout=120)
    assert rc == 130, out + err
    assert f"detached: job {job['id']} is still running" in out
    rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
    assert rc == 0 and doc["results"][0]["data"]["state"] == "running"
    assert proc_state(job["pid"]) not in GONE


def test_sigkill_from_outside_and_an_sshd_restart_mid_job(jobs):
    node = jobs.node("lab01")
    rc, doc = fab_json(jobs.root, "-H", "lab01", "extract", "--job", "spawner", "--playbook", JOBS)
    assert rc == 0, doc
    job = doc["results"][0]["data"]["job"]
    jobs.stop_node(node)  # the node's sshd restarts while the job runs
    listener_gone = node.pid()
    jobs.start_node(node)
    assert node.pid() != listener_gone
    rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
    assert rc == 0 and doc["results"][0]["data"]["state"] == "running"
    os.kill(job["pid"], signal.SIGKILL)  # someone kills the job itself
    wait_exit_record(job, "the wrapper to record the kill")
    rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
    assert rc == 1 and doc["results"][0]["data"]["state"] == "killed"
    assert "killed by signal 9" in doc["results"][0]["msg"]
    rc, doc = fab_json(jobs.root, "-H", "lab01", "tail")
    assert rc == 1 and "killed by signal 9" in doc["results"][0]["msg"]


def test_stop_cleans_up_children_a_killed_job_left_behind(jobs):
    job = start_job(jobs, "spawner")
    child = child_of(job)
    os.kill(job["pid"], signal.SIGKILL)
    wait_exit_record(job, "the wrapper to record the kill")
    # The child left in the job's group keeps GPU 0's memory, as a worker of a killed job would on a
    # real GPU.
    rc, procs = gpu_holders(jobs)
    assert rc == 10 and [p["pid"] for p in procs] == [child], procs
    rc, doc = fab_json(jobs.root, "-H", "lab01", "stop")
    r = doc["results"][0]
    assert rc == 0 and r["status"] == "changed", r
    # its keeper is gone with the job, so the group proves nothing any more: the child is the job's
    # by its tag
    assert f"left 1 processes (tagged with it): killed [{child}]" in r["msg"], r["msg"]
    assert r["items"][0]["msg"].startswith("released"), r["items"]
    assert proc_state(child) in GONE and live_members(job["pgid"]) == []
    assert_no_gpu_holder(jobs)


# ---------------------------------------------------------------- a job that cannot read or write
def _job_dirs(node) -> list[str]:
    jobs_root = node.state_dir / "jobs"
    return sorted(p.name for p in jobs_root.iterdir()) if jobs_root.exists() else []


def test_extract_refuses_a_missing_dataset_before_launching(jobs):
    node = jobs.node("lab01")
    dataset = node.state_dir / "lostdata" / "prompts.jsonl"
    subprocess.run(["rm", "-rf", str(dataset.parent)], check=True)
    before = _job_dirs(node)
    # --force overrides checks and the GPU gate, never this: the job could only fail on its first
    # read.
    rc, doc = fab_json(
        jobs.root, "-H", "lab01", "extract", "--job", "lostdata", "--playbook", JOBS, "--force"
    )
    r = doc["results"][0]
    assert rc == 1 and r["status"] == "failed", r
    assert (
        f"refused to launch lostdata: its dataset {dataset} "
        "cannot be read on lab01: No such file or directory; "
        "nothing launched"
    ) in r["msg"], r["msg"]
    assert (
        r["data"]["next"]["commands"][-1]
        == f"fab -H lab01 extract --job lostdata --playbook {JOBS}"
    ), r["data"]
    assert _job_dirs(node) == before  # nothing launched: no job dir, no process


def test_a_job_that_loses_its_dataset_ends_with_one_line_that_status_shows(jobs):
    node = jobs.node("lab01")
    dataset = node.state_dir / "lostdata" / "prompts.jsonl"
    dataset.parent.mkdir(exist_ok=True)
    dataset.write_bytes((node.state_dir / "lab-data" / "prompts.jsonl").read_bytes())
    points = node.faults_dir / "failpoints.json"
    hit = node.faults_dir / "failpoint-extract.start.hit"
    points.write_text(json.dumps({"extract.start": {"action": "pause", "seconds": 120}}))
    try:
        job = start_job(jobs, "lostdata")  # the preflight found the dataset
        wait_for(hit.exists, "the job at its first read", 120)
        dataset.unlink()  # taken away after the launch
        hit.unlink()
    finally:
        points.unlink()
    wait_exit_record(job, "the job's exit record", 120)
    log = Path(job["log"]).read_text()
    assert "Traceback" not in log and "FileNotFoundError" not in log, log
    said = (
        f"fleetops extract: cannot read the dataset '{dataset}': "
        "No such file or directory; put it there (or "
        "point the playbook's dataset: at it), then extract again"
    )
    assert said in log.splitlines(), log
    rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
    r = doc["results"][0]
    assert rc == 1 and r["data"]["state"] == "failed", r
    assert said.removeprefix("fleetops extract: ") in r["msg"] and r["data"]["cause"].startswith(
        "cannot read"
    ), r


@pytest.mark.root("mounting a tmpfs needs root")
def test_a_job_on_a_full_disk_ends_with_one_line_that_status_shows(jobs):
    node = jobs.node("lab01")
    out = node.state_dir / "full-output"
    out.mkdir(exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(out)], check=True
    )
    try:
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={out / 'filler'}", "bs=4096"], capture_output=True
        )
        with pytest.raises(OSError) as full:
            (out / "probe").write_bytes(b"x" * 4096)
        assert full.value.errno == errno.ENOSPC
        job = start_job(jobs, "fulldisk")
        wait_exit_record(job, "the job's exit record", 300)
        log = Path(job["log"]).read_text()
        assert "Traceback" not in log and "OSError" not in log, log
        line = next(
            (ln for ln in log.splitlines() if ln.startswith("fleetops extract: cannot write")), None
        )
        assert line is not None and str(out) in line and "No space left on device" in line, log
        rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
        r = doc["results"][0]
        assert rc == 1 and r["data"]["state"] == "failed", r
        assert line.removeprefix("fleetops extract: ") in r["msg"], r["msg"]
    finally:
        subprocess.run(["umount", str(out)], check=True)
