"""The processes the agent starts run through the verifying bootstrap
(remote_scripts/core/bootstrap.py: relaunch), here with the real bootstrap under this machine's
python, without SSH: the job keeper is started with the agent's sha256 and absolute paths, so the
default state dir (`.fleetops`, relative to the login's home) works from the job's own directory;
and the zip itself refuses to be run by its path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from fleetops.wire.bundle import BOOTSTRAP, PYTHON_FLAGS, agent_bundle
from remote_scripts.core.protocol import PROTOCOL


def _agent(home: Path, requests: list[dict]) -> list[dict]:
    b = agent_bundle()
    state = home / ".fleetops"
    (state / "bin").mkdir(parents=True, mode=0o700)
    state.chmod(0o700)
    (state / "bin" / b.filename).write_bytes(b.data)
    (state / "bin" / b.filename).chmod(0o600)
    lines = "".join(
        json.dumps(
            {"protocol": PROTOCOL, "state_dir": ".fleetops", "operator": "t@x", **r, "_id": i}
        )
        + "\n"
        for i, r in enumerate(requests, 1)
    )
    proc = subprocess.run(
        [
            sys.executable,
            *PYTHON_FLAGS,
            "-c",
            BOOTSTRAP,
            ".fleetops",
            f".fleetops/bin/{b.filename}",
            b.sha256,
        ],
        input=lines,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=home,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(x) for x in proc.stdout.splitlines()]


def test_a_job_under_a_relative_state_dir_is_kept_through_the_bootstrap(tmp_path):
    job = {
        "name": "hello",
        "kind": "command",
        "argv": [sys.executable, "-c", "print('hello from the job')"],
        "env": {},
        "shown_env": {},
    }
    (started,) = _agent(tmp_path, [{"op": "job_start", "job": job}])
    assert started["ok"], started
    job_dir = tmp_path / ".fleetops" / "jobs" / started["job"]["id"]
    deadline = time.monotonic() + 60
    while not (job_dir / "exit.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert json.loads((job_dir / "exit.json").read_text())["exit_code"] == 0
    assert (job_dir / "output.log").read_text() == "hello from the job\n"
    keeper = started["job"]["keeper_pid"]
    assert isinstance(keeper, int) and started["job"]["keeper_started"] is not None


def test_the_zip_refuses_to_run_by_its_path(tmp_path):
    b = agent_bundle()
    pyz = tmp_path / b.filename
    pyz.write_bytes(b.data)
    proc = subprocess.run(
        [sys.executable, str(pyz), "wrap", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "runs only through its verifying bootstrap" in proc.stderr, (
        proc.stderr
    )
