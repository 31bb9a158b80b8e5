"""The Host a host's connection goes through, as the inventory names it (plans/jumps.py says how the
inventory's keys apply). Pure: wire/hops.py connects through it, sshconfig_out.py prints it for
ssh."""

from __future__ import annotations

from .host import Host, plain_host, split_target
from .inventory import Inventory
from .jumps import keyed_jump, with_keys


def jump_of(host: Host, inventory: Inventory | None) -> Host:
    """Raises UnknownHost for a word that is neither an inventory name nor an address or ssh_config
    alias."""
    assert host.jump is not None
    origin = inventory.hosts.get(host.name, host) if inventory is not None else host
    if origin.jump != host.jump:
        origin = host
    if host.jump_host is not None:
        return with_keys(host.jump_host, origin)
    user, name, port = split_target(host.jump)
    if inventory is None:
        return keyed_jump(plain_host(host.jump), origin, frozenset) or plain_host(host.jump)
    # an inventory name, or UnknownHost with a "did you mean" for a typo
    jump = inventory.resolve(host.jump)
    if host.jump in inventory.hosts or (name in inventory.hosts and (user or port)):
        return jump
    return keyed_jump(plain_host(host.jump), origin, inventory.aliases) or plain_host(host.jump)
