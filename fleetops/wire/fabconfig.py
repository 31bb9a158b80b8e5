"""ssh_config and Fabric's Config: the file a run connects with (fab -S, -i), parsed once, and the
process's one Fabric Config, shared read-only by every connection."""

from __future__ import annotations

import os
import threading

import paramiko
from fabric import Config

from .. import compat
from ..plans import sshconfig
from ..plans.yamlsrc import ConfigError
from .connector import TransportError

_LOCK = threading.Lock()
_CONFIG: Config | None = None
_SSH_CONFIG_PATH: str | None = None  # fab -S FILE, set by use_ssh_config()
_PLAIN_KEYS: tuple[str, ...] = ()  # fab -i KEY: offered to hosts outside the inventory
_TYPED_PASSPHRASE: str | None = None  # one passphrase for every encrypted key (use_ssh_config's, the library's)
_KEY_PASSPHRASES: dict[str, str] = {}  # --prompt-for-passphrase: what was typed for each encrypted key


def use_ssh_config(path: str | None, identity_files: list[str] | tuple[str, ...] = (),
                   passphrase: str | None = None) -> frozenset[str]:
    """Connect with this ssh_config file from now on (Fabric's -S; None: $FLEETOPS_SSH_CONFIG, else
    ~/.ssh/config and /etc/ssh/ssh_config), Includes followed; `identity_files` (Fabric's -i) are offered
    to hosts outside the inventory, before ssh_config's IdentityFile (an inventory host uses its own key).
    Returns the names the file defines, for `load_inventory(..., ssh_aliases=...)`, so those names are -H
    words. `passphrase` (Fabric's --prompt-for-passphrase) opens encrypted identity files that have no
    identity_passphrase of their own. Raises ConfigError (usage, exit 2) when the file is missing or
    unparsable."""
    global _CONFIG, _SSH_CONFIG_PATH, _PLAIN_KEYS, _TYPED_PASSPHRASE
    config, text = _ssh_config(path)
    with _LOCK:
        _SSH_CONFIG_PATH, _CONFIG = path, _SharedConfig(ssh_config=config)
        _PLAIN_KEYS = tuple(os.path.expanduser(k) for k in identity_files)
        _TYPED_PASSPHRASE = passphrase or None
    # from the text: paramiko's public get_hostnames() fails on a config with a Match block
    return frozenset(sshconfig.host_aliases(text))


def _ssh_config(path: str | None) -> tuple[paramiko.SSHConfig, str]:
    text, files = sshconfig.config_text(path)
    try:
        return paramiko.SSHConfig.from_text(text), text
    except paramiko.ssh_exception.ConfigParseError as exc:
        raise ConfigError(sshconfig.chosen_path(path) or ", ".join(files) or "ssh_config", None,
                          f"cannot parse ssh_config: {exc}") from None


class _SharedConfig(compat.RefuseWrites, Config):
    """The process's one Fabric Config, shared read-only by every connection. Cloning it per connection cost
    ~0.4 ms of client CPU per host; sharing is safe only while nothing writes it, because a write
    re-merges the whole config and a connection reading during that merge sees no keys at all ("No attribute
    ... 'authentication'", seen once in 1920 runs when Fabric's `inline_ssh_env` still wrote it). So a write
    is refused loudly instead of racing (compat.RefuseWrites)."""

    def clone(self, into: type[Config] | None = None) -> Config:
        # Fabric clones it for each ProxyJump hop it builds from ssh_config; that copy is the hop's own and
        # Fabric writes to it, so it is a plain Config.
        return super().clone(into=into or Config)


def fabric_config() -> Config:
    """The process's one Fabric Config (building one reads the ssh_config files again)."""
    global _CONFIG
    with _LOCK:
        if _CONFIG is None:
            try:
                _CONFIG = _SharedConfig(ssh_config=_ssh_config(_SSH_CONFIG_PATH)[0])
            except ConfigError as exc:
                raise TransportError("refused", f"{exc}; fix or name another file with -S") from None
        return _CONFIG


def plain_keys() -> tuple[str, ...]:
    """The keys `fab -i` named, offered to hosts outside the inventory."""
    return _PLAIN_KEYS


def use_key_passphrases(typed: dict[str, str]) -> None:
    """The passphrases typed at --prompt-for-passphrase, one per encrypted key file (keys_to_ask)."""
    with _LOCK:
        _KEY_PASSPHRASES.clear()
        _KEY_PASSPHRASES.update({_real(path): value for path, value in typed.items()})


def typed_passphrase(path: str) -> str | None:
    """The passphrase typed for this key file, if it is encrypted and one was: never one for a key that is not
    encrypted (paramiko would refuse the key)."""
    real = _real(path)
    with _LOCK:
        if real in _KEY_PASSPHRASES:
            return _KEY_PASSPHRASES[real]
        shared = _TYPED_PASSPHRASE
    return shared if shared and encrypted(real) else None


def encrypted(path: str) -> bool:
    """Whether the private key file needs a passphrase to open: paramiko loads it without one and says so."""
    try:
        paramiko.PKey.from_path(_real(path))
    except (paramiko.PasswordRequiredException, TypeError):  # TypeError: cryptography's "no password given"
        return True
    except (OSError, ValueError, paramiko.SSHException):  # missing or no key: said where it is used
        return False
    return False


def _real(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))
