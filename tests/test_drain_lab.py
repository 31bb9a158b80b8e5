"""Draining a node on real lab nodes: after diagnose says CRITICAL "drain the node" (an Xid 79 in
the simulated kernel log), the drain command it prints marks the node (a file in its state dir: who,
when, why); facts, status and diagnose say so; extract and patch refuse there, with the command that
undrains it; the other node is not affected; undrain puts it back in service."""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest
from conftest import GENERATOR, REPO, fab_json, run_fab

from fleetops.identity import operator

pytestmark = pytest.mark.lab
JOBS = str(REPO / "tests" / "playbooks" / "jobs.yaml")
UNPATCHED = "kv_cache_specs=kv_cache_spec,"


@pytest.fixture
def quiet(lab):
    """Both nodes with a quiet kernel log, no job, not drained; each test's leftovers undone after
    it."""
    for node in lab.nodes():
        run_fab(
            lab.root,
            "lab.kernel",
            "--node",
            node.name,
            "--clear",
            "--readable",
            "dmesg",
            check=True,
        )
        subprocess.run(
            ["rm", "-rf", str(node.state_dir / "jobs"), str(node.state_dir / "drain.json")],
            check=True,
        )
    yield lab
    for node in lab.nodes():
        run_fab(lab.root, "-H", node.name, "stop", "--grace", "1")
        (node.state_dir / "drain.json").unlink(missing_ok=True)
        run_fab(lab.root, "lab.kernel", "--node", node.name, "--clear", check=True)


def one(lab, *args: str) -> tuple[int, dict]:
    rc, doc = fab_json(lab.root, *args)
    return rc, doc["results"][0]


def jobs_of(lab, host: str) -> list[str]:
    root = lab.node(host).state_dir / "jobs"
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.exists() else []


def test_diagnose_drain_then_extract_and_patch_refuse_until_undrain(quiet):
    lab = quiet
    run_fab(lab.root, "lab.kernel", "--node", "lab01", "--xid", "79", "--gpu", "1", check=True)
    rc, diag = one(lab, "-H", "lab01", "diagnose")
    assert rc == 22 and diag["data"]["verdict"] == "CRITICAL", diag
    [xid] = [f for f in diag["data"]["findings"] if f["area"] == "gpu1"]
    printed = re.search(r"fab -H lab01 drain --reason '[^']+'", "\n".join(xid["next"]))
    assert printed, xid["next"]

    # the command as diagnose printed it
    drained = run_fab(lab.root, *shlex.split(printed.group(0))[1:])
    assert drained.returncode == 0, drained.stdout + drained.stderr
    marker = json.loads((lab.node("lab01").state_dir / "drain.json").read_text())
    assert marker["by"] == operator() and marker["reason"] == "Xid 79 on GPU 1", marker
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", marker["at"]), marker
    assert not (lab.node("lab02").state_dir / "drain.json").exists()

    rc, facts = one(lab, "-H", "lab01", "facts")
    assert rc == 0 and facts["msg"].startswith(
        f"DRAINED by {operator()} at {marker['at']}: Xid 79 on GPU 1"
    ), facts
    rc, status = one(lab, "-H", "lab01", "status")
    assert (
        f"DRAINED by {operator()}" in status["msg"]
        and status["data"]["drain"]["reason"] == "Xid 79 on GPU 1"
    )
    rc, diag = one(lab, "-H", "lab01", "diagnose")
    [mark] = [f for f in diag["data"]["findings"] if f["area"] == "drain"]
    assert (
        mark["verdict"] == "WARN"
        and "Xid 79 on GPU 1" in mark["msg"]
        and mark["next"] == ["fab -H lab01 undrain"]
    )
    # as the operator reads it: the command whole, on its line
    shown = run_fab(lab.root, "-H", "lab01", "diagnose")
    assert (
        re.search(r"\n\s+fab -H lab01 undrain\n", shown.stdout) and "\n    f\n" not in shown.stdout
    ), shown.stdout

    for extra in ((), ("--force",)):  # --force overrides checks and the GPU gate, never a drain
        proc = run_fab(
            lab.root, "-H", "lab01", "extract", "--job", "numbers", "--playbook", JOBS, *extra
        )
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "lab01 is drained (by" in proc.stdout and "Xid 79 on GPU 1" in proc.stdout, (
            proc.stdout
        )
        assert re.search(
            r"next:.*\n\s+" + re.escape("fab -H lab01 undrain") + r"\n", proc.stdout
        ), proc.stdout
    assert jobs_of(lab, "lab01") == []  # nothing launched

    target = lab.node("lab01").module_file(GENERATOR)
    proc = run_fab(lab.root, "-H", "lab01,lab02", "patch")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(
        r"lab01 \| patch \| failed \| refused to patch: lab01 is drained", proc.stdout
    ), proc.stdout
    # the other node is not drained
    assert re.search(r"lab02 \| patch \| changed", proc.stdout), proc.stdout
    assert UNPATCHED in target.read_text()
    # a look is not a change
    assert run_fab(lab.root, "-H", "lab01", "patch", "--check").returncode == 0

    back = run_fab(lab.root, "-H", "lab01", "undrain")
    assert back.returncode == 0 and "back in service (was drained by" in back.stdout, (
        back.stdout + back.stderr
    )
    assert not (lab.node("lab01").state_dir / "drain.json").exists()
    assert run_fab(lab.root, "-H", "lab01", "patch").returncode == 0
    rc, started = one(lab, "-H", "lab01", "extract", "--job", "numbers", "--playbook", JOBS)
    assert rc == 0 and started["status"] == "changed", started
    rc, again = one(lab, "-H", "lab01", "undrain")
    assert rc == 0 and again["msg"] == "was not drained", again


def test_drain_says_what_still_runs_and_status_shows_the_drain_beside_the_job(quiet):
    lab = quiet
    rc, started = one(lab, "-H", "lab01", "extract", "--job", "spawner", "--playbook", JOBS)
    assert rc == 0, started
    job = started["data"]["job"]["id"]
    rc, drained = one(lab, "-H", "lab01", "drain", "--reason", "bad fan")
    assert rc == 0 and drained["status"] == "changed", drained
    assert any(job in i["msg"] and "drain stops nothing" in i["msg"] for i in drained["items"]), (
        drained
    )
    rc, status = one(lab, "-H", "lab01", "status")
    assert rc == 0 and status["data"]["state"] == "running", status
    assert status["msg"].endswith(
        f"DRAINED by {operator()} at {status['data']['drain']['at']}: bad fan"
    ), status
    proc = run_fab(lab.root, "-H", "lab01", "drain")
    assert proc.returncode == 2 and "--reason" in proc.stderr, proc.stdout + proc.stderr
