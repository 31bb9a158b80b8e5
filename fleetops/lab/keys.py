"""The lab's ssh keys: ed25519 key pairs made with ssh-keygen (the client's, each node's host key), a host key's
fingerprint, and the known_hosts file that trusts every node's current host key."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .node import Node


def keygen(path: Path, comment: str) -> None:
    """An ed25519 key pair without a passphrase at `path` (and `path`.pub)."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)


def fingerprint(public_key: Path) -> str:
    """The key's SHA256 fingerprint, as ssh-keygen -l prints it."""
    out = subprocess.run(["ssh-keygen", "-lf", str(public_key)], capture_output=True, text=True, check=True).stdout
    return out.split()[1]


def write_known_hosts(path: Path, nodes: list[Node]) -> None:
    lines = []
    for node in nodes:
        keytype, key = node.host_key.with_suffix(".pub").read_text().split()[:2]
        lines.append(f"[127.0.0.1]:{node.port} {keytype} {key}")
    path.write_text("\n".join(lines) + "\n")
