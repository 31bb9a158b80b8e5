"""An encrypted identity file over the OpenSSH transport against real lab sshd: its passphrase
reaches the master's `ssh` through askpass and its environment alone, never any process's argv
(read from /proc while the login runs, as other users of the machine could); a wrong one is named
before sshd sees a connection."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ssh_masters
from faultkit import sshd_log, sshd_log_size
from prockit import ArgvWatch, control_dir
from test_ssh_keys_lab import PASSPHRASE, inventory_host

from fleetops.plans.inventory import load_inventory
from fleetops.wire import opensshkeys
from fleetops.wire.connector import TransportError
from fleetops.wire.openssh import OpenSSHConnection

pytestmark = pytest.mark.lab

VARIABLE = "FO_T_OPENSSH_KEY_PASS"
FROM_ENV = f"    identity_passphrase: {{secret_from_env: {VARIABLE}}}\n"


@pytest.fixture
def cm(monkeypatch) -> Iterator[str]:
    yield from control_dir(monkeypatch, "fo-k-")


@pytest.fixture
def encrypted_key(lab, tmp_path) -> Path:
    key = tmp_path / "enc_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-C", "enc", "-f", str(key)],
        check=True,
    )
    return key


def test_the_passphrase_reaches_ssh_through_its_environment_and_never_an_argv(
    lab, cm, encrypted_key, monkeypatch
):
    monkeypatch.setenv(VARIABLE, PASSPHRASE)
    with inventory_host(lab, str(encrypted_key), FROM_ENV):
        inventory = load_inventory(lab.root / "hosts")
        node = OpenSSHConnection(inventory.resolve("enc01"), inventory)
        watch = ArgvWatch(PASSPHRASE.encode(), str(encrypted_key).encode())
        watch.start()
        try:
            answer, _ = node.call("ping", {})
            master = list(ssh_masters(cm))
        finally:
            watch.stop.set()
            watch.join()
            node.close()
    assert answer, answer
    assert watch.master_seen and watch.rounds > 1, "the master's login was never seen"
    assert watch.holding == [], watch.holding
    # the master's own environment carries it (readable by this user only), this process's not
    assert master, "no master"
    assert any(
        f"{opensshkeys.SECRET_ENV}={PASSPHRASE}".encode()
        in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        for pid in master
    )
    assert opensshkeys.SECRET_ENV not in os.environ
    # the askpass program holds no secret either
    assert PASSPHRASE not in (Path(cm) / "askpass").read_text()


def test_a_wrong_passphrase_is_named_before_sshd_sees_a_connection(
    lab, cm, encrypted_key, monkeypatch
):
    monkeypatch.setenv(VARIABLE, "not the passphrase")
    node01 = lab.node("lab01")
    with inventory_host(lab, str(encrypted_key), FROM_ENV):
        inventory = load_inventory(lab.root / "hosts")
        node = OpenSSHConnection(inventory.resolve("enc01"), inventory)
        since = sshd_log_size(node01)
        try:
            with pytest.raises(TransportError) as caught:
                node.call("ping", {})
        finally:
            node.close()
    assert caught.value.kind == "auth"
    assert f"wrong passphrase for {encrypted_key}" in str(caught.value)
    assert "Connection from 127.0.0.1" not in sshd_log(node01, since), sshd_log(node01, since)
    assert not ssh_masters(cm)
