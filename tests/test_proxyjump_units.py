"""ssh_config ProxyJump as fleetops builds it (wire/ssh.py), with nothing opened: a loop is refused
with a clear error (never a RecursionError), a jump host that is the target itself is refused, a
jump host on the target's HostName with another port is a real hop (never silently dropped),
`ProxyJump h1,h2` goes through h1 first as OpenSSH does, and every hop gets the strict host key
check. tests/test_proxyjump_lab.py connects through one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.plans.inventory import plain_host
from fleetops.wire import fabconfig, ssh
from fleetops.wire.connector import TransportError
from fleetops.wire.hostkeys import StrictClient


@pytest.fixture
def config(tmp_path: Path) -> Iterator[Path]:
    """An ssh_config file of the test's own, made the run's (fab -S); the process's previous choice
    is restored."""
    saved = (fabconfig._CONFIG, fabconfig._SSH_CONFIG_PATH, fabconfig._PLAIN_KEYS)
    path = tmp_path / "ssh_config"
    yield path
    fabconfig._CONFIG, fabconfig._SSH_CONFIG_PATH, fabconfig._PLAIN_KEYS = saved


def build(path: Path, text: str, target: str):  # a Fabric Connection
    path.write_text(text)
    ssh.use_ssh_config(str(path))
    return ssh._fabric_connection(plain_host(target), None)


def endpoint(cxn) -> tuple[str, int, str]:
    return cxn.host, int(cxn.port), cxn.user


def test_a_proxyjump_loop_is_refused_with_a_clear_error(config):
    text = (
        "Host alpha\n  HostName 127.0.0.1\n  Port 2201\n  ProxyJump beta\n"
        "Host beta\n  HostName 127.0.0.2\n  Port 2202\n  ProxyJump alpha\n"
    )
    with pytest.raises(TransportError) as err:
        build(config, text, "alpha")
    msg = str(err.value)
    assert err.value.kind == "refused" and "ProxyJump loop" in msg and "alpha" in msg, msg
    assert "127.0.0.1:2201 -> " in msg and "fix ProxyJump in ssh_config" in msg, msg


def test_a_wildcard_proxyjump_that_applies_to_the_jump_host_itself_is_refused(config):
    """`Host *` + ProxyJump bastion also matches bastion: OpenSSH stops with "jumphost loop"; so
    does fleetops."""
    text = "Host bastion\n  HostName 127.0.0.9\nHost *\n  ProxyJump bastion\n  User ops\n"
    with pytest.raises(TransportError) as err:
        build(config, text, "node7")
    assert "ProxyJump loop" in str(err.value) and "is itself" in str(err.value), str(err.value)


def test_a_jump_host_that_is_the_target_itself_is_refused(config):
    text = (
        "Host self\n  HostName 127.0.0.1\n  Port 2201\n  User ops\n  ProxyJump ops@127.0.0.1:2201\n"
    )
    with pytest.raises(TransportError) as err:
        build(config, text, "self")
    # ssh itself refuses it before any hop is built, and its own words are the error
    assert err.value.kind == "refused" and "jumphost loop via 127.0.0.1" in str(err.value), str(
        err.value
    )


def test_a_jump_host_on_the_targets_hostname_with_another_port_is_a_real_hop(config):
    text = (
        "Host t\n  HostName 127.0.0.1\n  Port 2201\n  User ops\n  ProxyJump jumper@127.0.0.1:2202\n"
    )
    cxn = build(config, text, "t")
    assert endpoint(cxn) == ("127.0.0.1", 2201, "ops")
    # not dropped: fleetops goes through it
    assert isinstance(cxn.gateway, ssh.Connection), cxn.gateway
    assert endpoint(cxn.gateway) == ("127.0.0.1", 2202, "jumper")
    assert not cxn.gateway.gateway


def test_a_chain_goes_through_the_first_hop_first_and_every_hop_is_strict(config):
    text = (
        "Host h1\n  HostName 127.0.0.11\nHost h2\n  HostName 127.0.0.12\n  Port 2212\n"
        "Host target\n  HostName 127.0.0.13\n  ProxyJump h1,u2@h2\n"
    )
    cxn = build(config, text, "target")
    hops = list(ssh._hops(cxn))
    assert [endpoint(h)[:2] for h in hops] == [
        ("127.0.0.13", 22),
        ("127.0.0.12", 2212),
        ("127.0.0.11", 22),
    ]
    assert hops[1].user == "u2"
    assert all(isinstance(h.client, StrictClient) for h in hops)
    assert [h.fleetops_name for h in hops] == ["target", "u2@h2", "h1"]


def test_the_first_hops_own_proxyjump_applies_and_none_ends_a_chain(config):
    text = (
        "Host outer\n  HostName 127.0.0.21\n  ProxyJump none\n"
        "Host inner\n  HostName 127.0.0.22\n  ProxyJump outer\n"
        "Host deep\n  HostName 127.0.0.23\n  ProxyJump inner\n"
    )
    cxn = build(config, text, "deep")
    assert [h.host for h in ssh._hops(cxn)] == ["127.0.0.23", "127.0.0.22", "127.0.0.21"]
    direct = build(config, text, "outer")
    assert not direct.gateway  # `ProxyJump none`: no jump, and not a host named "none"


def test_a_proxyjump_word_that_is_not_a_host_is_refused(config):
    with pytest.raises(TransportError) as err:
        build(config, "Host t\n  HostName 127.0.0.1\n  ProxyJump bad:port:x\n", "t")
    msg = str(err.value)
    assert err.value.kind == "refused" and 'line 3: Invalid ProxyJump "bad:port:x"' in msg, msg
