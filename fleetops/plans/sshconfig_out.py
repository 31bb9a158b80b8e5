"""`fab ssh-config`: the inventory as an OpenSSH client config, so plain `ssh lab01` (through `ssh
-F FILE` or an `Include`) reaches a node with exactly the settings fleetops uses: address, port,
user, key, jump host (a jump the inventory gives keys to is a block of its own,
`jump-ADDRESS-PORT`), known_hosts, and strict host-key checking (fleetops never accepts an unknown
key; neither will ssh).

Pure: inventory in, text out. wire/ssh.py decides what fleetops itself connects with; `host_params`
is that decision restated for one host, and tests/test_oncall_lab.py checks that paramiko's
SSHConfig reads the printed text back to the same values for every host."""

from __future__ import annotations

import re

from .host import Host
from .inventory import Inventory
from .jumphost import jump_of
from .yamlsrc import ConfigError

# OpenSSH expands %-tokens and ~ in these and splits unquoted values at blanks; a double quote
# cannot be escaped inside a quoted value at all. Such a value is refused rather than printed as
# something else.
_UNSAFE = re.compile(r'["%\n\r\t\\]')


def _value(host: Host, key: str, value: str) -> str:
    if _UNSAFE.search(value):
        raise ConfigError(
            host.source or host.name,
            None,
            f"{host.name}: {key} {value!r} holds a character OpenSSH "
            'config cannot carry as typed (" % \\ or a control character); rename the file',
        )
    return f'"{value}"' if (" " in value or "#" in value or "=" in value) else value


def host_params(host: Host) -> dict[str, str]:
    """What fleetops connects to for an inventory host, in ssh_config terms (lower-case keys, as
    paramiko's SSHConfig.lookup returns them)."""
    params = {
        "hostname": host.address,
        "port": str(host.port),
        "stricthostkeychecking": "yes",
        "connecttimeout": str(host.connect_timeout),
    }
    if host.user:
        params["user"] = host.user
    if host.identity_file:
        # fleetops offers this key only (no agent, no ~/.ssh/id_*): IdentitiesOnly says the same to
        # ssh
        params["identityfile"] = host.identity_file
        params["identitiesonly"] = "yes"
    if host.known_hosts:
        params["userknownhostsfile"] = host.known_hosts
    if host.jump:
        params["proxyjump"] = host.jump
    return params


_ORDER = (
    "hostname",
    "port",
    "user",
    "identityfile",
    "identitiesonly",
    "proxyjump",
    "userknownhostsfile",
    "stricthostkeychecking",
    "connecttimeout",
)
_SPELLING = {
    "hostname": "HostName",
    "port": "Port",
    "user": "User",
    "identityfile": "IdentityFile",
    "identitiesonly": "IdentitiesOnly",
    "proxyjump": "ProxyJump",
    "userknownhostsfile": "UserKnownHostsFile",
    "stricthostkeychecking": "StrictHostKeyChecking",
    "connecttimeout": "ConnectTimeout",
}


# A jump's ssh settings, sorted: jumps with the same settings share one Host block.
JumpKey = tuple[tuple[str, str], ...]


def _settings(host: Host, params: dict[str, str]) -> list[str]:
    return [
        f"    {_SPELLING[key]} {_value(host, _SPELLING[key], params[key])}"
        for key in _ORDER
        if key in params
    ]


def _jump_alias(
    jump: Host, inventory: Inventory, jumps: dict[JumpKey, tuple[str, Host]]
) -> str | None:
    """The Host block a keyed jump is printed as (its own name, so no other ssh to that address
    takes its keys); None for a jump ssh_config decides (an alias, or no key in the inventory):
    ProxyJump names it as is."""
    if jump.plain or inventory.hosts.get(jump.name) is jump:
        return None
    key = tuple(sorted(host_params(jump).items()))
    if key not in jumps:
        taken = set(inventory.hosts) | {alias for alias, _ in jumps.values()}
        base, n = f"jump-{jump.address}-{jump.port}", 2
        alias = base
        while alias in taken:
            alias, n = f"{base}-{n}", n + 1
        jumps[key] = (alias, jump)
    return jumps[key][0]


def render(inventory: Inventory, hosts: list[Host] | None = None, origin: str = "") -> str:
    """One `Host` block per inventory host (example inventories' hosts are left out: fleetops
    refuses them too). `origin` names the inventory in the header comment."""
    chosen = hosts if hosts is not None else [inventory.hosts[n] for n in inventory.names()]
    out = [
        "# OpenSSH client config for the fleetops inventory"
        + (f" ({origin})" if origin else "")
        + ".",
        "# Written by `fab ssh-config`. Save it (fab ssh-config > ~/.ssh/fleetops.conf), then",
        (
            "# `ssh -F ~/.ssh/fleetops.conf HOST`, or `Include "
            "fleetops.conf` at the top of ~/.ssh/config."
        ),
        (
            "# (ssh -F <(fab ssh-config) cannot work: ssh "
            "closes inherited descriptors before reading -F.)"
        ),
        (
            "# Strict host keys: trust a new node with `fab "
            "-H HOST trust --fingerprint SHA256:...` first."
        ),
    ]
    skipped = [h.name for h in chosen if h.example]
    # a keyed jump's settings -> its block's name and host
    jumps: dict[JumpKey, tuple[str, Host]] = {}
    for host in chosen:
        if host.example:
            continue
        params = host_params(host)
        if host.jump and host.jump not in inventory.hosts:
            params["proxyjump"] = (
                _jump_alias(jump_of(host, inventory), inventory, jumps) or host.jump
            )
        lines = [f"Host {host.name}"]
        if host.groups:
            lines.insert(0, f"# groups: {', '.join(host.groups)}")
        out += ["", *lines, *_settings(host, params)]
    for alias, jump in jumps.values():
        out += [
            "",
            f"# the jump host {jump.name}, with the keys fleetops reaches it with",
            f"Host {alias}",
            *_settings(jump, host_params(jump)),
        ]
    if skipped:
        out += ["", f"# left out (example inventory, never contacted): {', '.join(skipped)}"]
    return "\n".join(out) + "\n"
