"""become, pure (no network, no lab): the inventory key and its state dir, sudo's words, how sudo's
refusals read, the bootstrap's install of the agent from stdin (run as a real process on real
directories), and check mode's write-access test (remote_scripts/patch/access.py) on real
directories."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fleetops.plans.host import BECOME_STATE_DIR, DEFAULT_STATE_DIR
from fleetops.plans.inventory import load_inventory
from fleetops.plans.yamlsrc import ConfigError
from fleetops.wire import become
from fleetops.wire.bundle import BOOTSTRAP, PYTHON_FLAGS, agent_bundle
from remote_scripts.patch.access import unwritable

NOBODY = 65534


def inventory(tmp_path: Path, text: str):
    (tmp_path / "hosts").mkdir(exist_ok=True)
    (tmp_path / "hosts" / "fleet.yaml").write_text(text)
    return load_inventory(tmp_path / "hosts")


def test_become_is_a_host_key_given_per_host_or_in_defaults_and_moves_the_state_dir_to_roots(
    tmp_path,
):
    inv = inventory(
        tmp_path,
        "defaults:\n  address: 10.9.9.9\n  become: sudo\nhosts:\n  a: {}\n"
        "  b:\n    state_dir: /srv/fleetops\n",
    )
    assert inv.hosts["a"].become == "sudo" and inv.hosts["a"].state_dir == BECOME_STATE_DIR
    assert inv.hosts["b"].become == "sudo" and inv.hosts["b"].state_dir == "/srv/fleetops"
    plain = inventory(tmp_path, "hosts:\n  c:\n    address: 10.9.9.9\n")
    assert plain.hosts["c"].become is None and plain.hosts["c"].state_dir == DEFAULT_STATE_DIR


def test_become_takes_only_sudo(tmp_path):
    with pytest.raises(ConfigError, match="'sudo'"):
        inventory(tmp_path, "hosts:\n  a:\n    address: 10.9.9.9\n    become: doas\n")


def test_sudo_asks_only_with_a_password_and_only_in_sudo_v_with_a_prompt_of_its_own():
    plain = become.Sudo(None).argv(["py", "-c", "x"])
    assert (
        plain[3].count("sudo") == 1
        and "exec sudo -n --" in plain[3]
        and plain[-3:] == ["py", "-c", "x"]
    )
    one, two = become.Sudo("secret"), become.Sudo("secret")
    argv = one.argv(["py", "-c", "x"])
    assert argv[:3] == ["exec", "/bin/sh", "-c"] and argv[-3:] == ["py", "-c", "x"]
    assert "sudo -S -v" in argv[3] and 'sudo -n -- "$p"' in argv[3]
    # the prompt is random per channel and goes on stdin, never into argv (any user's `ps` shows
    # argv)
    assert one.nonce and two.nonce and one.nonce != two.nonce
    assert not any(one.nonce in word or "secret" in word for word in argv)


@pytest.mark.parametrize(
    ("code", "stderr", "says"),
    [
        (1, "sudo: a password is required\n", "--ask-become-pass"),
        (
            1,
            "fleetops-x is not in the sudoers file.\nsudo: This incident has been reported\n",
            "sudoers entry",
        ),
        (127, "sh: 1: sudo: not found\n", "install sudo on the node"),
        (1, "sudo: /opt/venv/bin/python: command not found\n", "was not found on the node"),
    ],
)
def test_a_sudo_refusal_names_its_cause_and_next_step(code, stderr, says):
    from fleetops.plans.inventory import Host

    host = Host("gpu01", "10.9.9.9", user="ops", python="/opt/venv/bin/python", become="sudo")
    sudo = become.Sudo("secret")
    assert sudo.nonce is not None
    err = become.refused(host, code, (sudo.nonce + stderr).encode(), "sudo -n -- ...", 0.0, sudo)
    text = str(err)
    assert text.startswith("gpu01: ") and says in text, text
    assert sudo.nonce not in text and all(
        sudo.nonce not in line for line in err.evidence.stderr_tail
    )


def test_sudo_asking_again_after_sudo_v_took_the_password_is_refused_naming_why():
    from fleetops.plans.inventory import Host

    host = Host("gpu01", "10.9.9.9", user="ops", python="/opt/venv/bin/python", become="sudo")
    sudo = become.Sudo("secret")
    err = become.refused(
        host, 1, f"{become.VALIDATED}\nsudo: a password is required\n".encode(), "x", 0.0, sudo
    )
    text = str(err)
    assert (
        "asked for it again" in text and "NOPASSWD" in text and "--ask-become-pass" not in text
    ), text


def _install(state: Path, data: bytes, want: str, uid: int | None = None) -> dict | None:
    """The bootstrap under become finds no agent, asks for it, and gets `data` on the same stdin
    behind the request line the client had sent first: its answer after the zip (None: it said
    nothing more)."""
    pyz = f"{state}/bin/fleetops-agent-{want[:20]}.pyz"
    argv = [
        sys.executable,
        *PYTHON_FLAGS,
        "-c",
        BOOTSTRAP,
        *become.agent_words([str(state), pyz, want]),
    ]
    proc = subprocess.run(
        argv,
        input=b'{"op": "ping"}\n' + become.frame(data),
        capture_output=True,
        timeout=60,
        user=uid,
    )  # type: ignore[call-overload]
    lines = proc.stdout.decode().splitlines()
    assert lines[0] == become.READY_LINE.decode(), proc
    asked = json.loads(lines[1])
    if asked["error_kind"] != "agent_missing":
        return asked  # refused before it would ask
    assert asked["send_agent"] is True, proc
    return json.loads(lines[2]) if len(lines) > 2 else None


@pytest.fixture
def top():
    d = Path(tempfile.mkdtemp(prefix="fleetops-become-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=True)


def test_the_bootstrap_installs_the_agent_from_stdin_only_with_the_clients_sha256(top):
    data = agent_bundle().data
    want = hashlib.sha256(data).hexdigest()
    refused = _install(top / "state", b"PK other bytes", want)
    assert refused is not None and refused["error_kind"] == "agent_mismatch", refused
    assert not (top / "state").exists()  # nothing made for bytes that are not the agent
    _install(top / "state", data, want)  # then it runs the agent, whose stdin ends at once
    pyz = top / "state" / "bin" / f"fleetops-agent-{want[:20]}.pyz"
    assert pyz.read_bytes() == data
    assert (top / "state").stat().st_mode & 0o777 == 0o700 and (
        top / "state" / "bin"
    ).stat().st_mode & 0o777 == 0o700
    assert [p.name for p in (top / "state" / "bin").iterdir()] == [pyz.name]  # no temp file left


@pytest.mark.root("a state dir of another user needs chown")
def test_the_bootstrap_never_installs_into_a_state_dir_another_user_owns(top):
    state = top / "state"
    (state / "bin").mkdir(parents=True)
    os.chown(state, NOBODY, NOBODY)
    data = agent_bundle().data
    answer = _install(state, data, hashlib.sha256(data).hexdigest())
    assert (
        answer is not None
        and answer["error_kind"] == "untrusted_state"
        and f"owned by uid {NOBODY}" in answer["error"]
    ), answer
    assert list((state / "bin").iterdir()) == []


@pytest.mark.root("a directory only root may write needs root")
def test_check_mode_finds_the_first_path_the_user_cannot_write(top):
    mine = top / "mine"
    mine.mkdir()
    os.chown(mine, NOBODY, NOBODY)
    roots = top / "roots"
    roots.mkdir(mode=0o755)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child becomes uid 65534 and asks as it
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(write, str(unwritable([str(mine / "not-yet" / "lock"), str(roots)])).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        said = f.read()
    # a missing path is judged by its nearest existing parent (mine: writable)
    assert said == str(roots)
    assert unwritable([str(roots)]) is None  # root may


def test_a_second_sudo_of_the_run_never_gets_the_password_and_is_refused_saying_why():
    from fleetops.plans.inventory import Host

    host = Host("gpu01", "10.9.9.9", user="ops", python="/opt/venv/bin/python", become="sudo")
    again = become.Sudo("secret", spent=True)
    # `sudo -n`: nothing to answer, nothing sent
    assert again.password is None and again.nonce is None
    assert "sudo -n --" in again.argv(["python"])[3] and "sudo -S" not in again.argv(["python"])[3]
    text = str(become.refused(host, 1, b"sudo: a password is required\n", "x", 0.0, again))
    assert "asked for the password again" in text and "once per host and run" in text, text
