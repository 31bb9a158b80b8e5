"""The serving agent's end: once its client has closed the session it exits without Python's
teardown. The real bootstrap and agent run here under a lab node's interpreter (real speculators
0.3.0 and vLLM 0.16.0); no SSH: how the agent ends does not depend on how its bytes arrived; the lab
tests run the same agent through sshd."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from fleetops.wire.bundle import BOOTSTRAP, agent_bundle
from remote_scripts.core.protocol import PROTOCOL

ENV = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def _run_agent(
    python: Path,
    state: Path,
    requests: list[dict],
    flags: tuple[str, ...] = (),
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """The real bootstrap (the agent zip put in the state dir as the client uploads it) serving
    `requests`."""
    b = agent_bundle()
    pyz = state / "bin" / b.filename
    (state / "bin").mkdir(mode=0o700, exist_ok=True)
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
        [str(python), *flags, "-c", BOOTSTRAP, str(state), str(pyz), b.sha256],
        input=lines,
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV if env is None else env,
    )


def test_the_serving_agent_ends_without_pythons_teardown(lab, tmp_path):
    """Once the client has closed the session, every answer is written and every op's files and
    children are done with, so the agent skips Python's teardown (3-5 ms of the node's CPU per host,
    measured). A sitecustomize on the agent's path registers an exit handler: teardown runs it,
    os._exit not."""
    node = lab.nodes()[0]
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(
        "import atexit, sys\natexit.register(lambda: sys.stderr.write('teardown ran\\n'))\n"
    )
    env = {**ENV, "PYTHONPATH": str(hooks)}
    plain = subprocess.run(
        [str(node.python), "-c", "pass"], capture_output=True, text=True, env=env, timeout=60
    )
    assert "teardown ran" in plain.stderr  # the hook works: an interpreter that tears down runs it
    proc = _run_agent(node.python, node.state_dir, [{"op": "ping"}, {"op": "ping"}], env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [json.loads(x)["_id"] for x in proc.stdout.splitlines()] == [1, 2]  # every answer is out
    assert "teardown ran" not in proc.stderr
