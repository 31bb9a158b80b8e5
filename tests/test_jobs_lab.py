"""Jobs on real lab nodes: extract (CPU backend, the lab's tiny local model), tail, status, logs, stop."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, fab_json, run_fab

from fleetops.lab import base_dir

pytestmark = pytest.mark.lab
JOBS = str(REPO / "tests" / "playbooks" / "jobs.yaml")


@pytest.fixture
def jobs(lab):
    """A lab node with no job running and no extraction output; stops whatever a test left running."""
    for node in lab.nodes()[:2]:
        lab.set_gpu_state(node, "idle")
        for sub in ("hidden-states", "bad-output", "jobs"):
            target = node.state_dir / sub
            if target.exists():
                subprocess.run(["rm", "-rf", str(target)], check=True)
    yield lab
    for node in lab.nodes()[:2]:
        run_fab(lab.root, "-H", node.name, "stop", "--grace", "1")


def fab_bg(lab, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fabric", *args], cwd=lab.root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"})


def test_extract_tail_to_completion_and_outputs_match_a_direct_run(jobs):
    node = jobs.node("lab01")
    rc, doc = fab_json(jobs.root, "-H", "lab01", "patch", "extract", "tail")
    assert rc == 0, doc
    by = {r["task"]: r for r in doc["results"]}
    assert by["extract"]["status"] == "changed" and "launched job extract-" in by["extract"]["msg"]
    assert by["tail"]["status"] == "ok" and "succeeded (exit status 0)" in by["tail"]["msg"]
    out = node.state_dir / "hidden-states"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["total"] == 64 and len(manifest["samples"]) == 64 and manifest["layer_ids"] == [0, 1, 2, 3]
    # An independent in-process run of the same model on the same inputs (Hugging Face's own
    # output_hidden_states): layers 0..2 must match exactly; the last layer's entry there is after the final
    # norm, so for layer 3 only the shape is compared.
    script = f"""
import json, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
model_dir = {str(node.state_dir / "lab-model")!r}
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
rows = [json.loads(l) for l in open({str(node.state_dir / "lab-data" / "prompts.jsonl")!r})]
worst, checked = 0.0, 0
for i, row in enumerate(rows):
    ids = row["input_ids"] if "input_ids" in row else tok(row["text"])["input_ids"]
    ids = ids[:511]
    saved = load_file({str(out)!r} + f"/sample_{{i:07d}}.safetensors")
    assert saved["input_ids"].tolist() == ids, i
    with torch.no_grad():
        hs = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    for layer in (0, 1, 2):
        worst = max(worst, (saved[f"hidden_states.{{layer}}"] - hs[layer + 1][0]).abs().max().item())
    assert saved["hidden_states.3"].shape == (len(ids), 64), saved["hidden_states.3"].shape
    checked += 1
print(json.dumps({{"checked": checked, "worst": worst}}))
"""
    proc = subprocess.run([str(base_dir() / "bin" / "python"), "-c", script], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["checked"] == 64 and result["worst"] < 1e-5, result


def test_failing_job_tail_exits_nonzero_with_traceback_and_status_says_failed(jobs):
    proc = run_fab(jobs.root, "-H", "lab01", "extract", "--job", "badmodel", "--playbook", JOBS,
                   "tail", "--job", "badmodel", "--playbook", JOBS)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback (most recent call last)" in proc.stdout
    assert "failed (exit status 1)" in proc.stdout
    rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
    assert rc == 1 and doc["results"][0]["data"]["state"] == "failed"
    assert "failed" in doc["results"][0]["msg"]


def test_tail_survives_a_dropped_connection_and_sshd_restart_without_gap_or_duplicate(jobs):
    node = jobs.node("lab01")
    rc, doc = fab_json(jobs.root, "-H", "lab01", "extract", "--job", "numbers", "--playbook", JOBS)
    assert rc == 0, doc
    tail = fab_bg(jobs, "-H", "lab01", "tail", "--job", "numbers", "--playbook", JOBS)
    time.sleep(1.5)
    listener = node.pid()
    sessions = subprocess.run(["ps", "-o", "pid=", "--ppid", str(listener)], capture_output=True,
                              text=True).stdout.split()
    jobs.stop_node(node)  # sshd down: no new connections...
    for pid in sessions:  # ...and the live one cut
        os.kill(int(pid), signal.SIGKILL)
    time.sleep(2.0)
    jobs.start_node(node)
    out, err = tail.communicate(timeout=120)
    assert tail.returncode == 0, out + err
    numbers = [int(m.group(1)) for m in re.finditer(r"^lab01 \| (?:\S+ )*?line (\d+)$", out, re.M)]
    assert numbers == list(range(120)), (numbers[:5], len(numbers), out[-2000:])
    assert "connection lost" in out and "reconnecting" in out
    rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
    assert doc["results"][0]["data"]["state"] == "succeeded"


def test_killed_job_reports_signal_9_and_extraction_resumes_from_the_manifest(jobs):
    node = jobs.node("lab01")
    (node.state_dir / "failpoints.json").write_text(json.dumps({"extract.after_batch": {"action": "kill",
                                                                                         "skip": 3}}))
    proc = run_fab(jobs.root, "-H", "lab01", "patch", "extract", "tail")
    (node.state_dir / "failpoints.json").unlink()
    assert proc.returncode == 128 + 9, proc.stdout + proc.stderr
    assert "killed by signal 9" in proc.stdout
    rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
    assert rc == 137 and "killed by signal 9" in doc["results"][0]["msg"]
    out = node.state_dir / "hidden-states"
    first = json.loads((out / "manifest.json").read_text())
    assert len(first["samples"]) == 16  # four batches of four, then the kill
    stamps = {i: os.stat(out / s["file"]).st_mtime_ns for i, s in first["samples"].items()}

    proc = run_fab(jobs.root, "-H", "lab01", "patch", "extract", "tail")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resuming: 16/64 samples already done" in proc.stdout
    final = json.loads((out / "manifest.json").read_text())
    assert sorted(int(i) for i in final["samples"]) == list(range(64))  # none skipped
    assert {i: os.stat(out / final["samples"][i]["file"]).st_mtime_ns for i in stamps} == stamps  # none redone
    assert sum(1 for s in final["samples"].values() if s["run"] == 1) == 48
    assert len(list(out.glob("sample_*.safetensors"))) == 64


def test_stop_kills_the_whole_group_and_confirms_gpu_memory_released(jobs):
    rc, doc = fab_json(jobs.root, "-H", "lab01", "extract", "--job", "spawner", "--playbook", JOBS)
    assert rc == 0, doc
    job = doc["results"][0]["data"]["job"]
    deadline = time.monotonic() + 10
    log = Path(job["log"])
    while "spawned" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    child = int(log.read_text().split("spawned ")[1].split()[0])
    # While it runs, the (simulated) GPU shows the job's process, labelled with its job id.
    rc, doc = fab_json(jobs.root, "-H", "lab01", "gpu")
    procs = [p for i in doc["results"][0]["items"] for p in i["details"].get("processes", [])]
    assert rc == 10 and procs and procs[0]["job"] == job["id"]
    # A second job while this one runs is refused.
    rc, doc = fab_json(jobs.root, "-H", "lab01", "extract", "--job", "numbers", "--playbook", JOBS)
    assert rc == 1 and f"job {job['id']} is still running" in doc["results"][0]["msg"]
    rc, doc = fab_json(jobs.root, "-H", "lab01", "stop", "--grace", "2")
    assert rc == 0, doc
    r = doc["results"][0]
    assert r["status"] == "changed" and "no process of its group is left" in r["msg"]
    assert r["items"][0]["msg"].startswith("released")
    for pid in (job["pid"], child, job["wrapper_pid"]):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        assert state == "Z", f"pid {pid} survived stop"
    rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
    assert doc["results"][0]["data"]["state"] == "killed" and "signal 15" in doc["results"][0]["msg"]
    rc, doc = fab_json(jobs.root, "-H", "lab01", "stop")
    assert rc == 0 and doc["results"][0]["status"] == "ok" and "nothing to stop" in doc["results"][0]["msg"]


def test_environment_values_are_passed_verbatim_never_through_a_shell(jobs):
    canary = Path("/tmp/fleetops-pwned")
    canary.unlink(missing_ok=True)
    proc = run_fab(jobs.root, "-H", "lab01", "extract", "--job", "envecho", "--playbook", JOBS,
                   "tail", "--job", "envecho", "--playbook", JOBS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "X=$(touch /tmp/fleetops-pwned) `id` ; echo hi" in proc.stdout
    assert not canary.exists()


def test_logs_shows_the_last_lines(jobs):
    run_fab(jobs.root, "-H", "lab01", "extract", "--job", "envecho", "--playbook", JOBS, "tail", "--job", "envecho",
            "--playbook", JOBS)
    rc, doc = fab_json(jobs.root, "-H", "lab01", "logs", "--lines", "5")
    assert rc == 0
    assert doc["results"][0]["data"]["lines"][-1].startswith("X=$(touch")


def test_extract_refuses_when_checks_or_gpus_fail_and_force_overrides(jobs):
    rc, doc = fab_json(jobs.root, "-H", "lab01", "rollback", "extract")
    assert rc == 1
    r = [r for r in doc["results"] if r["task"] == "extract"][0]
    assert "refused to launch extract" in r["msg"] and "--force overrides" in r["msg"]
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
    rc, doc = fab_json(jobs.root, "-H", "lab01", "extract", "--job", "spawner", "--playbook", JOBS)
    assert rc == 0, doc
    job_id = doc["results"][0]["data"]["job"]["id"]
    tail = fab_bg(jobs, "-H", "lab01", "tail")
    time.sleep(2.0)
    tail.send_signal(signal.SIGINT)
    out, err = tail.communicate(timeout=30)
    assert tail.returncode == 130, out + err
    assert f"detached: job {job_id} is still running" in out
    rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
    assert rc == 0 and doc["results"][0]["data"]["state"] == "running"


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
    time.sleep(0.5)
    rc, doc = fab_json(jobs.root, "-H", "lab01", "status")
    assert rc == 137 and doc["results"][0]["data"]["state"] == "killed"
    assert "killed by signal 9" in doc["results"][0]["msg"]
    rc, doc = fab_json(jobs.root, "-H", "lab01", "tail")
    assert rc == 137 and "killed by signal 9" in doc["results"][0]["msg"]


def test_stop_cleans_up_children_a_killed_job_left_behind(jobs):
    rc, doc = fab_json(jobs.root, "-H", "lab01", "extract", "--job", "spawner", "--playbook", JOBS)
    job = doc["results"][0]["data"]["job"]
    log = Path(job["log"])
    deadline = time.monotonic() + 10
    while "spawned" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    child = int(log.read_text().split("spawned ")[1].split()[0])
    os.kill(job["pid"], signal.SIGKILL)
    time.sleep(0.5)
    rc, doc = fab_json(jobs.root, "-H", "lab01", "stop")
    assert rc == 0 and doc["results"][0]["status"] == "changed"
    assert "left 1 processes in its group" in doc["results"][0]["msg"]
    try:
        state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z")
