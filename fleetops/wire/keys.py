"""The key a host logs in with, chosen as OpenSSH chooses it for an IdentityFile: ssh-agent's key
whose public half is the file's (the file is then never decrypted), else the file opened with the
inventory's identity_passphrase or the one typed at --prompt-for-passphrase. Each way that fails is
named for what it is: a missing file, an encrypted key with no passphrase, a wrong passphrase, a
file that is no key."""

from __future__ import annotations

import base64
import binascii
import os

import paramiko

from ..plans.host import Host
from .connector import TransportError
from .keyfile import missing_identity, no_passphrase, unreadable_key, wrong_passphrase
from .opensshkeys import keys_to_ask as _keys_to_ask
from .tuning import identity_key


def _public_blob(path: str) -> bytes | None:
    """The public key of `path` as the agent names it: from PATH.pub (OpenSSH's way: it reads the
    public half without decrypting the private file), else from the private file itself when it is
    not encrypted."""
    try:
        with open(f"{path}.pub", encoding="utf-8") as f:
            words = f.read().split()
        return base64.b64decode(words[1], validate=True) if len(words) >= 2 else None
    except (OSError, UnicodeDecodeError, binascii.Error):
        pass
    try:
        return paramiko.PKey.from_path(path).asbytes()
    # encrypted (TypeError: no password) or no key
    except (OSError, ValueError, TypeError, paramiko.SSHException):
        return None


def agent_key_for(path: str) -> paramiko.AgentKey | None:
    """ssh-agent's key (SSH_AUTH_SOCK) whose public half is the identity file's, if the agent holds
    it."""
    if not os.environ.get("SSH_AUTH_SOCK"):
        return None
    blob = _public_blob(path)
    if blob is None:
        return None
    try:
        agent = paramiko.Agent()
        keys = agent.get_keys()
    # an agent that is gone or answers nonsense: as without one
    except (OSError, paramiko.SSHException):
        return None
    for key in keys:
        if key.asbytes() == blob:
            # it keeps the agent's connection open: every signature is asked of the agent
            return key
    agent.close()
    return None


def login_key(who: str, path: str, passphrase: str | None) -> paramiko.PKey:
    """The key to log in with for an identity file, or a TransportError("auth") naming why there is
    none."""
    path = os.path.expanduser(path)
    missing = missing_identity(who, path, "identity_file in the inventory")
    if missing is not None:
        raise missing
    key = agent_key_for(path) or identity_key(path, passphrase)
    if key is not None:
        return key
    raise _unreadable(who, path, passphrase)


def unopenable(who: str, path: str, passphrase: str | None) -> TransportError | None:
    """For a key paramiko will open itself (fab -i): the error when the passphrase given does not
    open it (paramiko would say "Invalid key", read as a handshake fault). None when none was given
    (ssh-agent or another key may still log in) or it opens."""
    if not passphrase or identity_key(os.path.expanduser(path), passphrase) is not None:
        return None
    return _unreadable(who, os.path.expanduser(path), passphrase)


def _unreadable(who: str, path: str, passphrase: str | None) -> TransportError:
    """Why the identity file could not be opened with `passphrase` (only on the way to an error)."""
    try:
        paramiko.PKey.from_path(path, None)
    # TypeError: cryptography's "no password given"
    except (paramiko.PasswordRequiredException, TypeError):
        return wrong_passphrase(who, path) if passphrase else no_passphrase(who, path)
    except (OSError, ValueError, paramiko.SSHException) as exc:
        reason = getattr(exc, "strerror", None) or " ".join(str(exc).split()) or type(exc).__name__
        return unreadable_key(who, path, reason)
    # opens without a passphrase now: it changed since, or the passphrase given does not fit an
    # unencrypted key
    return TransportError(
        "auth",
        f"{who}: cannot open the private key {path} with the passphrase given; check "
        "identity_passphrase in the inventory, or the one typed",
    )


def keys_to_ask(hosts: list[Host]) -> dict[str, list[str]]:
    """opensshkeys.keys_to_ask with paramiko's reading of ssh-agent (no `ssh-add` needed)."""
    return _keys_to_ask(hosts, lambda path: agent_key_for(path) is not None)


def agent_key_lines() -> list[str]:
    """ssh-agent's keys as `ssh-add -l` lists them (Fabric's --list-agent-keys): bits, fingerprint,
    comment, type."""
    return [
        f"{key.get_bits()} {key.fingerprint} {key.comment} ({key.algorithm_name})"
        for key in paramiko.Agent().get_keys()
    ]
