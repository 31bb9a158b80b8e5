"""Inventory and YAML, pure (no network, no lab).

Host syntax (`user@name:port`, globs, `@group`, `--limit` with `@group`/`!host`/globs), the YAML 1.1
traps a strict YAML 1.2 loader must not fall into (`022`, `no`, `yes`, `1:30`, dates), errors as one
line `file:line:column: message`, "did you mean" for hosts, groups and keys, and how the inventory
is chosen."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetops.plans.inventory import Inventory, UnknownHost, find_inventory, load_inventory
from fleetops.plans.playbook import load_playbook
from fleetops.plans.yamlsrc import ConfigError, load_text

FLEET = """\
defaults:
  user: ops
  address: 10.9.9.9
hosts:
  lab01:
    port: 2201
    groups: [lab, gpus]
  lab02:
    port: 2202
    groups: [lab]
  lab03:
    port: 2203
    groups: [lab, gpus]
  gpu01:
    port: 2204
    groups: [gpus]
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def inv(tmp_path: Path) -> Inventory:
    write(tmp_path / "hosts" / "fleet.yaml", FLEET)
    # An explicit empty alias set: the test must not depend on the machine's ~/.ssh/config.
    return load_inventory(tmp_path / "hosts", ssh_aliases=frozenset())


def names(hosts) -> list[str]:
    return [h.name for h in hosts]


# ---------------------------------------------------------------- -H host syntax
def test_user_and_port_override_an_inventory_host(inv):
    host = inv.expand(["root@lab01:2299"])[0]
    assert (host.name, host.user, host.port, host.address) == ("lab01", "root", 2299, "10.9.9.9")
    assert not host.plain  # still the inventory's key, known_hosts and python
    assert inv.resolve("admin@lab02").user == "admin" and inv.resolve("admin@lab02").port == 2202
    assert inv.resolve("lab03:22").port == 22 and inv.resolve("lab03:22").user == "ops"


def test_user_at_address_port_keeps_user_and_port(inv):
    host = inv.resolve("root@127.0.0.1:36587")
    assert (host.user, host.address, host.port, host.plain) == ("root", "127.0.0.1", 36587, True)
    v6 = inv.resolve("root@[::1]:2222")
    assert (v6.user, v6.address, v6.port) == ("root", "::1", 2222)
    with pytest.raises(UnknownHost, match="port 'x'"):
        inv.resolve("root@127.0.0.1:x")
    with pytest.raises(UnknownHost, match="port '70000'"):
        inv.resolve("127.0.0.1:70000")


def test_globs_and_groups_in_host_words(inv):
    assert names(inv.expand(["lab0*"])) == ["lab01", "lab02", "lab03"]
    assert names(inv.expand(["lab0[13]"])) == ["lab01", "lab03"]
    assert names(inv.expand(["@gpus"])) == ["lab01", "lab03", "gpu01"]
    # order given, each once
    assert names(inv.expand(["gpu01,lab0*"])) == ["gpu01", "lab01", "lab02", "lab03"]
    with pytest.raises(UnknownHost, match=r"no inventory host matches 'web\*'"):
        inv.expand(["web*"])


def test_unknown_host_and_group_say_did_you_mean(inv):
    with pytest.raises(
        UnknownHost, match=r"unknown host 'lab1'; known hosts: .*did you mean 'lab01'\?"
    ):
        inv.expand(["lab1"])
    with pytest.raises(UnknownHost, match=r"unknown group '@gpu'; did you mean '@gpus'\?"):
        inv.expand(["@gpu"])
    with pytest.raises(UnknownHost) as err:
        inv.expand(["zzzz"])
    assert "did you mean" not in str(err.value)  # nothing close: no guess


def test_ssh_aliases_passed_in_resolve_as_plain_hosts(tmp_path):
    write(tmp_path / "hosts" / "fleet.yaml", FLEET)
    inv = load_inventory(tmp_path / "hosts", ssh_aliases=frozenset({"labalias"}))
    host = inv.resolve("labalias")
    assert host.plain and host.address == "labalias" and host.user is None
    with pytest.raises(UnknownHost):
        load_inventory(tmp_path / "hosts", ssh_aliases=frozenset()).resolve("labalias")


# ---------------------------------------------------------------- --limit
@pytest.mark.parametrize(
    "expr,expected",
    [
        ("lab01", ["lab01"]),
        ("lab0*", ["lab01", "lab02", "lab03"]),
        ("@gpus", ["lab01", "lab03", "gpu01"]),
        ("!lab02", ["lab01", "lab03", "gpu01"]),
        ("@lab,!lab02", ["lab01", "lab03"]),
        ("@lab, !@gpus", ["lab02"]),
        ("!lab0*", ["gpu01"]),
        ("gpu01,lab02", ["lab02", "gpu01"]),  # the selection's order, not the expression's
        ("", ["lab01", "lab02", "lab03", "gpu01"]),
    ],
)
def test_limit_takes_groups_exclusions_and_globs(inv, expr, expected):
    selected = inv.expand(["lab0*", "gpu01"])
    assert names(inv.limit(selected, expr)) == expected


def test_limit_refuses_unknown_terms_and_empty_results(inv):
    selected = inv.expand(["@lab"])
    with pytest.raises(
        UnknownHost, match=r"--limit names unknown host 'lab3'; did you mean 'lab03'\?"
    ):
        inv.limit(selected, "lab3")
    with pytest.raises(UnknownHost, match=r"unknown group '@gpuz'; did you mean '@gpus'\?"):
        inv.limit(selected, "@gpuz")
    with pytest.raises(UnknownHost, match="matches none of the selected hosts"):
        inv.limit(selected, "gpu01")  # in the inventory, not selected
    with pytest.raises(UnknownHost, match="matches none"):
        inv.limit(selected, "!@lab")


# ---------------------------------------------------------------- YAML 1.1 traps
def test_yaml_is_1_2_no_octal_no_yes_no_booleans_no_sexagesimal():
    doc = load_text(
        "port: 022\ngroups: [lab, no, yes, on, off]\nt: 1:30\nd: 2026-01-01\n"
        "o: 0o17\nx: 0x1f\nb: [true, false, True]\nn: ~\nf: 1.5\n",
        "x.yaml",
    )
    assert doc["port"] == 22
    assert doc["groups"] == ["lab", "no", "yes", "on", "off"]
    assert doc["t"] == "1:30" and doc["d"] == "2026-01-01"
    assert (doc["o"], doc["x"], doc["b"], doc["n"], doc["f"]) == (
        15,
        31,
        [True, False, True],
        None,
        1.5,
    )


def test_inventory_port_022_is_22_and_no_is_a_group(tmp_path):
    write(
        tmp_path / "h.yaml",
        "hosts:\n  lab01:\n    address: 10.9.9.9\n    port: 022\n    groups: [lab, no]\n",
    )
    host = load_inventory(tmp_path, ssh_aliases=frozenset()).hosts["lab01"]
    assert host.port == 22 and host.groups == ("lab", "no")


def test_yes_where_a_boolean_is_needed_is_a_clear_error(tmp_path):
    write(tmp_path / "h.yaml", "hosts:\n  lab01:\n    address: 10.9.9.9\n    lab: yes\n")
    with pytest.raises(ConfigError) as err:
        load_inventory(tmp_path, ssh_aliases=frozenset())
    assert str(err.value) == (
        f"{tmp_path / 'h.yaml'}:4:5: 'lab' must be true or false, got 'yes' "
        "(yes/no/on/off are text in YAML 1.2)"
    )


# ---------------------------------------------------------------- file:line:column, one line
@pytest.mark.parametrize(
    "text,where",
    [
        ("a: 1\nb: [1, 2\nc: 3\n", "x.yaml:3:2:"),
        ("a:\n  b: 1\n c: 2\n", "x.yaml:3:2:"),
        ("a: b: c\n", "x.yaml:1:5:"),
        ('x: "abc\n', "x.yaml:2:1:"),
        ("\ta: 1\n", "x.yaml:1:1:"),
        ("a: 1\nb: 2\na: 3\n", "x.yaml:3:1: duplicate key 'a'"),
    ],
)
def test_yaml_errors_are_one_line_with_line_and_column(text, where):
    with pytest.raises(ConfigError) as err:
        load_text(text, "x.yaml")
    message = str(err.value)
    assert message.startswith(where), message
    assert "\n" not in message and "^" not in message  # PyYAML's drawn excerpt stays out


def test_unknown_keys_say_did_you_mean_with_column(tmp_path):
    write(tmp_path / "h.yaml", "hosts:\n  lab01:\n    address: 10.9.9.9\n    prot: 22\n")
    with pytest.raises(ConfigError) as err:
        load_inventory(tmp_path, ssh_aliases=frozenset())
    assert str(err.value).startswith(
        f"{tmp_path / 'h.yaml'}:4:5: unknown key 'prot' in host 'lab01'; "
        "did you mean 'port'? (allowed:"
    )
    write(tmp_path / "h.yaml", "hsots:\n  lab01:\n    address: 10.9.9.9\n")
    with pytest.raises(
        ConfigError, match=r"h.yaml:1:1: unknown key 'hsots' .*did you mean 'hosts'\?"
    ):
        load_inventory(tmp_path, ssh_aliases=frozenset())


def test_playbooks_load_with_the_same_strict_loader(tmp_path):
    write(tmp_path / "pb.yaml", "name: pb\nrequires: [speculators==0.3.0]\nverfy: []\n")
    with pytest.raises(
        ConfigError, match=r"pb.yaml:3:1: unknown key 'verfy' in playbook; did you mean 'verify'\?"
    ):
        load_playbook(tmp_path / "pb.yaml")


# ---------------------------------------------------------------- which inventory
def test_find_inventory_override_env_default(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    write(root / "hosts" / "a.yaml", FLEET)
    other = write(tmp_path / "elsewhere" / "staging.yaml", FLEET.replace("lab01", "stg01"))
    monkeypatch.chdir(tmp_path)
    assert find_inventory(root, None, environ={}) == (root / "hosts").resolve()
    # from the cwd
    assert find_inventory(root, "elsewhere/staging.yaml", environ={}) == other.resolve()
    # root
    assert find_inventory(root, "hosts/a.yaml", environ={}) == (root / "hosts" / "a.yaml").resolve()
    assert find_inventory(root, None, environ={"FLEETOPS_INVENTORY": str(other)}) == other.resolve()
    assert (
        find_inventory(root, str(root / "hosts"), environ={"FLEETOPS_INVENTORY": str(other)})
        == (root / "hosts").resolve()
    )  # the flag beats the environment
    with pytest.raises(ConfigError, match="inventory named by --inventory not found"):
        find_inventory(root, "nope.yaml", environ={})
    with pytest.raises(ConfigError, match="inventory named by FLEETOPS_INVENTORY not found"):
        find_inventory(root, None, environ={"FLEETOPS_INVENTORY": "nope"})
    # One file is an inventory of its own.
    assert names(load_inventory(other, ssh_aliases=frozenset()).expand(["stg01"])) == ["stg01"]


# ---------------------------------------------------------------- ssh_config text (Include spliced
# in)
def test_ssh_config_include_is_spliced_relative_to_dot_ssh_and_block_restored(
    tmp_path, monkeypatch
):
    from fleetops.plans import sshconfig

    monkeypatch.setenv("HOME", str(tmp_path))
    ssh = tmp_path / ".ssh"
    write(ssh / "config", "Host outer\n  Port 1\n  Include conf.d/*.conf\n  User after\n")
    write(ssh / "conf.d" / "b.conf", "Host inner-b\n  Port 3\n")
    write(ssh / "conf.d" / "a.conf", "Match host inner-a,inner-a2 user root\n  Port 2\n")
    text, files = sshconfig.config_text(None, environ={})
    assert files[:3] == [
        str(ssh / "config"),
        str(ssh / "conf.d" / "a.conf"),
        str(ssh / "conf.d" / "b.conf"),
    ]
    lines = [line.strip() for line in text.splitlines()]
    # After the included blocks, `User after` is back under `Host outer`, as ssh reads it.
    assert lines.index("User after") == lines.index("Host outer", lines.index("Port 3")) + 1
    assert {"outer", "inner-a", "inner-a2", "inner-b"} <= sshconfig.host_aliases(text)


def test_ssh_config_named_file_is_read_alone_and_aliases_skip_patterns(tmp_path, monkeypatch):
    from fleetops.plans import sshconfig

    monkeypatch.setenv("HOME", str(tmp_path))
    write(tmp_path / ".ssh" / "config", "Host from-home\n")
    inc = write(tmp_path / "inc.conf", "Host a b*.lab !c ?d\n")
    named = write(tmp_path / "named.conf", f"Include {inc}\n# Host commented\nHost=eq-alias\n")
    text, files = sshconfig.config_text(str(named), environ={})
    assert files == [str(named), str(inc)]
    assert sshconfig.host_aliases(text) == {"a", "eq-alias"}
    assert sshconfig.config_text(None, environ={"FLEETOPS_SSH_CONFIG": str(named)})[1] == files
    with pytest.raises(ConfigError, match="ssh_config file not found"):
        sshconfig.config_text(str(tmp_path / "nope.conf"), environ={})
    loop = write(tmp_path / "loop.conf", f"Include {tmp_path / 'loop.conf'}\n")
    with pytest.raises(ConfigError, match="nested deeper than 16"):
        sshconfig.config_text(str(loop), environ={})


def test_inventory_falls_back_to_ssh_config_aliases(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("FLEETOPS_SSH_CONFIG", raising=False)
    write(tmp_path / ".ssh" / "config", "Include more.conf\n")
    write(tmp_path / ".ssh" / "more.conf", "Host homealias\n  HostName 10.9.9.9\n")
    write(tmp_path / "hosts" / "fleet.yaml", FLEET)
    inv = load_inventory(tmp_path / "hosts")  # no alias set passed: read from the files ssh reads
    assert inv.resolve("homealias").plain
