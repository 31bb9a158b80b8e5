"""What a host-key refusal tells the operator to do next: compare the key the node offers with the one the node
itself reports, then trust that fingerprint. The trust command never carries the offered fingerprint ready to
paste: pasted unchecked, it would trust whatever key a machine in the middle offered."""

from __future__ import annotations

# paramiko's key type → the host key file OpenSSH keeps for it on the node
HOST_KEY_FILES = {"ssh-ed25519": "ssh_host_ed25519_key.pub", "ssh-rsa": "ssh_host_rsa_key.pub",
                  "ecdsa-sha2-nistp256": "ssh_host_ecdsa_key.pub", "ecdsa-sha2-nistp384": "ssh_host_ecdsa_key.pub",
                  "ecdsa-sha2-nistp521": "ssh_host_ecdsa_key.pub"}


def verify_then_trust(host: str, offered: str, key_type: str, replace: bool = False) -> str:
    """The next step after a host key that known_hosts does not have (`replace`: one that differs from it)."""
    pub = HOST_KEY_FILES.get(key_type, "ssh_host_*_key.pub")
    return (f"check it on the node itself, not over this network (its console, the BMC, or a session you already "
            f"trust): `ssh-keygen -lf /etc/ssh/{pub}` must print {offered}; only if it does, run: "
            f"fab -H {host} trust {'--replace ' if replace else ''}--fingerprint SHA256:... (the fingerprint the "
            "node printed)")
