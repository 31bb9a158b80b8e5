"""`diagnose` end to end against real sshd lab nodes, with the lab's
simulated kernel log (fleetops/lab/kernel_log.py: `fab lab.kernel`) and simulated nvidia-smi.

A module of its own with a 2-node lab (a throwaway project), so OOM kills, Xids and missing
nvidia-smi never touch the session's shared lab. Every scenario is set up with the operator's own
commands (`fab lab.kernel`, `fab lab.gpu`, `fab extract`, `fab patch`) and read back as the operator
reads it (`fab diagnose`, --json and the human screen)."""

from __future__ import annotations

import json

import pytest
from conftest import fab_json, run_fab
from polling import wait_for

from fleetops.lab import Lab

GENERATOR = "speculators.data_generation.vllm_hidden_states_generator"
JOBS = "tests/playbooks/jobs.yaml"
pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab2(lab_factory):
    return lab_factory.shared(2, __name__)


@pytest.fixture
def lab(lab2):
    for node in lab2.nodes():
        lab2.start_node(node)
        lab2.reset_packages(node)
        lab2.set_gpu_state(node, "idle")
        run_fab(
            lab2.root,
            "lab.kernel",
            "--node",
            node.name,
            "--clear",
            "--readable",
            "dmesg",
            check=True,
        )
    return lab2


def diagnose(lab: Lab, *hosts: str) -> tuple[int, dict[str, dict]]:
    rc, doc = fab_json(lab.root, "-H", ",".join(hosts), "diagnose")
    return rc, {r["host"]: r for r in doc["results"]}


def findings(result: dict, area: str | None = None) -> list[dict]:
    return [f for f in result["data"]["findings"] if area is None or f["area"] == area]


def no_traceback(proc) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_patched_drifted_and_pristine_nodes_told_apart(lab):
    rc, before = diagnose(lab, "lab01", "lab02")
    for host in ("lab01", "lab02"):
        [p] = findings(before[host], "patch")
        assert p["verdict"] == "WARN" and p["msg"].startswith(
            "not patched: 2 files as installed"
        ), p
        assert p["next"] == [f"fab -H {host} patch verify"]
    run_fab(lab.root, "-H", "lab01,lab02", "patch", check=True)
    target = lab.node("lab02").module_file(GENERATOR)
    text = target.read_text()
    assert text.count("enable_prefix_caching=False,") == 1
    target.write_text(
        text.replace("enable_prefix_caching=False,", "enable_prefix_caching=True,  # local edit")
    )
    rc, after = diagnose(lab, "lab01", "lab02")
    [ok] = findings(after["lab01"], "patch")
    assert ok["verdict"] == "OK" and ok["msg"].startswith(
        "patched (2 files; 14/14 fast checks pass)"
    ), ok
    [drift] = findings(after["lab02"], "patch")
    assert drift["verdict"] == "CRITICAL" and drift["next"] == ["fab -H lab02 patch --check"], drift
    assert drift["msg"].startswith(
        "drifted: vllm_hidden_states_generator matches neither the original nor the "
        "patched form (13/14 fast checks pass; first failing: prefix-caching-off"
    )
    assert after["lab02"]["data"]["verdict"] == "CRITICAL" and after["lab02"]["status"] == "failed"
    assert rc == 22  # the worst verdict across the hosts: lab02's CRITICAL


def test_oom_killed_job_is_named_with_its_process_and_pid(lab):
    rc, doc = fab_json(lab.root, "-H", "lab01", "extract", "--job", "spawner", "--playbook", JOBS)
    assert rc == 0, doc
    job_id = doc["results"][0]["data"]["job"]["id"] if "job" in doc["results"][0]["data"] else None

    def running() -> dict | None:
        code, st = fab_json(lab.root, "-H", "lab01", "status", "--playbook", JOBS)
        data = st["results"][0]["data"]
        return data if data.get("state") == "running" and data.get("job", {}).get("pid") else None

    state = wait_for(running, "the spawner job running with its pid", timeout=120, every=0.5)
    job_id = job_id or state["job"]["id"]
    pid = state["job"]["pid"]
    proc = run_fab(lab.root, "lab.kernel", "--node", "lab01", "--oom", check=True)
    assert f"OOM-killed job {job_id}'s process {pid} (python)" in proc.stdout, proc.stdout

    def ended() -> dict | None:
        code, st = fab_json(lab.root, "-H", "lab01", "status", "--playbook", JOBS)
        data = st["results"][0]["data"]
        return data if data.get("state") == "killed" else None

    wait_for(ended, "the job's wrapper recording the SIGKILL", timeout=120, every=0.5)
    rc, res = diagnose(lab, "lab01")
    r = res["lab01"]
    [oom] = findings(r, "oom")
    assert oom["verdict"] == "CRITICAL" and r["data"]["verdict"] == "CRITICAL" and rc == 22
    assert oom["msg"].startswith(
        f"the kernel OOM killer killed job {job_id}'s main process: pid {pid} (python, anon-rss "
    ), oom["msg"]
    assert "the job ended: killed by signal 9" in oom["msg"]
    assert (
        oom["next"] == [f"fab -H lab01 logs --job-id {job_id}"] and "max_model_len" in oom["why"]
    ), oom
    assert r["msg"].startswith("CRITICAL: the kernel OOM killer killed job")
    assert findings(r)[0]["area"] == "oom"  # the most likely cause comes first
    # The spawner's child (`sleep 300`) outlived the kill: the process tree shows it, with what to
    # run.
    [left] = findings(r, "processes")
    assert (
        left["verdict"] == "WARN"
        and f"job {job_id} ended (killed) but left 1 process: " in left["msg"]
    )
    assert "sleep" in left["msg"] and left["next"] == ["fab -H lab01 stop"]
    # ... and it is the job's, not a foreign GPU holder.
    assert not [f for f in findings(r, "gpu") if "not a fleetops job" in f["msg"]]
    # The human screen says the same.
    proc = run_fab(lab.root, "-H", "lab01", "diagnose")
    no_traceback(proc)
    assert (
        proc.returncode == 22
        and "the kernel OOM killer killed job" in proc.stdout
        and str(pid) in proc.stdout
    )
    run_fab(lab.root, "-H", "lab01", "stop", check=True)


def test_injected_xid_79_names_the_gpu_its_bus_id_and_the_next_step(lab):
    proc = run_fab(
        lab.root, "lab.kernel", "--node", "lab02", "--xid", "79", "--gpu", "1", check=True
    )
    assert "NVRM: Xid (PCI:0000:00:07): 79" in proc.stdout
    rc, res = diagnose(lab, "lab01", "lab02")
    [xid] = findings(res["lab02"], "gpu1")
    assert xid["verdict"] == "CRITICAL" and rc == 22
    assert xid["msg"].startswith("Xid 79 on GPU 1 (PCI 0000:00:07): GPU has fallen off the bus")
    assert xid["details"]["bus_id"] == "0000:00:07" and xid["details"]["xid"] == 79
    assert xid["next"] == [
        "fab -H lab02 drain --reason 'Xid 79 on GPU 1'",
        "fab -H lab02 stop",
        "fab -H lab02 run 'sudo reboot'",
        "fab -H lab02 diagnose",
        "fab -H lab02 undrain",
    ], xid
    assert xid["why"] == (
        "drain the node (so nothing launches there), stop its job, reboot it; after the reboot "
        "diagnose it, then undrain it"
    ), xid
    assert not findings(res["lab01"], "gpu1")  # the other node's log is its own
    [clean] = [f for f in findings(res["lab01"], "kernel")]
    assert clean["verdict"] == "OK" and clean["msg"].startswith(
        "no NVIDIA Xid in the kernel log (dmesg"
    )
    # Where dmesg is refused, journalctl -k is read instead (its ISO time stamps), with the same
    # finding.
    run_fab(lab.root, "lab.kernel", "--node", "lab02", "--readable", "journal", check=True)
    rc, res = diagnose(lab, "lab02")
    assert res["lab02"]["data"]["kernel_source"].startswith("journalctl -k")
    [xid2] = findings(res["lab02"], "gpu1")
    assert xid2["msg"].startswith("Xid 79 on GPU 1 (PCI 0000:00:07): GPU has fallen off the bus")
    proc = run_fab(lab.root, "-H", "lab02", "diagnose")
    no_traceback(proc)
    assert "GPU has fallen off the bus" in proc.stdout and "0000:00:07" in proc.stdout


def test_missing_nvidia_smi_and_unreadable_kernel_log_are_unknown_not_a_crash(lab):
    # so only the unreadable parts decide the verdict
    run_fab(lab.root, "-H", "lab02", "patch", check=True)
    run_fab(lab.root, "lab.gpu", "--state", "absent", "--node", "lab02", check=True)
    run_fab(lab.root, "lab.kernel", "--node", "lab02", "--readable", "denied", check=True)
    rc, res = diagnose(lab, "lab02")
    r = res["lab02"]
    [gpu] = findings(r, "gpu")
    assert gpu["verdict"] == "UNKNOWN" and gpu["msg"].startswith(
        "GPUs not checked: nvidia-smi not found on the node"
    )
    [kern] = findings(r, "kernel")
    assert kern["verdict"] == "UNKNOWN" and "the kernel log is not readable here" in kern["msg"]
    assert "dmesg: exit 1: dmesg: read kernel buffer failed: Operation not permitted" in kern["msg"]
    assert "not seeing messages from other users" in kern["msg"]
    assert r["data"]["verdict"] == "UNKNOWN" and r["status"] == "failed" and rc == 21
    # The other parts still came back.
    assert findings(r, "patch")[0]["verdict"] == "OK" and findings(r, "reach")[0]["verdict"] == "OK"
    proc = run_fab(lab.root, "-H", "lab02", "diagnose")
    no_traceback(proc)
    assert proc.returncode == 21 and "nvidia-smi not found" in proc.stdout
    # A broken driver is worse than no nvidia-smi: CRITICAL.
    run_fab(lab.root, "lab.gpu", "--state", "driver_error", "--node", "lab02", check=True)
    rc, res = diagnose(lab, "lab02")
    [gpu] = findings(res["lab02"], "gpu")
    assert (
        gpu["verdict"] == "CRITICAL"
        and "Driver/library version mismatch" in gpu["msg"]
        and rc == 22
    )


def test_unreachable_node_is_critical_and_the_others_still_answer(lab):
    lab.stop_node(lab.node("lab02"))
    try:
        rc, res = diagnose(lab, "lab01", "lab02")
    finally:
        lab.start_node(lab.node("lab02"))
    r = res["lab02"]
    assert r["status"] == "unreachable" and r["data"]["verdict"] == "CRITICAL"
    [reach] = findings(r, "reach")
    assert "lab02" in reach["msg"] and reach["next"] == ["fab -H lab02 ping"]
    assert res["lab01"]["data"]["reach"]["reached"] is True
    # The worst verdict sets the exit status: an unreachable host is CRITICAL (22) for diagnose,
    # where other tasks' unreachable hosts give 4.
    assert rc == 22


def test_json_has_verdict_reach_and_every_finding_with_a_next_command(lab):
    rc, res = diagnose(lab, "lab01")
    r = res["lab01"]
    assert r["data"]["reach"]["connect_s"] >= 0 and r["data"]["reach"]["total_s"] > 0
    areas = {f["area"] for f in findings(r)}
    assert {"reach", "clock", "patch", "gpu", "kernel", "job", "disk", "memory", "load"} <= areas, (
        areas
    )
    assert all(f["next"] for f in findings(r))
    order = [{"CRITICAL": 3, "UNKNOWN": 2, "WARN": 1, "OK": 0}[f["verdict"]] for f in findings(r)]
    assert order == sorted(order, reverse=True)
    json.dumps(r)  # plain data all the way down
