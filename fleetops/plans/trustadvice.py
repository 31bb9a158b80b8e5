"""What a host-key refusal tells the operator to do next: compare the key the node offers with the
one the node itself reports, then trust that fingerprint. The trust command never carries the
offered fingerprint ready to paste: pasted unchecked, it would trust whatever key a machine in the
middle offered."""

from __future__ import annotations

import re

# A SHA256 fingerprint's hash as ssh-keygen -l prints it: 43 base64 characters (OpenSSH drops the
# '=' padding)
_SHA256_HASH = re.compile(r"[A-Za-z0-9+/]{43}")

# paramiko's key type → the host key file OpenSSH keeps for it on the node
HOST_KEY_FILES = {
    "ssh-ed25519": "ssh_host_ed25519_key.pub",
    "ssh-rsa": "ssh_host_rsa_key.pub",
    "ecdsa-sha2-nistp256": "ssh_host_ecdsa_key.pub",
    "ecdsa-sha2-nistp384": "ssh_host_ecdsa_key.pub",
    "ecdsa-sha2-nistp521": "ssh_host_ecdsa_key.pub",
}


def verify_then_trust(
    host: str, offered: str, key_type: str, replace: bool = False, known_hosts: str | None = None
) -> str:
    """The next step after a host key that known_hosts does not have (`replace`: one that differs
    from it); `known_hosts`: the file that trust writes, named so that the operator sees which one
    it is."""
    pub = HOST_KEY_FILES.get(key_type, "ssh_host_*_key.pub")
    into = f" (it writes {known_hosts})" if known_hosts else ""
    return (
        "check it on the node itself, not over this network (its console, the BMC, or a session "
        f"you already trust): `ssh-keygen -lf /etc/ssh/{pub}` must print {offered}; only if it "
        f"does, run: fab -H {host} trust {'--replace ' if replace else ''}--fingerprint "
        f"SHA256:... (the fingerprint the node printed){into}"
    )


def normalize_fingerprint(text: str | None) -> str | None:
    """What the operator typed after --fingerprint, in the form the host's key is compared in:
    `SHA256:` + the hash. The bare hash (copied without its prefix), a lower-case `sha256:` and a
    trailing `=` all name the same key; anything else is returned as typed (and then matches no
    key)."""
    if text is None:
        return None
    word = text.strip()
    prefix, sep, rest = word.partition(":")
    hashed = rest if sep and prefix.upper() == "SHA256" else word if not sep else None
    if hashed is not None and _SHA256_HASH.fullmatch(hashed.rstrip("=")):
        return "SHA256:" + hashed.rstrip("=")
    return word
