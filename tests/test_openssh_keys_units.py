"""The OpenSSH transport's identity files without paramiko: whether a key made by the real
ssh-keygen is encrypted, in each format it writes (openssh-key-v1, PEM, PKCS#8), and its public key
read without decrypting it; the askpass program made 0700 in the control directory and refused
when it is anything else; a passphrase checked with the real `ssh-keygen -y` through that program, a
wrong one named before any connection; the master's command line asking once, batch mode off."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.wire import controldir, keyfile, opensshkeys
from fleetops.wire.connector import TransportError
from fleetops.wire.controldir import ControlDirError

PASSPHRASE = 'it\'s a "quoted" $HOME pass'


def _keygen(path: Path, kind: str, passphrase: str, form: str | None = None) -> Path:
    argv = ["ssh-keygen", "-q", "-t", kind, "-N", passphrase, "-C", "t", "-f", str(path)]
    if kind == "rsa":
        argv += ["-b", "1024"]  # the smallest ssh-keygen makes: the format is what is tested
    if form:
        argv += ["-m", form]
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
    return path


@pytest.mark.parametrize(
    ("kind", "form"),
    [("ed25519", None), ("ecdsa", None), ("rsa", "PEM"), ("ecdsa", "PEM"), ("rsa", "PKCS8")],
)
def test_a_key_from_ssh_keygen_is_read_as_encrypted_only_with_a_passphrase(tmp_path, kind, form):
    plain = _keygen(tmp_path / "plain", kind, "", form)
    locked = _keygen(tmp_path / "locked", kind, PASSPHRASE, form)
    assert keyfile.encrypted(str(plain)) is False
    assert keyfile.encrypted(str(locked)) is True


def test_what_is_no_key_is_not_said_to_be_encrypted_or_not(tmp_path):
    (tmp_path / "text").write_text("hello\n")
    (tmp_path / "cut").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEA\n")
    (tmp_path / "junk").write_text(
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEA\n"
        "-----END OPENSSH PRIVATE KEY-----\n"
    )
    for name in ("text", "cut", "junk", "missing"):
        assert keyfile.encrypted(str(tmp_path / name)) is None, name


def _pub_blob(path: Path) -> bytes:
    return base64.b64decode(Path(f"{path}.pub").read_text().split()[1])


def test_the_public_key_comes_from_the_pub_file_else_the_encrypted_files_clear_header(tmp_path):
    key = _keygen(tmp_path / "k", "ed25519", PASSPHRASE)
    blob = _pub_blob(key)
    assert keyfile.public_blob(str(key)) == blob
    os.unlink(f"{key}.pub")
    assert keyfile.public_blob(str(key)) == blob  # read from the header, never decrypted
    pem = _keygen(tmp_path / "pem", "rsa", PASSPHRASE, "PEM")
    os.unlink(f"{pem}.pub")
    assert keyfile.public_blob(str(pem)) is None  # PEM keeps none in the clear


@pytest.fixture
def control() -> Iterator[str]:
    """A control directory of the test's own (pytest's tmp_path is too long for a socket's)."""
    path = tempfile.mkdtemp(prefix="cm", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_askpass_program_is_made_0700_and_prints_only_its_variable(control):
    script = controldir.askpass_script(control, "FO_TEST_SECRET")
    assert os.stat(script).st_mode & 0o777 == 0o700
    assert controldir.askpass_script(control, "FO_TEST_SECRET") == script  # found as made
    done = subprocess.run(
        [script, "Enter passphrase"],
        env={"FO_TEST_SECRET": PASSPHRASE, "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == PASSPHRASE + "\n"
    assert PASSPHRASE not in Path(script).read_text()


@pytest.mark.parametrize("how", ["text", "mode", "symlink"])
def test_an_askpass_program_that_is_not_fleetops_own_is_refused(control, tmp_path, how):
    path = Path(control) / controldir.ASKPASS_NAME
    if how == "symlink":
        target = tmp_path / "elsewhere"
        target.write_bytes(controldir.askpass_text("FO_TEST_SECRET"))
        target.chmod(0o700)
        path.symlink_to(target)
    else:
        path.write_bytes(
            b"#!/bin/sh\necho stolen\n"
            if how == "text"
            else controldir.askpass_text("FO_TEST_SECRET")
        )
        path.chmod(0o700 if how == "text" else 0o755)
    with pytest.raises(ControlDirError, match="not fleetops' askpass|Too many levels|symbolic"):
        controldir.askpass_script(control, "FO_TEST_SECRET")


@pytest.fixture
def own_control(control, monkeypatch) -> str:
    monkeypatch.setenv(controldir.CONTROL_DIR_ENV, control)
    return control


def test_a_right_passphrase_is_handed_over_through_askpass_and_never_in_argv(own_control, tmp_path):
    key = _keygen(tmp_path / "k", "ed25519", PASSPHRASE)
    login = opensshkeys.asking("enc01", str(key), PASSPHRASE)
    assert login.env is not None and login.env[opensshkeys.SECRET_ENV] == PASSPHRASE
    assert login.env["SSH_ASKPASS_REQUIRE"] == "force"
    assert login.env["SSH_ASKPASS"] == os.path.join(own_control, controldir.ASKPASS_NAME)
    argv = login.argv(["ssh", "-o", "BatchMode=yes", "-o", "ControlMaster=yes", "--", "node"])
    assert argv[-2:] == ["--", "node"] and "BatchMode=yes" not in argv
    assert {"BatchMode=no", "NumberOfPasswordPrompts=1", "PasswordAuthentication=no"} <= set(argv)
    assert "KbdInteractiveAuthentication=no" in argv
    assert not any(PASSPHRASE in word for word in argv)
    batch = ["ssh", "-o", "BatchMode=yes", "--", "node"]
    assert opensshkeys.BATCH.argv(batch) == batch


def test_a_wrong_passphrase_is_named_by_ssh_keygen_before_any_connection(own_control, tmp_path):
    key = _keygen(tmp_path / "k", "ed25519", PASSPHRASE)
    with pytest.raises(TransportError) as caught:
        opensshkeys.asking("enc01", str(key), "not it")
    assert caught.value.kind == "auth"
    assert f"enc01: wrong passphrase for {key}" in str(caught.value)
    assert "not it" not in str(caught.value)


def test_a_file_that_is_no_key_is_named_as_unreadable(own_control, tmp_path):
    junk = tmp_path / "junk"
    junk.write_text("no key\n")
    with pytest.raises(TransportError, match=f"cannot read the private key {junk}"):
        opensshkeys.asking("enc01", str(junk), PASSPHRASE)


def test_an_openssh_older_than_8_4_is_refused_by_name():
    refused = opensshkeys.version_refusal("enc01", "/k", (8, 2))
    assert refused is not None and refused.kind == "refused"
    assert "OpenSSH 8.4 or later" in str(refused) and "this is 8.2" in str(refused)
    assert "an unknown version" in str(opensshkeys.version_refusal("enc01", "/k", None))
    assert opensshkeys.version_refusal("enc01", "/k", (8, 4)) is None
    assert opensshkeys.version_refusal("enc01", "/k", (10, 0)) is None


def test_the_installed_ssh_says_its_version():
    said = subprocess.run(["ssh", "-V"], capture_output=True, text=True, check=True).stderr
    found = opensshkeys.ssh_version()
    assert found is not None and said.startswith(f"OpenSSH_{found[0]}.{found[1]}")


def test_the_agent_is_asked_with_ssh_add(tmp_path, monkeypatch):
    key = _keygen(tmp_path / "k", "ed25519", PASSPHRASE)
    other = _keygen(tmp_path / "o", "ed25519", "")
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            if sock.exists():
                break
            subprocess.run(["sleep", "0.05"], check=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        subprocess.run(["ssh-add", "-q", str(other)], check=True, stdin=subprocess.DEVNULL)
        assert opensshkeys.agent_holds(str(other))
        assert not opensshkeys.agent_holds(str(key))
        monkeypatch.delenv("SSH_AUTH_SOCK")
        assert not opensshkeys.agent_holds(str(other))
    finally:
        agent.kill()
        agent.wait()


def test_only_an_encrypted_key_outside_the_agent_without_a_passphrase_is_asked_for(tmp_path):
    """--prompt-for-passphrase's keys, ssh-agent asked through ssh-add (no paramiko): a key given
    its identity_passphrase, a key that is not encrypted, a key that is missing and one the agent
    holds are not asked for; an encrypted one shared by two hosts is asked for once, for both."""
    from fleetops.plans.host import Host

    locked = _keygen(tmp_path / "locked", "ed25519", PASSPHRASE)
    held = _keygen(tmp_path / "held", "ed25519", PASSPHRASE)
    plain = _keygen(tmp_path / "plain", "ed25519", "")
    hosts = [
        Host("a", "10.0.0.1", identity_file=str(locked)),
        Host("b", "10.0.0.2", identity_file=str(locked)),
        Host("c", "10.0.0.3", identity_file=str(locked), passphrase=PASSPHRASE),
        Host("d", "10.0.0.4", identity_file=str(plain)),
        Host("e", "10.0.0.5", identity_file=str(tmp_path / "gone")),
        Host("f", "10.0.0.6", identity_file=str(held)),
        Host("g", "10.0.0.7"),
    ]
    asked = opensshkeys.keys_to_ask(hosts, holds=lambda path: path == str(held))
    assert asked == {os.path.realpath(locked): ["a", "b"]}
    assert str(held) in opensshkeys.keys_to_ask(hosts, holds=lambda path: False)
