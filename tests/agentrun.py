"""The real agent, run without SSH: its zip put in a state dir as the client uploads it, started
through the verifying bootstrap as the client starts it (`python -I -S -c LAUNCHER ... STATE_DIR PYZ
SHA256`), one JSON request per line on stdin, one answer per line back. What the agent does does not
depend on how its bytes arrived; the lab tests run the same agent through sshd."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from fleetops.wire.bundle import PYTHON_FLAGS, agent_bundle, launch_words
from remote_scripts.core.protocol import PROTOCOL

# a login's environment, as a node's
ENV = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def run_agent(
    python: Path,
    state: Path,
    requests: list[dict],
    flags: tuple[str, ...] = PYTHON_FLAGS,
    env: dict | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """The bootstrap under `python` serving `requests` (each gets the protocol, state dir, operator
    and an _id)."""
    b = agent_bundle()
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    (state / "bin").mkdir(mode=0o700, exist_ok=True)
    pyz = state / "bin" / b.filename
    if not pyz.exists():
        pyz.write_bytes(b.data)
        pyz.chmod(0o600)
    lines = "".join(
        json.dumps(
            {"protocol": PROTOCOL, "state_dir": str(state), "operator": "test@lab", **r, "_id": i}
        )
        + "\n"
        for i, r in enumerate(requests, 1)
    )
    return subprocess.run(
        [str(python), *flags, *launch_words(), str(state), str(pyz), b.sha256],
        input=lines,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV if env is None else env,
    )


def answers(python: Path, state: Path, requests: list[dict], **kw) -> list[dict]:
    """run_agent's answers, in order; AssertionError with the agent's stderr when it did not answer
    them all."""
    proc = run_agent(python, state, requests, **kw)
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0 and len(got) == len(requests), (
        f"{python}: exit {proc.returncode}, {len(got)} of {len(requests)} answers\n"
        f"{proc.stdout}\n{proc.stderr[-3000:]}"
    )
    return got
