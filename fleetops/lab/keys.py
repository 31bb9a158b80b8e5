"""The lab's ssh keys: ed25519 key pairs made with ssh-keygen (the client's, each node's host key,
the user CA's), a host key's fingerprint, the known_hosts file that trusts every node's current host
key, and OpenSSH user certificates signed by the lab's CA (which every node's sshd trusts:
TrustedUserCAKeys)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .node import Node


def keygen(path: Path, comment: str) -> None:
    """An ed25519 key pair without a passphrase at `path` (and `path`.pub)."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True
    )


def fingerprint(public_key: Path) -> str:
    """The key's SHA256 fingerprint, as ssh-keygen -l prints it."""
    out = subprocess.run(
        ["ssh-keygen", "-lf", str(public_key)], capture_output=True, text=True, check=True
    ).stdout
    return out.split()[1]


def write_known_hosts(path: Path, nodes: list[Node]) -> None:
    lines = []
    for node in nodes:
        keytype, key = node.host_key.with_suffix(".pub").read_text().split()[:2]
        lines.append(f"[127.0.0.1]:{node.port} {keytype} {key}")
    path.write_text("\n".join(lines) + "\n")


def certify(
    ca: Path,
    public_key: Path,
    out: Path,
    identity: str,
    principals: list[str],
    validity: str = "-5m:+1h",
) -> Path:
    """An OpenSSH user certificate for `public_key` signed by the CA key `ca` (ssh-keygen -s), valid
    for these principals (login names) over `validity` (ssh-keygen -V: "-5m:+1h",
    "20200101:20200102"), written to `out`."""
    # ssh-keygen writes <key>-cert.pub beside the key it signs
    work = out.with_name(out.name + ".key.pub")
    work.write_text(public_key.read_text())
    try:
        subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-s",
                str(ca),
                "-I",
                identity,
                "-n",
                ",".join(principals),
                "-V",
                validity,
                str(work),
            ],
            check=True,
            capture_output=True,
        )
        Path(str(work)[: -len(".pub")] + "-cert.pub").replace(out)
    finally:
        work.unlink(missing_ok=True)
    return out
