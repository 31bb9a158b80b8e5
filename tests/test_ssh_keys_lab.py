"""Logging in as OpenSSH does: an encrypted identity file opened with the passphrase typed at
`--prompt-for-passphrase` (on a real pty), or not opened at all when ssh-agent holds its key (a real
ssh-agent on a socket of the test's own); and each key failure named for what it is (a wrong
passphrase, a missing identity file), never as a network or handshake fault."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import REPO, fab_json_output

pytestmark = pytest.mark.lab

PASSPHRASE = "correct horse battery"
EXIT_UNREACHABLE = 4


OPERATORS_AGENT = ("SSH_AUTH_SOCK", "SSH_AGENT_PID")


def _env(**extra: str) -> dict:
    """The test's environment with no ssh-agent of the operator's: only an agent the test starts is
    seen."""
    env = {k: v for k, v in os.environ.items() if k not in OPERATORS_AGENT}
    return {**env, "PYTHONPATH": str(REPO), "COLUMNS": "200", **extra}


def fab(project: Path, *args: str, env: dict | None = None) -> tuple[int, dict, str]:
    return fab_json_output(project, *args, timeout=300, env=env, drop=OPERATORS_AGENT)


def fab_on_a_pty(
    project: Path, args: list[str], typed: str, env: dict, program: str = "fab"
) -> tuple[int, str]:
    """fab (or fleet) with a terminal of its own (getpass reads /dev/tty): `typed` is sent once a
    prompt shows."""
    argv = (
        [sys.executable, "-m", "fabric"]
        if program == "fab"
        else [str(Path(sys.executable).parent / "fleet")]
    )
    pid, master = pty.fork()
    if pid == 0:  # the child: fab, with the pty as its controlling terminal
        os.chdir(project)
        os.execve(argv[0], [*argv, *args], env)
    seen, sent = b"", False
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if not ready:
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
        if not sent and b"passphrase" in seen.lower():
            os.write(master, typed.encode() + b"\n")
            sent = True
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(master)
    return os.waitstatus_to_exitcode(status), seen.decode("utf-8", "replace")


@pytest.fixture
def encrypted_key(lab, tmp_path) -> Iterator[Path]:
    """An ed25519 key encrypted with PASSPHRASE (ssh-keygen -N), authorized on lab01, named by host
    enc01."""
    key = tmp_path / "enc_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-C", "enc", "-f", str(key)],
        check=True,
    )
    yield key


@contextmanager
def inventory_host(lab, identity_file: str, extra: str = "") -> Iterator[None]:
    node = lab.node("lab01")
    keys = node.dir / "authorized_keys"
    before = keys.read_text()
    pub = Path(identity_file + ".pub")
    if pub.exists():
        keys.write_text(before + pub.read_text())
    hosts = lab.root / "hosts" / "enc.yaml"
    hosts.write_text(
        f"hosts:\n  enc01:\n    address: 127.0.0.1\n    port: {node.port}\n    user: {lab.user}\n"
        f"    identity_file: {identity_file}\n    known_hosts: {lab.known_hosts}\n{extra}"
    )
    try:
        yield
    finally:
        hosts.unlink()
        keys.write_text(before)


@contextmanager
def ssh_agent(tmp_path: Path) -> Iterator[str]:
    """A real ssh-agent on a socket in tmp_path, killed at the end."""
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        assert sock.exists(), "ssh-agent did not start"
        yield str(sock)
    finally:
        proc.kill()
        proc.wait()


def only_result(doc: dict) -> dict:
    assert len(doc["results"]) == 1, doc
    return doc["results"][0]


def test_prompt_for_passphrase_opens_the_encrypted_identity_file(lab, encrypted_key):
    with inventory_host(lab, str(encrypted_key)):
        rc, out = fab_on_a_pty(
            lab.root, ["--prompt-for-passphrase", "-H", "enc01", "ping"], PASSPHRASE, _env()
        )
    assert "no passphrase was given" not in out, out
    assert rc == 0, out
    assert "Traceback" not in out, out


def test_a_key_in_ssh_agent_is_used_for_the_inventory_identity_file_without_its_passphrase(
    lab, encrypted_key, tmp_path
):
    with ssh_agent(tmp_path) as sock, inventory_host(lab, str(encrypted_key)):
        _add_encrypted_to_agent(sock, encrypted_key, tmp_path)
        rc, doc, both = fab(lab.root, "-H", "enc01", "ping", env=_env(SSH_AUTH_SOCK=sock))
    assert rc == 0 and only_result(doc)["status"] == "ok", both


def test_an_agent_without_that_key_still_asks_for_the_passphrase(lab, encrypted_key, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    with ssh_agent(tmp_path) as sock, inventory_host(lab, str(encrypted_key)):
        subprocess.run(
            ["ssh-add", str(other)], check=True, capture_output=True, env=_env(SSH_AUTH_SOCK=sock)
        )
        rc, doc, both = fab(lab.root, "-H", "enc01", "ping", env=_env(SSH_AUTH_SOCK=sock))
    msg = only_result(doc)["msg"]
    assert rc == EXIT_UNREACHABLE and "encrypted" in msg and str(encrypted_key) in msg, both
    assert "--prompt-for-passphrase" in msg and "ssh-add" in msg, msg


def test_a_wrong_passphrase_is_named_with_the_key_file(lab, encrypted_key):
    with inventory_host(lab, str(encrypted_key), "    identity_passphrase: not the passphrase\n"):
        rc, doc, both = fab(lab.root, "-H", "enc01", "ping")
    msg = only_result(doc)["msg"]
    assert rc == EXIT_UNREACHABLE, both
    assert f"wrong passphrase for {encrypted_key}" in msg, msg
    assert "handshake" not in msg and "not the passphrase" not in both, msg


def test_a_wrong_passphrase_typed_at_the_prompt_is_named(lab, encrypted_key):
    with inventory_host(lab, str(encrypted_key)):
        rc, out = fab_on_a_pty(
            lab.root, ["--prompt-for-passphrase", "-H", "enc01", "ping"], "nope", _env()
        )
    assert rc == EXIT_UNREACHABLE, out
    assert f"wrong passphrase for {encrypted_key}" in " ".join(out.split()), out


def test_a_missing_identity_file_is_named(lab, tmp_path):
    missing = tmp_path / "nonexist"
    with inventory_host(lab, str(missing)):
        rc, doc, both = fab(lab.root, "-H", "enc01", "ping")
    msg = only_result(doc)["msg"]
    assert rc == EXIT_UNREACHABLE, both
    assert f"identity file {missing} not found" in msg, msg
    assert "check the address" not in msg, msg


def test_a_missing_dash_i_key_for_a_host_outside_the_inventory_is_named(lab, tmp_path):
    missing = tmp_path / "nonexist"
    node = lab.node("lab01")
    config = tmp_path / "ssh_config"
    config.write_text(f"Host 127.0.0.1\n  UserKnownHostsFile {lab.known_hosts}\n")
    rc, doc, both = fab(
        lab.root,
        "-S",
        str(config),
        "-i",
        str(missing),
        "-H",
        f"{lab.user}@127.0.0.1:{node.port}",
        "ping",
    )
    msg = only_result(doc)["msg"]
    assert rc == EXIT_UNREACHABLE, both
    assert f"identity file {missing} not found" in msg, msg


def ping_through_ssh_config(lab, config: Path, env: dict | None = None) -> tuple[int, dict, str]:
    """`fab -S CONFIG -H user@127.0.0.1:PORT ping`: lab01 named outside the inventory, so its key
    and options come from the ssh_config file alone."""
    port = lab.node("lab01").port
    return fab(lab.root, "-S", str(config), "-H", f"{lab.user}@127.0.0.1:{port}", "ping", env=env)


def _add_to_agent(sock: str, key: Path) -> None:
    subprocess.run(
        ["ssh-add", str(key)],
        check=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        env=_env(SSH_AUTH_SOCK=sock),
    )


def _add_encrypted_to_agent(sock: str, key: Path, tmp_path: Path) -> None:
    """The passphrase-protected `key` added to the agent on `sock`, opened with PASSPHRASE."""
    # ssh-add reads the passphrase from SSH_ASKPASS (no terminal here): a script of the test's own
    askpass = tmp_path / "askpass"
    askpass.write_text(f"#!/bin/sh\necho '{PASSPHRASE}'\n")
    askpass.chmod(0o700)
    subprocess.run(
        ["ssh-add", str(key)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=_env(
            SSH_AUTH_SOCK=sock, SSH_ASKPASS=str(askpass), SSH_ASKPASS_REQUIRE="force", DISPLAY=":0"
        ),
    )


def test_identities_only_in_ssh_config_offers_no_other_agent_key(lab, tmp_path):
    """IdentitiesOnly yes: only IdentityFile's key (or the agent's copy of it) is offered; the
    agent's other keys, here the one sshd would accept, are not."""
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host 127.0.0.1\n  UserKnownHostsFile {lab.known_hosts}\n  IdentitiesOnly yes\n"
        f"  IdentityFile {stranger}\n"
    )
    with ssh_agent(tmp_path) as sock:
        _add_to_agent(sock, lab.client_key)
        rc, doc, both = ping_through_ssh_config(lab, config, env=_env(SSH_AUTH_SOCK=sock))
    msg = only_result(doc)["msg"]
    assert rc == EXIT_UNREACHABLE and "authentication failed" in msg, both


def test_identities_only_uses_the_agent_copy_of_the_named_encrypted_key(
    lab, encrypted_key, tmp_path
):
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host 127.0.0.1\n  UserKnownHostsFile {lab.known_hosts}\n  IdentitiesOnly yes\n"
        f"  IdentityFile {encrypted_key}\n"
    )
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    with ssh_agent(tmp_path) as sock, inventory_host(lab, str(encrypted_key)):
        _add_to_agent(sock, other)
        _add_encrypted_to_agent(sock, encrypted_key, tmp_path)
        rc, doc, both = ping_through_ssh_config(lab, config, env=_env(SSH_AUTH_SOCK=sock))
    assert rc == 0 and only_result(doc)["status"] == "ok", both


def test_a_missing_identity_file_in_ssh_config_is_passed_over_as_openssh_does(lab, tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host 127.0.0.1\n  UserKnownHostsFile {lab.known_hosts}\n  IdentityFile "
        f"{tmp_path / 'gone'}\n  IdentityFile {lab.client_key}\n"
    )
    rc, doc, both = ping_through_ssh_config(lab, config)
    assert rc == 0 and only_result(doc)["status"] == "ok", both


def test_a_wrong_passphrase_for_a_dash_i_key_is_named(lab, encrypted_key, tmp_path):
    node = lab.node("lab01")
    config = tmp_path / "ssh_config"
    config.write_text(f"Host 127.0.0.1\n  UserKnownHostsFile {lab.known_hosts}\n")
    rc, out = fab_on_a_pty(
        lab.root,
        [
            "--prompt-for-passphrase",
            "-S",
            str(config),
            "-i",
            str(encrypted_key),
            "-H",
            f"{lab.user}@127.0.0.1:{node.port}",
            "ping",
        ],
        "nope",
        _env(),
    )
    assert rc == EXIT_UNREACHABLE, out
    assert f"wrong passphrase for {encrypted_key}" in " ".join(out.split()), out


@pytest.mark.parametrize("program", ["fab", "fleet"])
def test_prompt_for_passphrase_asks_only_for_the_encrypted_key_and_a_plain_key_logs_in_beside_it(
    lab, encrypted_key, program
):
    node = lab.node("lab01")
    plain = (
        f"  plain01:\n    address: 127.0.0.1\n    port: {node.port}\n    user: {lab.user}\n"
        f"    identity_file: {lab.client_key}\n    known_hosts: {lab.known_hosts}\n"
    )
    with inventory_host(lab, str(encrypted_key), plain):
        rc, out = fab_on_a_pty(
            lab.root,
            ["--prompt-for-passphrase", "-H", "enc01,plain01", "ping"],
            PASSPHRASE,
            _env(FLEETOPS_NO_LIVE="1"),
            program,
        )
    flat = " ".join(out.split())
    assert rc == 0, out
    assert "2 hosts: 2 ok, 0 changed, 0 failed, 0 unreachable" in flat, out
    assert flat.lower().count("passphrase for") == 1, out
    # `fleet` takes the flag from Fabric and asks per encrypted key; Fabric's own `fab` asks once,
    # as Fabric does (before any fleetops code runs), and fleetops offers that passphrase only to
    # the encrypted key.
    asked = (
        f"Passphrase for {encrypted_key}"
        if program == "fleet"
        else "Enter passphrase for use unlocking SSH keys"
    )
    assert asked in flat, out
    assert "Traceback" not in out and PASSPHRASE not in out, out
