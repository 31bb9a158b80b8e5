"""A host's connection settings as OpenSSH resolves them: `ssh -G` output read into the fields a
connection uses, and the `%` tokens ssh expands only when it connects (IdentityFile,
CertificateFile, ProxyCommand).

OpenSSH is the one reader of ssh_config: Include inside a Host or Match block, case, `Match final`,
`Match exec`, `%h` before `Match host`, the first-obtained rule between ProxyJump and ProxyCommand.
Reading it any other way can send a run to another host or user than `ssh` would. wire/fabconfig.py
runs `ssh -G`; here its answer is read, with no process and no network, so the reading is tested on
recorded output."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# What `ssh -G` lists as IdentityFile when the configuration names none: the keys paramiko's own
# default search looks for too, so they stand for "none named" (a named key list is offered alone).
DEFAULT_IDENTITIES = (
    "~/.ssh/id_rsa",
    "~/.ssh/id_ecdsa",
    "~/.ssh/id_ecdsa_sk",
    "~/.ssh/id_ed25519",
    "~/.ssh/id_ed25519_sk",
    "~/.ssh/id_xmss",
    "~/.ssh/id_dsa",
)

# The ssh_config keywords a connection made here takes from the resolution; `Host`, `Match` and
# `Include` decide which of them apply. What the fallback (no `ssh` binary: paramiko's reading)
# names as not applied is the rest.
APPLIED = frozenset(
    {
        "host",
        "match",
        "include",
        "hostname",
        "user",
        "port",
        "identityfile",
        "identitiesonly",
        "certificatefile",
        "proxyjump",
        "proxycommand",
        "userknownhostsfile",
        "connecttimeout",
    }
)
_KEYWORD = re.compile(r"^\s*(\w+)(?:\s*=\s*|\s+)")
_TOKEN = re.compile(r"%(.)")


class ResolveError(ValueError):
    """`ssh -G` said something that is not a resolution (its own error is reported where it ran)."""


@dataclass(frozen=True)
class Local:
    """The client side of the tokens: who runs ssh, and where."""

    user: str
    home: str
    uid: int
    hostname: str  # gethostname(): %l; %L is it up to the first dot


@dataclass(frozen=True)
class Resolved:
    """One host word's settings, as `ssh -G` printed them. Paths and ProxyCommand are still
    templates: `expand` makes them what ssh would use."""

    original: str  # the host word as given (%n), without a user@ or :port
    hostname: str
    user: str
    port: int
    identity_files: tuple[str, ...] = ()  # () when ssh_config names none (ssh's defaults stand)
    certificate_files: tuple[str, ...] = ()
    identities_only: bool = False
    # the ProxyJump in force; None when a ProxyCommand came first, or `none`
    proxy_jump: str | None = None
    proxy_command: str | None = None
    known_hosts: tuple[str, ...] = ()
    connect_timeout: int | None = None
    options: Mapping[str, tuple[str, ...]] = field(default_factory=dict, repr=False)


def ssh_g_argv(
    ssh: str, word: str, config: str | None = None, options: Iterable[tuple[str, str]] = ()
) -> list[str]:
    """The argv of `ssh -G` for one host word: `-F` when a file is named, each inventory value as
    `-o Key=value` (which wins over ssh_config, as on ssh's own command line), the word last, after
    `--` so it is never an option."""
    argv = [ssh, "-G"]
    if config:
        argv += ["-F", config]
    for key, value in options:
        argv += ["-o", f"{key}={value}"]
    return [*argv, "--", word]


def parse(text: str, original: str) -> Resolved:
    """`ssh -G`'s output (one `keyword value` a line, keywords lowercase) read into a Resolved."""
    options: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            options.setdefault(key.lower(), []).append(value.strip())
    missing = [k for k in ("hostname", "user", "port") if k not in options]
    if missing:
        raise ResolveError(f"ssh -G printed no {', '.join(missing)} for {original!r}")
    try:
        port = int(options["port"][0])
    except ValueError:
        raise ResolveError(f"ssh -G printed a port that is not a number for {original!r}") from None
    identities = tuple(options.get("identityfile", ()))
    if identities == DEFAULT_IDENTITIES:
        identities = ()
    jump = _one(options, "proxyjump")
    command = _one(options, "proxycommand")
    timeout = _one(options, "connecttimeout")
    return Resolved(
        original=original,
        hostname=options["hostname"][0],
        user=options["user"][0],
        port=port,
        identity_files=identities,
        certificate_files=tuple(options.get("certificatefile", ())),
        identities_only=_one(options, "identitiesonly") == "yes",
        proxy_jump=jump,
        proxy_command=command,
        known_hosts=_named_known_hosts(options),
        connect_timeout=int(timeout) if timeout and timeout.isdigit() else None,
        options={k: tuple(v) for k, v in options.items()},
    )


def _named_known_hosts(options: Mapping[str, list[str]]) -> tuple[str, ...]:
    """UserKnownHostsFile, or () for ssh's default pair, which ssh prints expanded from the password
    database's home: fleetops' own default (~/.ssh/known_hosts from $HOME) stands for it, so a HOME
    of its own (a test's, `sudo -E`) never sends `trust` into another home's file."""
    files = tuple(w for v in options.get("userknownhostsfile", ()) for w in v.split())
    if len(files) == 2 and files[0].endswith("/.ssh/known_hosts") and files[1] == files[0] + "2":
        return ()
    return files


def _one(options: Mapping[str, list[str]], key: str) -> str | None:
    values = options.get(key)
    if not values or values[0].lower() == "none":
        return None
    return values[0]


def expand(template: str, resolved: Resolved, local: Local, *, path: bool = True) -> str:
    """A template with ssh's `%` tokens (and `~` for a path) as ssh expands it when it connects. An
    unknown token raises ResolveError, as ssh refuses it."""
    short = local.hostname.split(".", 1)[0]
    jump = resolved.proxy_jump or ""
    values = {
        "%": "%",
        "h": resolved.hostname,
        "p": str(resolved.port),
        "r": resolved.user,
        "n": resolved.original,
        "l": local.hostname,
        "L": short,
        "u": local.user,
        "d": local.home,
        "i": str(local.uid),
        "j": jump,
        "k": resolved.options.get("hostkeyalias", (resolved.original,))[0],
        "C": hashlib.sha1(
            f"{local.hostname}{resolved.hostname}{resolved.port}{resolved.user}{jump}".encode()
        ).hexdigest(),
    }

    def one(match: re.Match[str]) -> str:
        token = match.group(1)
        if token not in values:
            raise ResolveError(f"unknown token %{token} in {template!r}")
        return values[token]

    out = _TOKEN.sub(one, template)
    if path and (out == "~" or out.startswith("~/")):
        out = local.home + out[1:]
    return out


def lookup_dict(resolved: Resolved, local: Local) -> dict[str, object]:
    """The resolution in the shape of paramiko's SSHConfig lookup (lowercase keys, IdentityFile a
    list), with every template expanded: what Fabric's Connection and the key code read."""
    out: dict[str, object] = {
        "hostname": resolved.hostname,
        "user": resolved.user,
        "port": str(resolved.port),
        "identitiesonly": "yes" if resolved.identities_only else "no",
    }
    if resolved.identity_files:
        out["identityfile"] = [expand(f, resolved, local) for f in resolved.identity_files]
    if resolved.certificate_files:
        out["certificatefile"] = [expand(f, resolved, local) for f in resolved.certificate_files]
    if resolved.proxy_jump:
        out["proxyjump"] = resolved.proxy_jump
    elif resolved.proxy_command:
        out["proxycommand"] = expand(resolved.proxy_command, resolved, local, path=False)
    if resolved.known_hosts:
        out["userknownhostsfile"] = " ".join(
            expand(f, resolved, local) for f in resolved.known_hosts
        )
    if resolved.connect_timeout is not None:
        out["connecttimeout"] = str(resolved.connect_timeout)
    return out


def not_applied(config_text: str) -> list[str]:
    """The keywords of an ssh_config text (Includes spliced in) that a connection made without `ssh
    -G` does not apply, in the order first seen: the fallback names them all in one warning."""
    seen: dict[str, None] = {}
    for line in config_text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        match = _KEYWORD.match(line)
        if match and match.group(1).lower() not in APPLIED:
            seen.setdefault(match.group(1), None)
    return list(seen)


def local_side() -> Local:
    """This process's Local (the one impure helper here: it reads the environment, never the
    network)."""
    import getpass
    import socket

    home = os.path.expanduser("~")
    return Local(
        user=getpass.getuser(),
        home=home,
        uid=os.getuid() if hasattr(os, "getuid") else 0,
        hostname=socket.gethostname(),
    )
