"""A steady-state `patch verify --kinds grep,compile` costs the node no `json`, `re`, enum, functools,
collections, threading, signal or typing import: ~17 ms of CPU per host on the lab before this change. The real
bootstrap and agent run here under a lab node's interpreter (real speculators 0.3.0 and vLLM 0.16.0), serving
the very requests the client sends, built from the shipped playbook; `-X importtime` names every
module the interpreter imported, and what it imports before any fleetops code is not counted against the
agent. (No SSH: what the agent imports does not depend on how its bytes arrived; the lab tests run the same
agent through sshd.)"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from fleetops.plans.playbook import load_playbook
from fleetops.wire.bundle import BOOTSTRAP, agent_bundle
from remote_scripts.core.protocol import PROTOCOL

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK = REPO / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml"
HEAVY = {"json", "re", "enum", "functools", "collections", "threading", "signal", "typing", "tokenize", "base64",
         "hashlib", "subprocess", "tempfile", "zipfile"}
ENV = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def _imported(stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")} - \
        {"imported package"}


def _run_agent(python: Path, state: Path, requests: list[dict], flags: tuple[str, ...] = (),
               env: dict | None = None) -> subprocess.CompletedProcess:
    """The real bootstrap (the agent zip put in the state dir as the client uploads it) serving `requests`."""
    b = agent_bundle()
    pyz = state / "bin" / b.filename
    (state / "bin").mkdir(mode=0o700, exist_ok=True)
    if not pyz.exists():
        pyz.write_bytes(b.data)
        pyz.chmod(0o600)
    lines = "".join(json.dumps({"protocol": PROTOCOL, "state_dir": str(state), "operator": "test@lab", **r,
                                "_id": i}) + "\n" for i, r in enumerate(requests, 1))
    return subprocess.run([str(python), *flags, "-c", BOOTSTRAP, str(state), str(pyz), b.sha256],
                          input=lines, capture_output=True, text=True, timeout=120, env=ENV if env is None else env)


def _agent(python: Path, state: Path, requests: list[dict]) -> tuple[list[dict], set[str]]:
    proc = _run_agent(python, state, requests, ("-X", "importtime"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(x) for x in proc.stdout.splitlines()], _imported(proc.stderr)


def test_a_steady_state_patch_and_verify_imports_nothing_heavy(lab):
    node = lab.nodes()[0]  # its venv: pristine speculators 0.3.0 of its own, vLLM 0.16.0 from the lab base
    book = load_playbook(PLAYBOOK)
    steady = [{"op": "patch", **book.patch_request()}, {"op": "verify", **book.verify_request({"grep", "compile"})}]
    assert sum(c["kind"] == "grep" for c in steady[1]["checks"]) >= 10
    before = subprocess.run([str(node.python), "-X", "importtime", "-c", "pass"], capture_output=True, text=True,
                            env=ENV, check=True)
    at_start = _imported(before.stderr)  # the interpreter's own start (site, .pth files): not the agent's
    assert HEAVY & at_start == set(), sorted(HEAVY & at_start)  # else the check below would exempt them

    (applied,), _ = _agent(node.python, node.state_dir, steady[:1])
    assert {i["status"] for i in applied["items"]} == {"applied"}, applied
    first, _ = _agent(node.python, node.state_dir, steady)  # tokenizes and compiles, keeps both in the state dir
    answers, imported = _agent(node.python, node.state_dir, steady)

    patch, verify = answers
    assert {i["status"] for i in patch["items"]} == {"already_applied"}, patch
    assert verify["ok"] and len(verify["items"]) == len(steady[1]["checks"]) + 1, verify  # + requires
    assert [i["msg"] for i in verify["items"]] == [i["msg"] for i in first[1]["items"]]
    # what checks.py and patching.py import (importlib.import_module, which the agent loads them with, is not
    # logged by -X importtime; the imports they make are)
    assert {"remote_scripts.core.textpattern", "remote_scripts.patch.hunks",
            "remote_scripts.patch.sitelock"} <= imported
    assert HEAVY & (imported - at_start) == set(), sorted(HEAVY & (imported - at_start))


def test_the_serving_agent_ends_without_pythons_teardown(lab, tmp_path):
    """Once the client has closed the session, every answer is written and every op's
    files and children are done with, so the agent skips Python's teardown (3-5 ms of the node's CPU per host,
    measured). A sitecustomize on the agent's path registers an exit handler: teardown runs it, os._exit not."""
    node = lab.nodes()[0]
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(
        "import atexit, sys\natexit.register(lambda: sys.stderr.write('teardown ran\\n'))\n")
    env = {**ENV, "PYTHONPATH": str(hooks)}
    plain = subprocess.run([str(node.python), "-c", "pass"], capture_output=True, text=True, env=env, timeout=60)
    assert "teardown ran" in plain.stderr  # the hook works: an interpreter that tears down runs it
    proc = _run_agent(node.python, node.state_dir, [{"op": "ping"}, {"op": "ping"}], env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [json.loads(x)["_id"] for x in proc.stdout.splitlines()] == [1, 2]  # every answer is out
    assert "teardown ran" not in proc.stderr
