"""A host's jump host as the inventory describes it. `jump: lab02` (an inventory name) is that host,
with its own settings. `jump: user@host:port` and `jump:` as a mapping (address, port, user,
identity_file, known_hosts) are reached with the inventory's identity_file and known_hosts (those of
the host that names the jump, as written in its file: a -i on the command line is for the hosts,
never a jump host, as with ssh) unless the mapping names its own. An ssh_config alias keeps
ssh_config's settings. A -H word that is such a jump (`fab -H root@bastion:2222 trust`) gets the
same keys, so trusting a jump host writes the inventory's known_hosts.

Hosts here are plans/host.py's: plans/inventory.py calls in here, so this module never imports that
one."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from .host import Host


def with_keys(jump: Host, origin: Host) -> Host:
    """`jump` with the inventory's identity_file (and its passphrase) and known_hosts where it names
    none."""
    own_key = jump.identity_file is not None and jump.identity_file != origin.identity_file
    secrets = tuple(m for m in origin.missing_secrets if m[0] == "identity_passphrase")
    return replace(
        jump,
        plain=False,
        identity_file=jump.identity_file or origin.identity_file,
        known_hosts=jump.known_hosts or origin.known_hosts,
        passphrase=None if own_key else origin.passphrase,
        missing_secrets=() if own_key else secrets,
        connect_timeout=origin.connect_timeout,
    )


def keyed_jump(plain: Host, origin: Host, aliases: Callable[[], frozenset[str]]) -> Host | None:
    """The user@host:port jump `plain` (a word outside the inventory) as `origin`'s inventory
    reaches it; None when the inventory gives it no key or known_hosts, or it is an ssh_config Host
    (its HostName, IdentityFile and UserKnownHostsFile decide)."""
    if not (origin.identity_file or origin.known_hosts) or plain.address in aliases():
        return None
    return with_keys(replace(plain, source=origin.source), origin)


def jump_named(
    hosts: Iterable[Host], spec: str, plain: Host, aliases: Callable[[], frozenset[str]]
) -> Host | None:
    """The jump host an inventory host names with exactly this word (`plain`: the word as a host
    outside the inventory), with the keys it is reached with; None when no host's jump is `spec`.
    The first host in file order decides when several name it."""
    for host in hosts:
        if host.jump != spec:
            continue
        jump = (
            with_keys(host.jump_host, host)
            if host.jump_host is not None
            else keyed_jump(plain, host, aliases)
        )
        if jump is not None:
            return jump
    return None
