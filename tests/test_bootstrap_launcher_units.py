"""How the client starts the bootstrap (fleetops/wire/bundle.py launch_words): a node whose Python is the
client's very one runs the bootstrap compiled by the client and takes the zip's compiled modules without
importlib.util; any other Python compiles the bootstrap's text, as before. Either way the agent answers and the
three launcher words are gone from the argv the bootstrap reads. (-X importtime shows what was imported.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetops.wire.bundle import PYTHON_FLAGS, agent_bundle, launch_words
from remote_scripts.core.protocol import PROTOCOL

ENV = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> Path:
    """A node venv of the client's own Python (the same version, so the same bytecode) with nothing installed:
    the client's venv and the base interpreter's site-packages have .pth files that import importlib.util."""
    venv = tmp_path_factory.mktemp("node") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=ENV)
    return venv / "bin" / "python"


def start(python: Path, state: Path, words: tuple[str, ...]) -> subprocess.CompletedProcess:
    b = agent_bundle()
    (state / "bin").mkdir(mode=0o700, parents=True, exist_ok=True)
    state.chmod(0o700)
    pyz = state / "bin" / b.filename
    pyz.write_bytes(b.data)
    pyz.chmod(0o600)
    ping = json.dumps({"protocol": PROTOCOL, "state_dir": str(state), "operator": "t@lab", "op": "ping", "_id": 1})
    return subprocess.run([str(python), *PYTHON_FLAGS, "-X", "importtime", *words, str(state), str(pyz),
                           b.sha256], input=ping + "\n", capture_output=True, text=True, env=ENV, timeout=60)


def imported(proc: subprocess.CompletedProcess) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


def test_the_clients_own_python_runs_the_compiled_bootstrap_and_modules(python, tmp_path):
    proc = start(python, tmp_path / "state", launch_words())
    (answer,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0 and answer["ok"], proc.stdout + proc.stderr
    assert "importlib.util" not in imported(proc)


def test_another_python_compiles_the_text_and_compares_magic_numbers(python, tmp_path):
    dash_c, launcher, tag, code, source = launch_words()
    proc = start(python, tmp_path / "state", (dash_c, launcher, "cpython-0-0", code, source))
    (answer,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0 and answer["ok"], proc.stdout + proc.stderr
    assert "importlib.util" in imported(proc)


def test_the_bootstrap_reads_its_own_words_only(python, tmp_path):
    """A refusal names the state dir the client gave: the launcher's words never shift the bootstrap's argv."""
    dash_c, launcher, tag, code, source = launch_words()
    for words in ((dash_c, launcher, tag, code, source), (dash_c, launcher, "other", code, source)):
        proc = subprocess.run([str(python), *PYTHON_FLAGS, *words, str(tmp_path / "nowhere"), "x.pyz", "0" * 64],
                              capture_output=True, text=True, env=ENV, timeout=60)
        (answer,) = [json.loads(line) for line in proc.stdout.splitlines()]
        assert proc.returncode == 3 and answer["bootstrap"] is True, proc.stdout + proc.stderr
        assert str(tmp_path / "nowhere") in answer["error"], answer
