"""`gpu` and `facts` over real SSH against lab nodes whose nvidia-smi replays recorded H200 output."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, fab_json

from fleetops.results import EXIT_GPU_BUSY, EXIT_GPU_UNHEALTHY, EXIT_NO_NVIDIA_SMI, EXIT_NVIDIA_SMI_FAILED

pytestmark = pytest.mark.lab


@pytest.fixture
def gpus(lab):
    yield lab
    for node in lab.nodes():
        lab.set_gpu_state(node, "idle")


def test_idle(gpus):
    rc, doc = fab_json(gpus.root, "-H", "lab01", "gpu")
    assert rc == 0, doc
    r = doc["results"][0]
    assert r["msg"] == "2/2 selected GPUs free" and r["data"]["simulated"] is True


def test_busy_lists_the_real_holder_process(gpus):
    config = gpus.set_gpu_state(gpus.node("lab01"), "busy")
    rc, doc = fab_json(gpus.root, "-H", "lab01", "gpu")
    assert rc == EXIT_GPU_BUSY
    procs = [p for i in doc["results"][0]["items"] for p in i["details"]["processes"]]
    assert [p["pid"] for p in procs] == config["holder_pids"]
    assert all(p["user"] == gpus.user and p["visible"] and "fleetops-lab-gpu-holder" in p["command"] for p in procs)
    assert all(p["job"] is None for p in procs)  # not launched by fleetops: foreign
    assert "2 busy" in doc["results"][0]["msg"]


def test_missing_gpu(gpus):
    gpus.set_gpu_state(gpus.node("lab01"), "missing")
    rc, doc = fab_json(gpus.root, "-H", "lab01", "gpu")
    assert rc == EXIT_GPU_UNHEALTHY
    assert "expected 2 GPUs, saw 1: missing GPU 1" in doc["results"][0]["msg"]


def test_driver_error_shows_nvidia_smi_text(gpus):
    gpus.set_gpu_state(gpus.node("lab01"), "driver_error")
    rc, doc = fab_json(gpus.root, "-H", "lab01", "gpu")
    assert rc == EXIT_NVIDIA_SMI_FAILED
    assert "Failed to initialize NVML: Driver/library version mismatch" in doc["results"][0]["msg"]


def test_nvidia_smi_absent(gpus):
    gpus.set_gpu_state(gpus.node("lab01"), "absent")
    rc, doc = fab_json(gpus.root, "-H", "lab01", "gpu")
    assert rc == EXIT_NO_NVIDIA_SMI
    assert "nvidia-smi not found" in doc["results"][0]["msg"]


def test_threshold_and_selection_options(gpus):
    gpus.set_gpu_state(gpus.node("lab01"), "busy")
    rc, doc = fab_json(gpus.root, "-H", "lab01", "gpu", "--gpus", "1", "--threshold", "100000")
    assert rc == EXIT_GPU_BUSY  # a process on it still makes it busy
    assert [i["label"] for i in doc["results"][0]["items"]] == ["GPU 1 NVIDIA H200"]


def test_wait_passes_when_gpus_turn_free_mid_wait(gpus):
    node = gpus.node("lab01")
    gpus.set_gpu_state(node, "busy")
    timer = threading.Timer(3.0, lambda: gpus.set_gpu_state(node, "idle"))
    timer.start()
    started = time.monotonic()
    try:
        rc, doc = fab_json(gpus.root, "-H", "lab01", "gpu", "--wait", "30")
    finally:
        timer.cancel()
    took = time.monotonic() - started
    assert rc == 0, doc
    assert 3.0 <= took < 20


def test_wait_fails_at_the_deadline_listing_holders(gpus):
    holders = gpus.set_gpu_state(gpus.node("lab01"), "busy")["holder_pids"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "300"}
    proc = subprocess.Popen([sys.executable, "-m", "fabric", "-H", "lab01", "gpu", "--wait", "4"], cwd=gpus.root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_GPU_BUSY, out + err
    waits = [line for line in out.splitlines() if "| gpu | waiting:" in line]
    assert waits, out
    assert "still busy after waiting 4s" in out
    assert all(f"pid {pid} python3" in out for pid in holders)
    assert len(waits) >= 3


def test_wait_deadline_is_kept_within_a_second(gpus):
    gpus.set_gpu_state(gpus.node("lab01"), "busy")
    started = time.monotonic()
    rc, doc = fab_json(gpus.root, "-H", "lab01", "gpu", "--wait", "3")
    # From the first answer to the verdict: the gate gives up within 1 s of its deadline.
    waited = doc["results"][0]["data"]["waited_s"]
    assert rc == EXIT_GPU_BUSY
    assert 3.0 <= waited <= 4.0, waited
    assert time.monotonic() - started < 15


def test_facts_highlight_differences_between_nodes(gpus):
    gpus.set_gpu_state(gpus.node("lab02"), "absent")
    rc, doc = fab_json(gpus.root, "-H", "lab01,lab02", "facts")
    assert rc == 0, doc
    by_host = {r["host"]: r["data"]["facts"] for r in doc["results"]}  # hosts finish in any order
    f1, f2 = by_host["lab01"], by_host["lab02"]
    assert f1["packages"] == f2["packages"] == {"vllm": "0.16.0", "speculators": "0.3.0", "torch": "2.9.1",
                                                "transformers": f1["packages"]["transformers"]}
    assert f1["driver"] == "580.159.04" and f1["cuda"] == "13.0" and f1["gpu_count"] == 2, f1
    assert f2["driver"] is None and f2["gpu_count"] == 0
    human = subprocess.run([sys.executable, "-m", "fabric", "-H", "lab01,lab02", "facts"], cwd=gpus.root,
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO),
                                                                "COLUMNS": "200"})
    assert "rows that differ between hosts are highlighted" in human.stdout
    assert "580.159.04" in human.stdout


def test_lab_status_names_the_simulation(gpus):
    from conftest import run_fab

    out = run_fab(gpus.root, "lab.status").stdout
    assert "GPUs: simulated 2x H200 (replayed nvidia-smi recordings), state idle" in out


def test_lab_gpu_task_switches_state(gpus):
    from conftest import run_fab

    out = run_fab(gpus.root, "lab.gpu", "--state", "busy", "--node", "lab02").stdout
    assert "lab02: simulated GPUs now busy (held by pids" in out
    pids = gpus.gpu_state(gpus.node("lab02"))["holder_pids"]
    run_fab(gpus.root, "lab.gpu", "--state", "idle", "--node", "lab02")
    time.sleep(0.2)
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        assert state == "Z", f"holder {pid} still running"  # killed; only its exit status is left
