"""An inventory `jump:` is reached with the inventory's keys: `user@host:port` and `jump:` as a
mapping take the naming host's identity_file and known_hosts (as written in its file, not a -i of
the command line) unless the mapping names its own; an inventory name keeps that host's settings; an
ssh_config alias keeps ssh_config's. A -H word that is such a jump resolves to the same keyed host,
so `trust` writes the inventory's known_hosts. Nothing is opened here; tests/test_jump_keys_lab.py
connects through one."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetops.plans.inventory import CommandLine, UnknownHost, load_inventory
from fleetops.plans.yamlsrc import ConfigError
from fleetops.wire.hops import jump_of

KEY, KNOWN = "/keys/fleet_ed25519", "/keys/fleet_known_hosts"


def inventory(tmp_path: Path, jump: str, aliases: frozenset[str] = frozenset()):
    (tmp_path / "hosts.yaml").write_text(
        f"defaults:\n  identity_file: {KEY}\n  known_hosts: {KNOWN}\n"
        f"hosts:\n  gpu01:\n    address: 10.9.0.1\n    user: ops\n    jump: {jump}\n"
        "  bastion:\n    address: 10.9.0.254\n    user: jumper\n    identity_file: /keys/bastion\n"
    )
    return load_inventory(tmp_path / "hosts.yaml", ssh_aliases=aliases)


def test_a_user_host_port_jump_takes_the_inventorys_identity_file_and_known_hosts(tmp_path):
    inv = inventory(tmp_path, "root@127.0.0.1:2222")
    jump = jump_of(inv.hosts["gpu01"], inv)
    assert (jump.plain, jump.address, jump.port, jump.user) == (False, "127.0.0.1", 2222, "root")
    assert (jump.identity_file, jump.known_hosts) == (KEY, KNOWN)
    # -H naming that jump word (the trust hint's command) is the same host, with the same keys
    named = inv.resolve("root@127.0.0.1:2222")
    assert (named.plain, named.identity_file, named.known_hosts) == (False, KEY, KNOWN)
    # another address: ssh_config decides, as before
    assert inv.resolve("root@127.0.0.1:2223").plain


def test_a_jump_mapping_takes_the_same_keys_as_a_host(tmp_path):
    inv = inventory(
        tmp_path, "{address: 127.0.0.1, port: 2222, user: root, known_hosts: /keys/jump_known}"
    )
    gpu = inv.hosts["gpu01"]
    assert gpu.jump == "root@127.0.0.1:2222"  # what ssh-config output and messages show
    jump = jump_of(gpu, inv)
    assert (jump.address, jump.port, jump.user, jump.plain) == ("127.0.0.1", 2222, "root", False)
    # its own wins, else the file's
    assert (jump.identity_file, jump.known_hosts) == (KEY, "/keys/jump_known")
    assert inv.resolve("root@127.0.0.1:2222").known_hosts == "/keys/jump_known"
    inv = inventory(tmp_path, "{address: 127.0.0.1, identity_file: /keys/other}")
    jump = jump_of(inv.hosts["gpu01"], inv)
    assert (jump.name, jump.port, jump.user, jump.identity_file) == (
        "127.0.0.1",
        22,
        None,
        "/keys/other",
    )


def test_an_inventory_name_keeps_that_hosts_own_settings(tmp_path):
    inv = inventory(tmp_path, "bastion")
    jump = jump_of(inv.hosts["gpu01"], inv)
    assert (jump.name, jump.user, jump.identity_file) == ("bastion", "jumper", "/keys/bastion")


def test_a_command_line_key_is_for_the_hosts_never_the_jump(tmp_path):
    inv = inventory(tmp_path, "root@127.0.0.1:2222")
    inv.command_line = CommandLine(identity_files=("/keys/typed",))
    (gpu,) = inv.expand(["gpu01"])
    assert gpu.identity_file == "/keys/typed" and jump_of(gpu, inv).identity_file == KEY


def test_an_ssh_config_alias_keeps_ssh_configs_settings(tmp_path):
    inv = inventory(tmp_path, "root@bastion.example:2222", aliases=frozenset({"bastion.example"}))
    assert jump_of(inv.hosts["gpu01"], inv).plain


def test_a_bad_jump_is_refused_at_its_line(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"hosts.yaml:8:.*unknown key 'identity' in 'jump'; did you mean "
        r"'identity_file'\?",
    ):
        inventory(tmp_path, "{address: 127.0.0.1, identity: /keys/x}")
    with pytest.raises(ConfigError, match="missing required key 'address'"):
        inventory(tmp_path, "{port: 2222}")
    inv = inventory(tmp_path, "bastoin")
    with pytest.raises(UnknownHost, match="did you mean 'bastion'"):
        jump_of(inv.hosts["gpu01"], inv)


@pytest.mark.parametrize(
    "jump",
    [
        "root@127.0.0.1:2222",
        "{address: 127.0.0.1, port: 2222, user: root, "
        "identity_file: /keys/jump_key, known_hosts: /keys/jump_known}",
    ],
)
def test_ssh_config_reaches_the_jump_with_the_keys_fleetops_uses(tmp_path, jump):
    import paramiko

    from fleetops.plans.sshconfig_out import render

    inv = inventory(tmp_path, jump)
    config = paramiko.SSHConfig.from_text(render(inv))
    hop = config.lookup(config.lookup("gpu01")["proxyjump"])
    want = jump_of(inv.hosts["gpu01"], inv)
    assert (hop["hostname"], int(hop["port"]), hop["user"]) == (want.address, want.port, want.user)
    assert (hop["identityfile"], hop["userknownhostsfile"]) == (
        [want.identity_file],
        want.known_hosts,
    )
    assert hop["identitiesonly"] == "yes" and hop["stricthostkeychecking"] == "yes"


def test_ssh_config_leaves_an_inventory_name_or_an_ssh_config_alias_as_named(tmp_path):
    from fleetops.plans.sshconfig_out import render

    assert "    ProxyJump bastion\n" in render(inventory(tmp_path, "bastion"))
    text = render(
        inventory(tmp_path, "root@bastion.example:2222", aliases=frozenset({"bastion.example"}))
    )
    assert "    ProxyJump root@bastion.example:2222\n" in text and text.count("Host ") == 2
