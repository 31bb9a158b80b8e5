"""The agent zip: its modules travel compiled for the client's Python (so a node of that version
starts the agent without compiling), and a node of another version still runs it from the sources in
the same verified bytes. The node side here is the real bootstrap under this machine's python,
without SSH."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from fleetops.wire import bundle as bundle_mod
from fleetops.wire.bundle import BOOTSTRAP, Bundle, agent_bundle
from remote_scripts.core.protocol import PROTOCOL


def _serve(tmp_path: Path, b: Bundle) -> tuple[list[dict], str]:
    state = tmp_path / "state"
    (state / "bin").mkdir(parents=True, mode=0o700)
    state.chmod(0o700)
    pyz = state / "bin" / b.filename
    pyz.write_bytes(b.data)
    pyz.chmod(0o600)
    lines = [
        {"protocol": PROTOCOL, "op": "ping", "_id": 1},
        {"protocol": PROTOCOL, "op": "no-such-op", "_id": 2},
    ]
    proc = subprocess.run(
        [sys.executable, "-c", BOOTSTRAP, str(state), str(pyz), b.sha256],
        input="".join(json.dumps(x) + "\n" for x in lines),
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(x) for x in proc.stdout.splitlines()], proc.stderr


def test_a_node_of_the_clients_python_runs_the_precompiled_modules(tmp_path):
    answers, stderr = _serve(tmp_path, agent_bundle())
    assert answers[0]["ok"] is True and answers[1]["agent_error"] is True, answers
    if bundle_mod.PRECOMPILED:
        # the traceback of the failing request names the precompiled code, not a compile of the
        # zip's sources
        assert 'File "<fleetops-agent>/remote_scripts/core/agent.py"' in stderr, stderr
    # a client before 3.11 sends the sources alone (bundle.py says why): the node compiles them
    else:
        assert "<fleetops-agent>" not in stderr and "remote_scripts/core/agent.py" in stderr, stderr
        names = zipfile.ZipFile(io.BytesIO(agent_bundle().data)).namelist()
        assert not any(n.startswith(bundle_mod.CODE_PREFIX) for n in names), names


def test_a_node_of_another_python_compiles_the_sources_from_the_same_verified_bytes(
    tmp_path, monkeypatch
):
    sources = bundle_mod.agent_sources()
    # compiled for a version the node is not
    monkeypatch.setattr(bundle_mod, "CODE_PREFIX", "code-00000000/")
    data = bundle_mod._build(sources)
    import hashlib

    answers, stderr = _serve(tmp_path, Bundle(data, hashlib.sha256(data).hexdigest()))
    assert answers[0]["ok"] is True and answers[1]["agent_error"] is True, answers
    assert "<fleetops-agent>" not in stderr and '/remote_scripts/core/agent.py"' in stderr, stderr


def test_the_bundle_is_the_same_bytes_in_any_client_process_and_a_stale_cache_is_not_believed(
    tmp_path,
):
    code = (
        "import hashlib, sys; from fleetops.wire.bundle import agent_bundle; "
        "import fleetops.cli, fleetops.run, rich.console; print(agent_bundle().sha256)"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONHASHSEED": "1"}
    first = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    cached = list((tmp_path / "cache" / "fleetops" / "agent").glob("*.pyz"))
    assert len(cached) == 1
    # a damaged cache file: built again, same bytes
    cached[0].write_bytes(cached[0].read_bytes()[:-200])
    env["PYTHONHASHSEED"] = "2"
    again = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    env["XDG_CACHE_HOME"] = str(tmp_path / "none")
    fresh = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert first == again == fresh and len(first.strip()) == 64
