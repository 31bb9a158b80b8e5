"""A node whose Python is older than the agent's floor (3.9) gets one clear JSON refusal from the
bootstrap, naming its Python and the minimum, before any module of the agent is read: no traceback,
whatever was asked. The real bootstrap and zip under pyenv's real interpreters (tests/agentrun.py);
under CI=true a missing interpreter fails the test (conftest: no silent skip)."""

from __future__ import annotations

import json
import subprocess

import pytest
from agentrun import run_agent
from conftest import REPO

from fleetops.lab.pythons import NODE_PYTHONS, find_python
from fleetops.plans.playbook import load_playbook

PLAYBOOK = REPO / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml"


def _python(version: str):
    python = find_python(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine (pyenv install {version})")
    return python


@pytest.mark.parametrize("version", ["3.6", "3.7", "3.8"])
def test_a_python_older_than_the_floor_is_refused_in_one_json_line(version, tmp_path):
    python = _python(version)
    full = subprocess.run(
        [str(python), "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    book = load_playbook(PLAYBOOK)
    proc = run_agent(
        python,
        tmp_path / "state",
        [{"op": "ping"}, {"op": "patch", **book.patch_request(check=True)}, {"op": "facts"}],
    )
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr == ""  # no traceback, no warning: the one line below is all
    (answer,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert (
        answer["bootstrap"] is True
        and answer["ok"] is False
        and answer["error_kind"] == "python_too_old"
    )
    assert f"Python {full} ({python})" in answer["error"]
    assert (
        "needs Python 3.9 or newer" in answer["error"]
        and "`python:` in the inventory" in answer["error"]
    )
    assert (answer["python"], answer["python_path"]) == (full, str(python))


def test_the_floor_is_the_oldest_node_python_stated():
    from remote_scripts.core.bootstrap import OLDEST_PYTHON

    assert ".".join(map(str, OLDEST_PYTHON)) == NODE_PYTHONS[0]
    lines = [
        line for line in (REPO / "README.md").read_text().splitlines() if "Node Pythons" in line
    ]
    assert len(lines) == 1 and ", ".join(NODE_PYTHONS) in lines[0], lines
