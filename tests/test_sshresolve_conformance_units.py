"""What fleetops connects with agrees with OpenSSH, field by field, on generated ssh_config files.

A seeded generator writes ssh_config files made of the constructs where a second reader of
ssh_config goes wrong: `Include` inside a Host or Match block that does not match, host names in
another case, `Match final`, `HostName %h...` before a `Match host`, `%%` and `%p %n %L %r` in
IdentityFile, ProxyJump and ProxyCommand in either order, `ProxyJump none`, `user@host` and `:port`
in the -H word seen by `Match user` and `%r`. For each host word, the Connection fleetops builds
(nothing opened) must have the HostName, User, Port, IdentityFile list, ProxyJump hops and
ProxyCommand that `ssh -G` gives for the same word typed on ssh's own command line (`ssh -G -F FILE
-p PORT user@host`). `ssh -G` reads files only: no generated file is ever used to connect. The same
files go through the `ssh -G` store (wire/sshgcache.py): its answer, a miss, a hit, and again
after a file changed (a digit, so the size stays), must be what a fresh `ssh -G` prints.

FLEETOPS_SSHCONF_CONFIGS sets how many files; by default the hypothesis profile decides, as for the
other generated tests: 300 under CI (every construct appears in many combinations), 60 for a
developer's fast tier."""

from __future__ import annotations

import getpass
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from fleetops.plans.inventory import plain_host
from fleetops.wire import fabconfig, ssh, sshcmd, sshgcache
from fleetops.wire.connector import TransportError

SEED = 20261207
CONFIGS = int(
    os.environ.get("FLEETOPS_SSHCONF_CONFIGS")
    or (300 if settings.default.max_examples >= 300 else 60)
)
SSH = shutil.which("ssh")
NAMES = ["web1", "Web2", "db1", "DB2", "gpu-a", "edge"]
USERS = ["ops", "root", "deploy"]
DEFAULT_KEYS = [
    "~/.ssh/id_rsa",
    "~/.ssh/id_ecdsa",
    "~/.ssh/id_ecdsa_sk",
    "~/.ssh/id_ed25519",
    "~/.ssh/id_ed25519_sk",
    "~/.ssh/id_xmss",
    "~/.ssh/id_dsa",
]

pytestmark = pytest.mark.skipif(SSH is None, reason="needs OpenSSH's client (`ssh -G`)")


@pytest.fixture
def saved_config() -> Iterator[None]:
    saved = (fabconfig._CONFIG, fabconfig._SSH_CONFIG_PATH, fabconfig._PLAIN_KEYS)
    yield
    fabconfig._CONFIG, fabconfig._SSH_CONFIG_PATH, fabconfig._PLAIN_KEYS = saved
    fabconfig._RESOLVED.clear()


def _pattern(rng: random.Random) -> str:
    name = rng.choice(NAMES)
    return rng.choice(
        [name, name.upper(), name.lower(), name[:2] + "*", "*", "!" + name.lower(), "*1", "???"]
    )


def _directives(rng: random.Random, depth: int, files: list[str], where: Path) -> list[str]:
    out: list[str] = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(
            ["hostname", "user", "port", "identity", "identity", "jump", "command", "include"]
        )
        if kind == "hostname":
            out.append(
                rng.choice(
                    [
                        "HostName %h.lan",
                        "HostName 10.9.0.%d" % rng.randint(1, 9),
                        "HostName Real-%h",
                        "HostName %%h-literal",
                    ]
                )
            )
        elif kind == "user":
            out.append(f"User {rng.choice(USERS)}")
        elif kind == "port":
            out.append(f"Port {rng.choice([22, 2200, 2222, 8022])}")
        elif kind == "identity":
            out.append(
                "IdentityFile "
                + rng.choice(
                    [
                        "~/.ssh/%h_%r",
                        "~/keys/%%h-literal",
                        "/k/%p-%n",
                        "/k/%L/%u",
                        "/k/id-%r@%h:%p",
                        "~/.ssh/plain",
                    ]
                )
            )
        elif kind == "jump":
            out.append(
                "ProxyJump " + rng.choice(["jump-a", "ops@jump-b:2222", "jump-a,jump-b", "none"])
            )
        elif kind == "command":
            out.append(
                "ProxyCommand "
                + rng.choice(["nc %h %p", "ssh -W %h:%p jump-a", "none", "relay %r@%n"])
            )
        elif depth < 2:
            included = where / f"inc{len(files)}.conf"
            files.append(str(included))
            included.write_text(_body(rng, depth + 1, files, where))
            out.append(f"Include {included}")
    return out


def _criteria(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 2)):
        parts.append(
            rng.choice(
                [
                    f"host {_pattern(rng)}",
                    f"originalhost {_pattern(rng)}",
                    f"user {rng.choice(USERS)}",
                    "host *.lan",
                    "final",
                    "all",
                    f"!host {rng.choice(NAMES).lower()}",
                    "exec true",
                    "exec false",
                ]
            )
        )
    if "all" in " ".join(parts):
        return "all"
    return " ".join(parts)


def _body(rng: random.Random, depth: int, files: list[str], where: Path) -> str:
    lines: list[str] = []
    if rng.random() < 0.4:
        lines += _directives(rng, depth, files, where)
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.6:
            lines.append("Host " + " ".join(_pattern(rng) for _ in range(rng.randint(1, 2))))
        else:
            lines.append("Match " + _criteria(rng))
        lines += ["  " + d for d in _directives(rng, depth, files, where)]
    return "\n".join(lines) + "\n"


def _config(rng: random.Random, where: Path) -> Path:
    where.mkdir()
    # A jump host's own chain ends at once, as the hops are compared by word (a loop is refused on
    # purpose).
    text = "Host jump-*\n  ProxyJump none\n  ProxyCommand none\n" + _body(rng, 0, [], where)
    path = where / "config"
    path.write_text(text)
    return path


def _word(rng: random.Random) -> str:
    name = rng.choice([*NAMES, "jump-a", "Other"])
    if rng.random() < 0.3:
        name = f"{rng.choice(USERS)}@{name}"
    if rng.random() < 0.2:
        name += f":{rng.choice([2201, 2202])}"
    return name


def ssh_g(config: Path, word: str) -> dict[str, list[str]]:
    """`ssh -G` for the word as typed on ssh's own command line: user@host, and -p for a :port."""
    target, _, port = word.partition(":")
    argv = [str(SSH), "-G", "-F", str(config), *(["-p", port] if port else []), target]
    out = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=True
    ).stdout
    fields: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        fields.setdefault(key, []).append(value)
    return fields


def expanded(template: str, fields: dict[str, list[str]], original: str) -> str:
    """The tokens the generator writes, as ssh(1)'s TOKENS section defines them."""
    local = socket.gethostname()
    values = {
        "%": "%",
        "h": fields["hostname"][0],
        "p": fields["port"][0],
        "r": fields["user"][0],
        "n": original,
        "L": local.split(".")[0],
        "l": local,
        "u": getpass.getuser(),
        "d": os.path.expanduser("~"),
    }
    out, i = "", 0
    while i < len(template):
        if template[i] == "%" and i + 1 < len(template):
            out += values[template[i + 1]]
            i += 2
        else:
            out += template[i]
            i += 1
    return os.path.expanduser("~") + out[1:] if out.startswith("~/") else out


def want(config: Path, word: str) -> dict:
    fields = ssh_g(config, word)
    original = word.rpartition("@")[2].partition(":")[0]
    keys = fields.get("identityfile", [])
    jump = fields.get("proxyjump", ["none"])[0]
    command = fields.get("proxycommand", ["none"])[0]
    return {
        "hostname": fields["hostname"][0],
        "user": fields["user"][0],
        "port": int(fields["port"][0]),
        "identityfile": []
        if keys == DEFAULT_KEYS
        else [expanded(k, fields, original) for k in keys],
        "proxyjump": [] if jump == "none" else jump.split(","),
        "proxycommand": None
        if command == "none" or jump != "none"
        else expanded(command, fields, original),
    }


def got(cxn) -> dict:
    hops = []
    hop = cxn.gateway
    while hop is not None and hop is not False and not isinstance(hop, str):
        hops.insert(0, hop.fleetops_name)
        hop = hop.gateway
    return {
        "hostname": cxn.host,
        "user": cxn.user,
        "port": int(cxn.port),
        "identityfile": list(cxn.ssh_config.get("identityfile") or []),
        "proxyjump": hops,
        "proxycommand": cxn.gateway if isinstance(cxn.gateway, str) else None,
    }


def loops(config: Path, expected: dict) -> bool:
    """Whether a hop of the chain is the target's own endpoint, as ssh -G resolves each."""

    def end(fields: dict[str, list[str]]) -> tuple[str, str, str]:
        return fields["hostname"][0], fields["port"][0], fields["user"][0]

    here = (expected["hostname"], str(expected["port"]), expected["user"])
    return any(end(ssh_g(config, hop)) == here for hop in expected["proxyjump"])


def test_every_generated_config_resolves_as_ssh_does(tmp_path, saved_config):
    rng = random.Random(SEED)
    pairs, differ = 0, []
    for n in range(CONFIGS):
        config = _config(rng, tmp_path / f"c{n}")
        ssh.use_ssh_config(str(config))
        for word in dict.fromkeys(_word(rng) for _ in range(5)):
            expected = want(config, word)
            try:
                actual = got(ssh._fabric_connection(plain_host(word), None))
            except TransportError as exc:
                actual = {"error": str(exc)}
                if "ProxyJump loop" in str(exc) and loops(config, expected):
                    # refused on purpose: a hop on the target's own HostName, Port and User
                    continue
            pairs += 1
            if actual != expected:
                fields = sorted(k for k in expected if actual.get(k) != expected[k])
                differ.append(f"{config} {word}: {fields}: fleetops {actual} / ssh -G {expected}")
    assert pairs >= CONFIGS * 3
    assert not differ, f"{len(differ)} of {pairs} pairs differ from ssh -G; first: " + "\n".join(
        differ[:5]
    )


def _mutate(rng: random.Random, files: list[Path]) -> None:
    """One change to one of the config's files: a digit swapped for another (the size stays), or,
    in a file with none, a block appended."""
    path = rng.choice(files)
    text = path.read_text()
    digits = [i for i, c in enumerate(text) if c.isdigit()]
    if digits:
        i = rng.choice(digits)
        text = text[:i] + str((int(text[i]) + rng.randint(1, 9)) % 10) + text[i + 1 :]
    else:
        text += "Host web1 db1\n  Port 2345\n"
    path.write_text(text)


def test_the_ssh_g_store_agrees_with_ssh_g_on_every_generated_config(tmp_path, monkeypatch):
    """Each answer through the store (a miss, then a hit, then again after one of the config's
    files changed) is what a fresh `ssh -G` prints."""
    top = tempfile.mkdtemp(prefix="gc", dir="/tmp")
    monkeypatch.setenv("FLEETOPS_CONTROL_DIR", os.path.join(top, "cm"))
    monkeypatch.delenv(sshgcache.CACHE_ENV, raising=False)
    monkeypatch.setattr(sshgcache, "RACY_NS", 50_000_000)  # the test waits past it
    rng = random.Random(SEED + 1)
    pairs, hits, differ = 0, 0, []

    def through(argv: list[str]) -> None:
        nonlocal pairs, hits
        runs: list[int] = []

        def run(a: list[str]) -> bytes | None:
            runs.append(1)
            return sshcmd._ssh_g(a)

        cached = sshgcache.lookup(argv, run)
        fresh = sshcmd._ssh_g(argv)
        pairs += 1
        hits += not runs
        if cached != fresh:
            differ.append(f"{argv}: {'hit' if not runs else 'miss'}")

    try:
        for n in range(max(CONFIGS // 3, 10)):
            config = _config(rng, tmp_path / f"c{n}")
            words = list(dict.fromkeys(_word(rng) for _ in range(4)))
            argvs = []
            for word in words:
                target, _, port = word.partition(":")
                argvs.append(
                    [str(SSH), "-F", str(config), *(["-p", port] if port else []), "-G"]
                    + ["--", target]
                )
            for _ in range(2):
                time.sleep(0.07)
                for argv in argvs:
                    through(argv)
                    through(argv)
                _mutate(rng, sorted(config.parent.iterdir()))
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert not differ, f"{len(differ)} of {pairs} answers differ from ssh -G; first: " + "\n".join(
        differ[:5]
    )
    assert hits >= pairs // 5, f"only {hits} hits of {pairs} lookups"
