"""An agent start that carries its first requests in the command (bundle.HEAD_LAUNCHER, a round
trip less: sshd grants a session channel no window until its command runs, so stdin waits for the
exec's answer, an argv word does not): the real bootstrap and agent, started as the client starts
them, read the carried lines first, skip their copy on stdin (written there too, for a `python:`
that is not the launcher) and read stdin on, as one stream, on the client's own Python and on
another that compiles the bootstrap's text; a copy that differs ends the session; the head word is
gone from the argv the bootstrap reads.
Which requests may ride there (seen in the node's process list): those of INLINE_OPS, in order up to
the first that may not, within MAX_INLINE_BYTES, never under become."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetops.plans.inventory import Host
from fleetops.wire import agentclient
from fleetops.wire.agentclient import AgentClient
from fleetops.wire.bundle import HEAD_LAUNCHER, PYTHON_FLAGS, agent_bundle, launch_words_with
from fleetops.wire.session import Ticket
from remote_scripts.core.protocol import PROTOCOL

ENV = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> Path:
    """A node venv of the client's own Python with nothing installed (the client's venv has .pth
    files)."""
    venv = tmp_path_factory.mktemp("node") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=ENV)
    return venv / "bin" / "python"


def _line(state: Path, rid: int, op: str = "ping") -> str:
    request = {"protocol": PROTOCOL, "state_dir": str(state), "operator": "t@lab", "op": op}
    return json.dumps({**request, "_id": rid}) + "\n"


def _start(python: Path, state: Path, words: tuple[str, ...], stdin: str):
    b = agent_bundle()
    (state / "bin").mkdir(mode=0o700, parents=True, exist_ok=True)
    state.chmod(0o700)
    pyz = state / "bin" / b.filename
    pyz.write_bytes(b.data)
    pyz.chmod(0o600)
    return subprocess.run(
        [str(python), *PYTHON_FLAGS, *words, str(state), str(pyz), b.sha256],
        input=stdin,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )


@pytest.mark.parametrize("same_python", [True, False], ids=["compiled", "from-text"])
def test_the_carried_lines_are_answered_first_then_stdins_in_order(python, tmp_path, same_python):
    state = tmp_path / "state"
    head = _line(state, 1) + _line(state, 2)
    words = launch_words_with(head.encode())
    if not same_python:  # a node of another Python: the bootstrap's text, compiled there
        words = (*words[:2], "cpython-0-0", *words[3:])
    proc = _start(python, state, words, head + _line(state, 3))
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [a["_id"] for a in answers] == [1, 2, 3] and all(a["ok"] for a in answers), answers


def test_a_copy_on_stdin_that_differs_ends_the_session_after_the_carried_answers(python, tmp_path):
    state = tmp_path / "state"
    words = launch_words_with(_line(state, 1).encode())
    proc = _start(python, state, words, _line(state, 7) + _line(state, 2))
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [a["_id"] for a in answers] == [1], answers


def test_a_refusal_comes_before_any_carried_request_is_served(python, tmp_path):
    """The zip's bytes do not match: the bootstrap refuses as always, the carried request unread."""
    state = tmp_path / "state"
    b = agent_bundle()
    (state / "bin").mkdir(mode=0o700, parents=True)
    state.chmod(0o700)
    pyz = state / "bin" / b.filename
    pyz.write_bytes(b.data + b"tampered")
    pyz.chmod(0o600)
    proc = subprocess.run(
        [
            str(python),
            *PYTHON_FLAGS,
            *launch_words_with(_line(state, 1).encode()),
            str(state),
            str(pyz),
            b.sha256,
        ],
        input="",
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    (answer,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert answer["bootstrap"] is True and answer["error_kind"] == "agent_mismatch", answer


def test_the_head_launcher_is_the_launcher_with_the_head_read_first():
    assert HEAD_LAUNCHER.startswith("import sys, io, zlib, binascii\n")
    assert "sys.argv.pop(4)" in HEAD_LAUNCHER  # the word after SOURCE, before the bootstrap's


def _client(become: str | None = None) -> AgentClient:
    return AgentClient(Host(name="n1", address="127.0.0.1", user="ops", become=become))


def test_only_leading_requests_of_inline_ops_ride_in_the_command():
    client = _client()
    tickets = [
        Ticket(client, "patch", {"x": 1}, 60),
        Ticket(client, "verify", {}, 60, ahead=True),
        Ticket(client, "run", {"argv": ["mysql", "-psecret"]}, 60),
        Ticket(client, "ping", {}, 60),
    ]
    inline = client._inline(tickets)
    assert [t.op for t, _ in inline] == ["patch", "verify"]
    assert [json.loads(line)["_id"] for _, line in inline] == [1, 2]
    assert "run" not in agentclient.INLINE_OPS and "job_start" not in agentclient.INLINE_OPS


def test_nothing_rides_in_the_command_under_become_or_past_the_size_bound(monkeypatch):
    become = _client("sudo")
    assert become._inline([Ticket(become, "ping", {}, 60)]) == []
    client = _client()
    monkeypatch.setattr(agentclient, "MAX_INLINE_BYTES", 400)
    tickets = [Ticket(client, "ping", {"pad": "x" * 100}, 60) for _ in range(4)]
    inline = client._inline(tickets)
    assert 1 <= len(inline) < 4 and sum(len(line) for _, line in inline) <= 400
