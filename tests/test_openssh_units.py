"""The OpenSSH transport's pure parts: the inventory's `transport:` and `persist:` (errors at
file:line), which transport a host gets, ssh's command line for a host (a list; strict host keys,
the inventory's key only, batch mode, a jump host as `ssh -W` with its own key and known_hosts) and
the identity a master is keyed on."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from fleetops.plans.inventory import load_inventory
from fleetops.plans.yamlsrc import ConfigError
from fleetops.wire import transports
from fleetops.wire.connector import TransportError
from fleetops.wire.sshcmd import base_options, identity_digest, persist_of

HOSTS = """\
defaults:
  user: ops
  transport: openssh
  persist: 120
hosts:
  gpu01:
    address: 10.0.0.1
    identity_file: /keys/id_gpu
    known_hosts: /keys/known
  gpu02:
    address: 10.0.0.2
    transport: paramiko
    persist: 0
    jump:
      address: bastion.example
      user: jumper
      identity_file: /keys/id_jump
      known_hosts: /keys/known_jump
"""


@pytest.fixture
def inv(tmp_path: Path):
    (tmp_path / "hosts.yaml").write_text(HOSTS)
    return load_inventory(tmp_path / "hosts.yaml")


def test_transport_and_persist_come_from_defaults_or_the_host(inv):
    assert inv.hosts["gpu01"].transport == "openssh" and inv.hosts["gpu01"].persist == 120
    assert inv.hosts["gpu02"].transport == "paramiko" and persist_of(inv.hosts["gpu02"]) == 0


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("transport: ssh", "'openssh' (the system ssh) or 'paramiko'"),
        ("persist: 3601", "between 0 and 3600"),
        ("persist: yes", "between 0 and 3600"),
    ],
)
def test_a_bad_transport_or_persist_is_refused_at_its_line(tmp_path: Path, line: str, said: str):
    path = tmp_path / "hosts.yaml"
    path.write_text(f"hosts:\n  gpu01:\n    address: 10.0.0.1\n    {line}\n")
    with pytest.raises(ConfigError) as err:
        load_inventory(path)
    assert f"{path}:4" in str(err.value) and said in str(err.value), str(err.value)


def test_the_command_line_then_the_environment_then_the_inventory_choose(inv, monkeypatch):
    monkeypatch.delenv(transports.TRANSPORT_ENV, raising=False)
    gpu01, gpu02 = inv.hosts["gpu01"], inv.hosts["gpu02"]
    assert (transports.chosen(gpu01), transports.chosen(gpu02)) == ("openssh", "paramiko")
    monkeypatch.setenv(transports.TRANSPORT_ENV, "paramiko")
    assert transports.chosen(gpu01) == "paramiko"
    assert transports.chosen(gpu01, "openssh") == "openssh"
    monkeypatch.setenv(transports.TRANSPORT_ENV, "telnet")
    with pytest.raises(
        TransportError, match="FLEETOPS_TRANSPORT: transport 'telnet' is not one of"
    ):
        transports.chosen(gpu01)


def test_sshs_command_line_for_an_inventory_host(inv, tmp_path):
    argv = base_options(inv.hosts["gpu01"], inv, str(tmp_path / "%C"))
    assert argv[-2:] == ["--", "10.0.0.1"]
    options = " ".join(argv)
    for part in (
        "BatchMode=yes",
        "StrictHostKeyChecking=yes",
        "UserKnownHostsFile=/keys/known",
        "-i /keys/id_gpu -o IdentitiesOnly=yes",
        f"ControlPath={tmp_path}/%C",
        "-l ops -p 22",
    ):
        assert part in options, (part, argv)


def test_a_jump_host_is_an_ssh_w_with_its_own_key_and_known_hosts(inv):
    argv = base_options(inv.hosts["gpu02"], inv, "/cm/%C")
    proxy = next(w for w in argv if w.startswith("ProxyCommand="))[len("ProxyCommand=") :]
    words = shlex.split(proxy)
    assert words[-4:] == ["-W", "%h:%p", "--", "bastion.example"], words
    joined = " ".join(words)
    assert (
        "-i /keys/id_jump -o IdentitiesOnly=yes" in joined
        and "UserKnownHostsFile=/keys/known_jump" in joined
    )
    # the hop lives inside the target's master
    assert "-l jumper" in joined and "ControlPath" not in joined


def test_a_master_is_keyed_on_the_key_and_known_hosts_too(inv, tmp_path):
    host = inv.hosts["gpu01"]
    same = identity_digest(base_options(host, inv, "/a/%C")) == identity_digest(
        base_options(host, inv, "/b/%C")
    )
    assert same  # where the socket lives is not who logs in
    other_key = identity_digest(
        base_options(
            host.__class__(**{**host.__dict__, "identity_file": "/keys/other"}), inv, "/a/%C"
        )
    )
    other_known = identity_digest(
        base_options(host.__class__(**{**host.__dict__, "known_hosts": "/keys/k2"}), inv, "/a/%C")
    )
    mine = identity_digest(base_options(host, inv, "/a/%C"))
    assert len({mine, other_key, other_known}) == 3


def test_the_cap_on_masters_comes_from_defaults_and_the_environment_wins(
    tmp_path: Path, monkeypatch
):
    from fleetops.wire.openssh import DEFAULT_MAX_MASTERS, MAX_MASTERS_ENV, max_masters

    monkeypatch.delenv(MAX_MASTERS_ENV, raising=False)
    path = tmp_path / "hosts.yaml"
    path.write_text("defaults:\n  max_masters: 3\nhosts:\n  gpu01:\n    address: 10.0.0.1\n")
    host = load_inventory(path).hosts["gpu01"]
    assert max_masters(host) == 3
    monkeypatch.setenv(MAX_MASTERS_ENV, "7")
    assert max_masters(host) == 7
    path.write_text("hosts:\n  gpu01:\n    address: 10.0.0.1\n")
    monkeypatch.delenv(MAX_MASTERS_ENV)
    assert max_masters(load_inventory(path).hosts["gpu01"]) == DEFAULT_MAX_MASTERS


@pytest.mark.parametrize(
    ("text", "at", "said"),
    [
        (
            "defaults:\n  max_masters: 0\nhosts:\n  gpu01:\n    address: 10.0.0.1\n",
            2,
            "between 1 and",
        ),
        (
            "defaults:\n  max_masters: many\nhosts:\n  gpu01:\n    address: 10.0.0.1\n",
            2,
            "between 1 and",
        ),
        (
            "hosts:\n  gpu01:\n    address: 10.0.0.1\n    max_masters: 4\n",
            4,
            "put it under defaults",
        ),
    ],
)
def test_a_bad_cap_on_masters_is_refused_at_its_line(tmp_path: Path, text: str, at: int, said: str):
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_inventory(path)
    assert f"{path}:{at}" in str(err.value) and said in str(err.value), str(err.value)


def test_a_jump_hosts_hop_asks_for_its_own_passphrase_from_the_environment(inv):
    """A jump host whose key needs a passphrase: its hop (the ProxyCommand's ssh) leaves batch mode
    and gets the passphrase as SECRET_ENV, which the askpass program prints, from JUMP_SECRET_ENV
    in its shell's environment; the target's own login is left as it was."""
    import subprocess

    from fleetops.wire.opensshkeys import HOP_SCRIPT, JUMP_SECRET_ENV, SECRET_ENV, asking_hop

    argv = base_options(inv.hosts["gpu02"], inv, "/cm/%C")
    asked = asking_hop(argv)
    proxy = next(w for w in asked if w.startswith("ProxyCommand="))[len("ProxyCommand=") :]
    words = shlex.split(proxy)
    assert words[:4] == ["sh", "-c", HOP_SCRIPT, "sh"], words
    hop = words[4:]
    assert hop[-2:] == ["--", "bastion.example"] and "-W %h:%p" in " ".join(hop), hop
    assert "BatchMode=no" in hop and "BatchMode=yes" not in hop
    assert "NumberOfPasswordPrompts=1" in hop and "PasswordAuthentication=no" in hop
    # the target's words are untouched
    assert [w for w in asked if not w.startswith("ProxyCommand=")] == [
        w for w in argv if not w.startswith("ProxyCommand=")
    ]
    # what the hop's shell hands its command: the jump's passphrase under the askpass variable
    done = subprocess.run(
        ["sh", "-c", HOP_SCRIPT, "sh", "printenv", SECRET_ENV],
        env={"PATH": "/usr/bin:/bin", SECRET_ENV: "the target's", JUMP_SECRET_ENV: "the jump's"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == "the jump's\n"
    assert asking_hop(base_options(inv.hosts["gpu01"], inv, "/cm/%C")) == base_options(
        inv.hosts["gpu01"], inv, "/cm/%C"
    )  # no jump: nothing to change
