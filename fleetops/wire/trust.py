"""`trust`: a host's key added to (or replaced in) its known_hosts only for the fingerprint the
operator names."""

from __future__ import annotations

import os

import paramiko
from fabric import Connection

from ..plans.inventory import Host, Inventory
from ..plans.trustadvice import normalize_fingerprint, verify_then_trust
from .errors import connect_error, host_label
from .hops import fabric_connection
from .hostkeys import fingerprint_of, known_hosts_files, replace_known_host


class _CaptureKey(paramiko.MissingHostKeyPolicy):
    """Records the key an unknown host offers, then refuses it (used only by `trust`)."""

    def __init__(self) -> None:
        self.key: paramiko.PKey | None = None

    def missing_host_key(self, client, hostname, key):  # paramiko's signature
        self.key = key
        raise paramiko.SSHException(f"captured host key for {hostname}")


def _known_name(cxn: Connection) -> str:
    return cxn.host if int(cxn.port) == 22 else f"[{cxn.host}]:{cxn.port}"


def trust_host(
    host: Host, inventory: Inventory | None, fingerprint: str | None, replace: bool = False
) -> tuple[str, str]:
    """Add the host's key to its known_hosts only when the operator names the fingerprint they
    verified; with `replace`, a changed key (a reimaged node) replaces the old entry, again only for
    the named fingerprint. Returns (outcome, message); outcome is trusted / already / refused."""
    fingerprint = normalize_fingerprint(fingerprint)
    cxn = fabric_connection(host, inventory)
    capture = _CaptureKey()
    cxn.client.set_missing_host_key_policy(capture)
    try:
        cxn.open()
    except paramiko.BadHostKeyException as exc:
        old, new, path = (
            fingerprint_of(exc.expected_key),
            fingerprint_of(exc.key),
            known_hosts_files(host, cxn)[0],
        )
        if replace and fingerprint == new:
            removed = replace_known_host(path, _known_name(cxn), exc.key)
            return (
                "trusted",
                (
                    f"replaced {old} with {new} for {_known_name(cxn)} "
                    f"in {path} ({removed} old line(s))"
                ),
            )
        if replace:
            return "refused", (
                f"host key CHANGED for {host_label(host, cxn)}: the host offers {new}, not the "
                f"{fingerprint or '(no fingerprint)'} you named; nothing replaced"
            )
        return "refused", (
            f"host key CHANGED for {host_label(host, cxn)}: known_hosts has {old}, the host offers "
            f"{new}; if the change is expected (node reinstalled), "
            + verify_then_trust(host.name, new, exc.key.get_name(), replace=True)
        )
    except Exception as exc:  # every failure becomes a message (connect_error), none a traceback
        if capture.key is None:
            raise connect_error(exc, host, cxn) from None
    finally:
        cxn.close()
    if capture.key is None:
        return "already", "host key already in known_hosts and matches"
    offered = fingerprint_of(capture.key)
    if fingerprint is None:
        return "refused", (
            f"unknown host key {offered} ({capture.key.get_name()}); "
            + verify_then_trust(host.name, offered, capture.key.get_name())
        )
    if fingerprint != offered:
        return (
            "refused",
            f"the host offers {offered}, not the {fingerprint} you named; nothing trusted",
        )
    path = known_hosts_files(host, cxn)[0]
    name = _known_name(cxn)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{name} {capture.key.get_name()} {capture.key.get_base64()}\n")
    return "trusted", f"added {offered} for {name} to {path}"
