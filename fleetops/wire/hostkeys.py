"""Host keys: known_hosts files parsed once per process and file version, indexed and merged per
host, the strict client that refuses a key nobody trusted, and the rewrite of a changed key's
entry."""

from __future__ import annotations

import os
import threading

import paramiko
from fabric import Connection

from .. import compat
from ..plans.inventory import Host
from .connector import TransportError


def fingerprint_of(key: paramiko.PKey) -> str:
    return key.fingerprint if hasattr(key, "fingerprint") else key.get_base64()[:20]


_LOCK = threading.Lock()
_HOST_KEYS: dict[str, tuple[float, paramiko.HostKeys]] = {}


def _known_hosts(path: str) -> paramiko.HostKeys:
    """known_hosts parsed once per process and file version, shared by every connection that uses
    it."""
    mtime = os.stat(path).st_mtime
    with _LOCK:
        cached = _HOST_KEYS.get(path)
        if cached is None or cached[0] != mtime:
            cached = _HOST_KEYS[path] = (mtime, compat.host_keys(path))
        return cached[1]


def known_hosts_files(host: Host, cxn: Connection | None) -> list[str]:
    """The inventory's known_hosts, else ssh_config's UserKnownHostsFile (first named is the one
    `trust` writes), else ~/.ssh/known_hosts."""
    if host.known_hosts:
        return [host.known_hosts]
    named = str((cxn.ssh_config if cxn is not None else {}).get("userknownhostsfile") or "").split()
    return [os.path.expanduser(p) for p in named] or [os.path.expanduser("~/.ssh/known_hosts")]


_MERGED_KEYS: dict[tuple, paramiko.HostKeys] = {}


def _host_keys_for(files: list[str]) -> paramiko.HostKeys:
    """The known_hosts files' keys merged, once per process and set of file versions, shared
    read-only by every connection that uses them (merging per connection cost ~14 ms of client CPU
    per host at N=128: paramiko's HostKeys.add scans every entry). With the RejectPolicy nothing
    ever adds to it."""
    loaded: list[tuple[str, float, paramiko.HostKeys]] = []
    for path in files:
        try:
            mtime = os.stat(path).st_mtime
            entries = _known_hosts(path)
        except FileNotFoundError:
            continue
        except (OSError, paramiko.SSHException, ValueError) as exc:
            raise TransportError(
                "hostkey", f"cannot read known_hosts {path}: {exc}; fix or remove that file"
            ) from None
        loaded.append((path, mtime, entries))
    key = tuple((path, mtime) for path, mtime, _ in loaded)
    with _LOCK:
        merged = _MERGED_KEYS.get(key)
    if merged is not None:
        return merged
    if len(loaded) == 1:
        merged = loaded[0][2]
    else:
        merged = _merged(compat.host_keys(), [entries for _, _, entries in loaded])
    with _LOCK:
        return _MERGED_KEYS.setdefault(key, merged)


def _merged(into: paramiko.HostKeys, loaded: list[paramiko.HostKeys]) -> paramiko.HostKeys:
    for entries in loaded:
        for name, entry in entries.items():
            for keytype, hostkey in entry.items():
                into.add(name, keytype, hostkey)
    return into


def _load_into(target: paramiko.HostKeys, files: list[str]) -> None:
    """paramiko's public way, per connection: the client's own copy, built as _host_keys_for builds
    the shared one (paramiko's load of the one file, or the files merged in order)."""
    try:
        found = [path for path in files if os.path.exists(path)]
        if len(found) == 1:
            target.load(found[0])
        else:
            _merged(target, [paramiko.HostKeys(path) for path in found])
    except (OSError, paramiko.SSHException, ValueError) as exc:
        raise TransportError(
            "hostkey", f"cannot read known_hosts: {exc}; fix or remove that file"
        ) from None


class StrictClient(paramiko.SSHClient):
    """The SSH client of every fleetops hop: only keys in known_hosts are accepted
    (strict_client)."""


def strict_client(files: list[str]) -> paramiko.SSHClient:
    client = StrictClient()
    # shared, read-only (see _host_keys_for)
    if not compat.share_host_keys(client, _host_keys_for(files)):
        _load_into(client.get_host_keys(), files)
    # Fabric auto-adds unknown host keys, and ssh_config's StrictHostKeyChecking is not consulted: a
    # fleet tool connects only to keys the operator trusted (`trust --fingerprint`).
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


def known_hosts_path(host: Host) -> str:
    return known_hosts_files(host, None)[0]


def replace_known_host(path: str, name: str, key: paramiko.PKey) -> int:
    """known_hosts without the lines for `name` (plain or hashed), plus the new key; written to a
    temp file and renamed, so a crash leaves the old file. Returns how many lines were dropped."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    kept = []
    for line in lines:
        names = line.split(None, 1)[0] if line.strip() and not line.lstrip().startswith("#") else ""
        hashed = [n for n in names.split(",") if n.startswith("|1|")]
        plain = [n for n in names.split(",") if not n.startswith("|1|")]
        if name in plain or any(
            paramiko.HostKeys.hash_host(name, h.split("|")[2]) == h for h in hashed
        ):
            continue
        kept.append(line if line.endswith("\n") else line + "\n")
    kept.append(f"{name} {key.get_name()} {key.get_base64()}\n")
    tmp = f"{path}.{os.urandom(16).hex()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(kept)
    os.chmod(tmp, os.stat(path).st_mode & 0o777)
    os.replace(tmp, path)
    with _LOCK:
        _HOST_KEYS.pop(path, None)
        _MERGED_KEYS.clear()
    return len(lines) - (len(kept) - 1)
