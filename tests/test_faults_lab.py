"""Faults during patch and rollback, injected at every step on a real lab node: the remote process killed,
the connection cut, the node's sshd stopped. Afterwards each target file is byte-identical to its pristine or
its fully patched form, nothing half-written is left, and the next patch and rollback succeed."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GENERATOR, REPO, WORKER, record_sha256

from fleetops import api
from fleetops.lab import site_packages
from fleetops.plans.playbook import load_playbook
from remote_scripts import patching

pytestmark = pytest.mark.lab
PLAYBOOK = REPO / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml"
PATCH_POINTS = ["lock.acquired", "lock.info.before_rename", "lock.info.after_rename", "patch.backup.before_rename",
                "patch.backup.after_rename", "patch.record.before_rename", "patch.record.after_rename",
                "patch.after_backup", "patch.target.before_rename", "patch.target.after_rename"]
ROLLBACK_POINTS = ["lock.acquired", "rollback.target.before_rename", "rollback.target.after_rename"]
KINDS = ["kill-agent", "cut-connection", "stop-sshd"]
TALLY = {"faults": 0, "files_checked": 0}


def forms(node) -> dict[str, set[str]]:
    """For each target file: sha256 of its pristine (installed) and its fully patched form."""
    book = load_playbook(PLAYBOOK)
    site = site_packages(node.venv)
    out = {}
    for p in book.patches:
        pristine = node.module_file(p.module).read_bytes()
        assert hashlib.sha256(pristine).hexdigest() == record_sha256(site, p.module)
        lines = patching.split_lines(pristine.decode())
        hunks = [h.to_request(i) for i, h in enumerate(p.hunks)]
        patched = patching.apply_hunks(lines, hunks, patching.classify(lines, hunks)).encode()
        out[p.module] = {hashlib.sha256(pristine).hexdigest(), hashlib.sha256(patched).hexdigest()}
    return out


def assert_whole(node, allowed: dict[str, set[str]]) -> None:
    for module, shas in allowed.items():
        path = node.module_file(module)
        assert hashlib.sha256(path.read_bytes()).hexdigest() in shas, f"{module} is neither pristine nor patched"
        leftovers = [n for n in os.listdir(path.parent) if ".fleetops-tmp-" in n]
        TALLY["files_checked"] += 1
        assert not leftovers or all(not os.path.exists(f"/proc/{n.rsplit('-', 1)[1]}") for n in leftovers)


def inject(lab, node, op: str, point: str, kind: str) -> subprocess.CompletedProcess:
    action = {"action": "kill"} if kind == "kill-agent" else {"action": "sleep", "seconds": 3}
    (node.state_dir / "failpoints.json").write_text(json.dumps({point: action}))
    hit = node.state_dir / f"failpoint-{point}.hit"
    hit.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "fabric", "-H", node.name, op, "--json"], cwd=lab.root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 30
        while not hit.exists():
            assert time.monotonic() < deadline, f"{point} never reached"
            time.sleep(0.02)
        (node.state_dir / "failpoints.json").unlink()
        if kind in ("cut-connection", "stop-sshd"):
            listener = node.pid()
            if kind == "stop-sshd":
                lab.stop_node(node)
            out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(listener)], capture_output=True, text=True)
            for pid in out.stdout.split():
                os.kill(int(pid), signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    TALLY["faults"] += 1
    if kind == "stop-sshd":
        lab.start_node(node)
    agent = int(hit.read_text())
    deadline = time.monotonic() + 60
    while _running(agent):
        assert time.monotonic() < deadline, "the orphaned agent never finished"
        time.sleep(0.1)  # with its client gone, the agent still finishes its step (or dies writing the answer)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def results(lab, node, op: str) -> list:
    return api.run(lab.root, node.name, [(op, {})])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("point", PATCH_POINTS)
def test_fault_during_patch(lab, point, kind):
    node = lab.node("lab01")
    allowed = forms(node)
    faulted = inject(lab, node, "patch", point, kind)
    assert faulted.returncode != 0 or kind != "kill-agent", faulted.stdout
    if faulted.returncode != 0:
        msg = json.loads(faulted.stdout)["results"][0]["msg"]
        assert ("agent failed" in msg or "lost during the step" in msg), msg
    assert_whole(node, allowed)
    (r,) = results(lab, node, "patch")
    assert r.status.value in ("changed", "ok"), r.msg
    if point in ("lock.acquired", "lock.info.after_rename") and kind == "kill-agent":  # holder info left behind
        notes = [n for i in r.items for n in i.details.get("notes", [])]
        assert notes and "took over a stale lock" in notes[0]
    assert_whole(node, allowed)
    (r,) = results(lab, node, "rollback")
    assert r.status.value == "changed", r.msg
    for module in allowed:
        assert hashlib.sha256(node.module_file(module).read_bytes()).hexdigest() == \
            record_sha256(site_packages(node.venv), module)
    TALLY["files_checked"] += len(allowed)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("point", ROLLBACK_POINTS)
def test_fault_during_rollback(lab, point, kind):
    node = lab.node("lab01")
    allowed = forms(node)
    (r,) = results(lab, node, "patch")
    assert r.status.value == "changed"
    inject(lab, node, "rollback", point, kind)
    assert_whole(node, allowed)
    (r,) = results(lab, node, "rollback")
    assert r.status.value in ("changed", "ok"), r.msg
    for module in (GENERATOR, WORKER):
        assert hashlib.sha256(node.module_file(module).read_bytes()).hexdigest() == \
            record_sha256(site_packages(node.venv), module)
    (r,) = results(lab, node, "patch")
    assert r.status.value == "changed", r.msg
    assert_whole(node, allowed)


def test_zz_report_fault_tally():
    print(f"\nfault injection: {TALLY['faults']} faults injected, {TALLY['files_checked']} file checks")
    assert TALLY["faults"] >= 1 or os.environ.get("PYTEST_XDIST_WORKER")
