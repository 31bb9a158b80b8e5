"""OpenSSH user certificates read as sshd reads them (PROTOCOL.certkeys): who they are for and when,
so that a login the node refused names the certificate's own fault (expired, not yet valid, not for
this login name) instead of a key missing from authorized_keys. Pure: bytes and a clock in, words
out."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass

FOREVER = 0xFFFFFFFFFFFFFFFF
USER_CERT = 1
# The public key's own fields after the nonce, as strings (an mpint is a string on the wire), per
# certificate type
_KEY_FIELDS = {
    "ssh-rsa-cert-v01@openssh.com": 2,
    "ssh-dss-cert-v01@openssh.com": 4,
    "ecdsa-sha2-nistp256-cert-v01@openssh.com": 2,
    "ecdsa-sha2-nistp384-cert-v01@openssh.com": 2,
    "ecdsa-sha2-nistp521-cert-v01@openssh.com": 2,
    "ssh-ed25519-cert-v01@openssh.com": 1,
    "sk-ecdsa-sha2-nistp256-cert-v01@openssh.com": 3,
    "sk-ssh-ed25519-cert-v01@openssh.com": 2,
}


@dataclass(frozen=True)
class Certificate:
    key_type: str
    serial: int
    kind: int  # 1: a user certificate, 2: a host certificate
    key_id: str
    principals: tuple[str, ...]
    valid_after: int  # seconds since the epoch; 0: always
    valid_before: int  # FOREVER: never expires
    ca_fingerprint: str  # SHA256:... of the signing CA's public key, as ssh-keygen -l prints it


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise ValueError("truncated certificate")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def string(self) -> bytes:
        (size,) = struct.unpack(">I", self.take(4))
        return self.take(size)

    def uint32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def uint64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])


def parse(blob: bytes) -> Certificate | None:
    """The certificate in a key blob (the base64 field of a -cert.pub file, decoded); None when it
    is not one."""
    try:
        r = _Reader(blob)
        key_type = r.string().decode()
        if key_type not in _KEY_FIELDS:
            return None
        r.string()  # nonce
        for _ in range(_KEY_FIELDS[key_type]):
            r.string()
        serial, kind, key_id = r.uint64(), r.uint32(), r.string().decode(errors="replace")
        packed = _Reader(r.string())
        principals = []
        while packed.at < len(packed.data):
            principals.append(packed.string().decode(errors="replace"))
        valid_after, valid_before = r.uint64(), r.uint64()
        r.string(), r.string(), r.string()  # critical options, extensions, reserved
        ca = r.string()
    except (ValueError, UnicodeDecodeError, struct.error):
        return None
    fingerprint = "SHA256:" + base64.b64encode(hashlib.sha256(ca).digest()).decode().rstrip("=")
    return Certificate(
        key_type, serial, kind, key_id, tuple(principals), valid_after, valid_before, fingerprint
    )


def read(path: str) -> Certificate | None:
    """The certificate in an OpenSSH -cert.pub file ("TYPE BASE64 [comment]"); None when unreadable
    or not one."""
    try:
        with open(path, "rb") as f:
            fields = f.read(64 * 1024).split()
        return parse(base64.b64decode(fields[1], validate=True)) if len(fields) >= 2 else None
    except (OSError, binascii.Error, ValueError):
        return None


def _when(seconds: int) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def validity(cert: Certificate) -> str:
    start = _when(cert.valid_after) if cert.valid_after else "always"
    end = "forever" if cert.valid_before == FOREVER else _when(cert.valid_before)
    return f"{start} to {end}"


def fault(cert: Certificate, user: str, now: float) -> str | None:
    """Why sshd refuses this certificate for a login as `user` at `now`, seen from the certificate
    alone; None when it would pass (a node that refuses it anyway does not trust its CA)."""
    if cert.kind != USER_CERT:
        return "is a host certificate, not a user certificate"
    if cert.valid_before != FOREVER and now >= cert.valid_before:
        return f"expired on {_when(cert.valid_before)} (valid {validity(cert)})"
    if now < cert.valid_after:
        return f"is not valid before {_when(cert.valid_after)}"
    if not cert.principals:
        return f"names no principal: sshd needs the login name ({user}) among them"
    if user not in cert.principals:
        return f"is not valid for user {user} (its principals: {', '.join(cert.principals)})"
    return None


def refused_login(
    who: str, user: str, certificate_files: Iterable[str], now: float | None = None
) -> str | None:
    """What to say when sshd refused a login as `user` on which these certificates were offered (the
    one the connection joined to its key; for ssh, ssh -G's CertificateFile that exist): the first
    certificate's own fault, else that the node does not trust its CA. None when none of the files
    reads as a certificate."""
    now = time.time() if now is None else now
    for path in certificate_files:
        cert = read(path)
        if cert is None:
            continue
        why = fault(cert, user, now)
        if why is not None:
            return (
                f"{who}: authentication failed for user {user!r}: "
                f"the certificate {path} {why}; have it signed "
                "again (ssh-keygen -s CA -I ID -n USER -V "
                "...), or name another with CertificateFile in "
                "ssh_config"
            )
        return (
            f"{who}: authentication failed for user {user!r}: the certificate {path} (valid "
            f"{validity(cert)} for {', '.join(cert.principals)}) was refused; check that the "
            f"node's sshd trusts its CA ({cert.ca_fingerprint}: "
            "TrustedUserCAKeys) and has not revoked it"
        )
    return None
