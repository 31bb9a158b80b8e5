"""Which transport reaches a host, and the connector factory a run's Pool uses: `--transport`, else
$FLEETOPS_TRANSPORT, else the host's `transport:` (inventory defaults or the host), else DEFAULT. A
transport's modules are imported only when a host uses it: a run whose hosts all use openssh imports
no paramiko, cryptography or Fabric."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable

from ..plans.inventory import Host, Inventory
from . import parked
from .connector import (
    COUNTERS,
    FDS_PER_HOST,
    FDS_PER_HOST_OPENSSH,
    Connector,
    TransportError,
)

TRANSPORT_ENV = "FLEETOPS_TRANSPORT"
TRANSPORTS = ("openssh", "paramiko")
# The shipped default, by measurement (docs/perf.md): a first contact through the system ssh takes 9
# round trips to paramiko's 5 (its `none` authentication and key probe come before the signature),
# so a runbook's cold run is slower on openssh; openssh wins from the second command on.
DEFAULT = "paramiko"
MIN_OPENSSH = 8


def chosen(host: Host, run_choice: str | None = None) -> str:
    """The transport for this host. Raises TransportError for a value that names none."""
    for where, value in (
        ("--transport", run_choice),
        (TRANSPORT_ENV, os.environ.get(TRANSPORT_ENV)),
        (host.source or "the inventory", host.transport),
    ):
        if value:
            if value not in TRANSPORTS:
                raise TransportError(
                    "refused", f"{where}: transport {value!r} is not one of {', '.join(TRANSPORTS)}"
                )
            return value
    return DEFAULT


def any_paramiko(hosts: Iterable[Host], run_choice: str | None = None) -> bool:
    """Whether a host of these, or one outside the inventory, may use paramiko (so its reading of
    ssh_config is wanted)."""
    try:
        return any(chosen(h, run_choice) == "paramiko" for h in (*hosts, Host(name="", address="")))
    except TransportError:
        return True


def fds_per_host(hosts: Iterable[Host], run_choice: str | None = None) -> int:
    """The most client file descriptors one of these hosts holds while at work, by its transport
    (connector.fork_bound's `per_host`)."""
    try:
        openssh = any(chosen(h, run_choice) == "openssh" for h in hosts)
    except TransportError:  # named per host when it connects; count it at the larger
        openssh = True
    return FDS_PER_HOST_OPENSSH if openssh else FDS_PER_HOST


def openssh_version(binary: str | None = None) -> int | None:
    """The major version of the `ssh` on PATH (OpenSSH_9.2p1 → 9), None without one."""
    found = binary or shutil.which("ssh")
    if found is None:
        return None
    try:
        done = subprocess.run(
            [found, "-V"], stdin=subprocess.DEVNULL, capture_output=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    said = re.search(r"OpenSSH_(\d+)", (done.stderr + done.stdout).decode("utf-8", "replace"))
    return int(said.group(1)) if said else None


class Factory:
    """Pool's factory: each host's connector from its transport, the transport's module imported on
    first use."""

    def __init__(self, run_choice: str | None = None) -> None:
        self.run_choice = run_choice
        self._made: dict[str, Callable[[Host, Inventory | None], Connector]] = {}

    def __call__(self, host: Host, inventory: Inventory | None) -> Connector:
        kind = chosen(host, self.run_choice)
        made = self._kind(kind)(host, inventory)
        early = parked.take(host)
        if early is None:
            return made
        return _early_or(early, made, inventory) if kind == "openssh" else _discarded(early, made)

    def _kind(self, name: str) -> Callable[[Host, Inventory | None], Connector]:
        made = self._made.get(name)
        if made is None:
            if name == "openssh":
                from .openssh import OpenSSHConnection

                made = OpenSSHConnection
            else:
                from .ssh import NodeConnection

                made = NodeConnection
            self._made[name] = made
        return made

    def prepare(self) -> None:
        """The agent bundle and the bootstrap's launch words, built before the first host needs
        them."""
        from .bundle import agent_bundle, launch_words

        agent_bundle()
        launch_words()


def _early_or(early: Connector, made: Connector, inventory: Inventory | None) -> Connector:
    """The connection started early (wire/warmstart.py) when it is the one the run made and its
    agent's session is still on the master, else the run's own. A failure to tell (ssh -G refused,
    a key missing) is the run's to report, on its own connection."""
    from .openssh import OpenSSHConnection

    if isinstance(early, OpenSSHConnection) and isinstance(made, OpenSSHConnection):
        try:
            # and its session still on the master: a master gone since leaves it without one
            same = early.same_connection(made) and early.still_on_master()
        except Exception:
            same = False
        if same:
            early.inventory = inventory  # equal in all the connection reads (same_connection)
            with COUNTERS.lock:
                COUNTERS.early.add(early.host.name)
            return early
    return _discarded(early, made)


def _discarded(early: Connector, made: Connector) -> Connector:
    parked.discard(early)
    return made
