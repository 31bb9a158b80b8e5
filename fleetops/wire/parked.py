"""Connections whose agent was started before the program's own start-up (wire/warmstart.py), held
here until the run's Pool asks for the host's connector. The run takes one over only when it is the
connection the run would have made itself (transports.Factory compares them); any other is closed,
and the run connects as it would have without it."""

from __future__ import annotations

import threading

from ..plans.inventory import Host
from .connector import Connector

_LOCK = threading.Lock()
_PARKED: dict[str, tuple[Host, Connector]] = {}


def park(host: Host, connector: Connector) -> None:
    with _LOCK:
        _PARKED[host.name] = (host, connector)


def take(host: Host) -> Connector | None:
    """The connector parked for this host, if it was made for this very Host (every field: address,
    user, port, key, interpreter, state dir, ...); one made for another is closed."""
    with _LOCK:
        entry = _PARKED.pop(host.name, None)
    if entry is None:
        return None
    parked_host, connector = entry
    if parked_host == host:
        return connector
    discard(connector)
    return None


def names() -> list[str]:
    with _LOCK:
        return sorted(_PARKED)


def discard_all() -> None:
    """Every connector no run took: its agent ends (its stdin closes); the master stays."""
    with _LOCK:
        left = list(_PARKED.values())
        _PARKED.clear()
    for _, connector in left:
        discard(connector)


def discard(connector: Connector) -> None:
    try:
        connector.close()
    except Exception:  # its agent ends with this process anyway; closing early is a courtesy
        pass
