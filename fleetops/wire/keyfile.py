"""An identity file read as text, never decrypted and without paramiko: whether it needs a
passphrase (openssh-key-v1's cipher name, PEM's `Proc-Type: 4,ENCRYPTED`, PKCS#8's `ENCRYPTED
PRIVATE KEY`) and its public key as ssh-agent names it; and the words each key failure is named
with, the same on both transports."""

from __future__ import annotations

import base64
import binascii
import os
import struct

from .connector import TransportError

V1_MAGIC = b"openssh-key-v1\0"
MAX_KEY_BYTES = 256 * 1024  # an RSA-16384 key is ~13 KiB of text: anything far larger is no key
_BEGIN = "-----BEGIN "
_PEM_KINDS = ("RSA PRIVATE KEY", "DSA PRIVATE KEY", "EC PRIVATE KEY")


def _armored(path: str) -> tuple[str, list[str]] | None:
    """The first armored block of the file: its kind (`OPENSSH PRIVATE KEY`) and its lines up to
    its END line (headers and base64). None when there is none. Raises OSError."""
    with open(path, "rb") as f:
        text = f.read(MAX_KEY_BYTES).decode("ascii", "replace")
    lines = [line.strip() for line in text.splitlines()]
    for i, line in enumerate(lines):
        if line.startswith(_BEGIN) and line.endswith("-----"):
            kind = line[len(_BEGIN) : -5]
            body: list[str] = []
            for rest in lines[i + 1 :]:
                if rest.startswith("-----END "):
                    return kind, body
                body.append(rest)
            return None
    return None


def _strings(data: bytes, pos: int, count: int) -> tuple[list[bytes], int]:
    """`count` SSH wire strings (uint32 length, bytes) from pos; ValueError when cut short."""
    out = []
    for _ in range(count):
        if pos + 4 > len(data):
            raise ValueError("cut short")
        (size,) = struct.unpack_from(">I", data, pos)
        pos += 4
        if pos + size > len(data):
            raise ValueError("cut short")
        out.append(data[pos : pos + size])
        pos += size
    return out, pos


def _v1(body: list[str]) -> tuple[str, bytes | None] | None:
    """openssh-key-v1: its cipher name and its first public key (stored in the clear)."""
    try:
        data = base64.b64decode("".join(body), validate=True)
    except (binascii.Error, ValueError):
        return None
    if not data.startswith(V1_MAGIC):
        return None
    try:
        (cipher, _kdf, _options), pos = _strings(data, len(V1_MAGIC), 3)
        if pos + 4 > len(data):
            return cipher.decode("ascii", "replace"), None
        (count,) = struct.unpack_from(">I", data, pos)
        public = _strings(data, pos + 4, 1)[0][0] if count else None
    except ValueError:
        return None
    return cipher.decode("ascii", "replace"), public


def encrypted(path: str) -> bool | None:
    """Whether the private key file needs a passphrase: None when it cannot be read or is in no
    format named here (ssh then says what it makes of it)."""
    try:
        found = _armored(path)
    except OSError:
        return None
    if found is None:
        return None
    kind, body = found
    if kind == "OPENSSH PRIVATE KEY":
        v1 = _v1(body)
        return None if v1 is None else v1[0] != "none"
    if kind == "ENCRYPTED PRIVATE KEY":
        return True
    if kind == "PRIVATE KEY":
        return False
    if kind in _PEM_KINDS:
        return any(
            line.partition(":")[0] == "Proc-Type" and "ENCRYPTED" in line.partition(":")[2]
            for line in body
        )
    return None


def public_blob(path: str) -> bytes | None:
    """The public key of `path` as ssh-agent names it: from PATH.pub as OpenSSH reads it, else from
    an openssh-key-v1 file's clear header (no decryption either way)."""
    try:
        with open(f"{path}.pub", encoding="utf-8") as f:
            words = f.read().split()
        if len(words) >= 2:
            return base64.b64decode(words[1], validate=True)
    except (OSError, UnicodeDecodeError, binascii.Error):
        pass
    try:
        found = _armored(path)
    except OSError:
        return None
    if found is None or found[0] != "OPENSSH PRIVATE KEY":
        return None
    v1 = _v1(found[1])
    return None if v1 is None else v1[1]


def missing_identity(who: str, path: str, where: str) -> TransportError | None:
    """The error for an identity file that is not there (OpenSSH would go on without it; a key the
    operator named and that cannot be used is a mistake to say, not to hide behind an authentication
    failure)."""
    if os.path.exists(os.path.expanduser(path)):
        return None
    return TransportError("auth", f"{who}: identity file {path} not found; check {where}")


def wrong_passphrase(who: str, path: str) -> TransportError:
    return TransportError(
        "auth",
        f"{who}: wrong passphrase for {path}; type it again "
        "(--prompt-for-passphrase), fix identity_passphrase in the inventory, or "
        f"load the key into ssh-agent (ssh-add {path})",
    )


def no_passphrase(who: str, path: str) -> TransportError:
    return TransportError(
        "auth",
        f"{who}: the private key {path} is encrypted and no passphrase was given; "
        f"load it into ssh-agent (ssh-add {path}), run with --prompt-for-passphrase, "
        "or set identity_passphrase ({secret_from_env: VAR}) in the inventory",
    )


def unreadable_key(who: str, path: str, reason: str) -> TransportError:
    return TransportError(
        "auth",
        f"{who}: cannot read the private key {path} ({reason}); check that "
        "identity_file in the inventory (or fab -i) names an OpenSSH private key",
    )
