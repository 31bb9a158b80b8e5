"""paramiko tuned for a fleet: identity keys loaded once, AES-GCM first, the login pipelined with
the service request and the session channel (the private parts in fleetops.compat), and Fabric's
Connection without per-write config merges."""

from __future__ import annotations

import functools
import logging
import os
import threading
from typing import Any

import paramiko
from fabric import Connection

from .. import compat

# paramiko's transport thread logs its own tracebacks (e.g. a missing SSH banner); fleetops reports
# the failure itself, so none of that may reach a user's terminal through logging's last-resort
# handler.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


# AEAD ciphers first: one cipher call per packet instead of a cipher and a Python-level MAC
# comparison.
AEAD_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")

_LOCK = threading.Lock()
_KEYS: dict[tuple, paramiko.PKey | None] = {}


def identity_key(path: str, passphrase: str | None) -> paramiko.PKey | None:
    """The inventory's identity file loaded once per process and file version. paramiko loads
    key_filename anew for every connection, trying each key type in turn (three parses of an ed25519
    key per host). None when it cannot be loaded here: then paramiko loads it itself and reports
    why, as before."""
    try:
        st = os.stat(os.path.expanduser(path))
    except OSError:
        return None
    cache_key = (path, st.st_mtime_ns, st.st_size, passphrase)
    with _LOCK:
        if cache_key in _KEYS:
            return _KEYS[cache_key]
    try:
        # from_path hands the passphrase to cryptography, which takes bytes only (a str fails as "no
        # key")
        key: paramiko.PKey | None = paramiko.PKey.from_path(
            os.path.expanduser(path), passphrase.encode() if passphrase else None
        )
    except Exception:  # any failure: paramiko's own load names it, as without the cache
        key = None
    with _LOCK:
        return _KEYS.setdefault(cache_key, key)


class FleetTransport(paramiko.Transport):
    """paramiko's Transport asking for AES-GCM first (OpenSSH's own order puts it right after
    chacha20, which paramiko lacks). With CTR + HMAC every packet also pays a Python-level MAC
    comparison and two cipher calls; an AEAD cipher is one call: ~0.6 ms less client CPU per
    connection. A server without GCM still gets paramiko's usual list, in paramiko's order. The
    login and the session channel go out pipelined where compat allows it (compat.PipelinedAuth,
    compat.open_session_ahead)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = self.get_security_options()  # paramiko's public way to order its algorithms
        first = tuple(c for c in AEAD_FIRST if c in options.ciphers)
        options.ciphers = (*first, *(c for c in options.ciphers if c not in first))

    def auth_publickey(
        self, username: str, key: paramiko.PKey, event: threading.Event | None = None
    ) -> list[str]:
        pipelined = compat.auth_publickey_pipelined(self, username, key, event, self._after_request)
        return super().auth_publickey(username, key, event) if pipelined is None else pipelined

    def _after_request(self, sent_ahead: bool) -> None:
        if sent_ahead and self.session_ahead:
            self.open_session_ahead()

    # a node's connection runs a session; a jump host's only forwards (JumpTransport)
    session_ahead = True

    # The session channel, opened right behind the login request (one RTT of every connection, 50 ms
    # at the bench's RTT). sshd reads the CHANNEL_OPEN only once the login it follows has succeeded:
    # its pre-login loop returns on success, and the packets already read travel with the
    # connection's state to the logged-in process. The first open_session() takes this channel
    # instead of asking for one (paramiko's open_channel, split in two). If that login is refused,
    # sshd's pre-login loop reads the open and answers UNIMPLEMENTED: the channel is never
    # confirmed, so it is only used after the very login it followed. (channel, its confirmation,
    # the login it followed); paramiko maps channels weakly: this holds it
    _ahead: tuple[paramiko.Channel, threading.Event, Any] | None = None

    def open_session_ahead(self) -> None:
        with self.lock:
            if self._ahead is not None:  # behind an earlier key, refused
                compat.forget_channel(self, self._ahead[0])
                self._ahead = None
            opened = compat.open_session_ahead(
                self, self.default_window_size, self.default_max_packet_size
            )
            if opened is not None:
                self._ahead = (*opened, self.auth_handler)

    def open_channel(
        self,
        kind: str,
        dest_addr: Any = None,
        src_addr: Any = None,
        window_size: int | None = None,
        max_packet_size: int | None = None,
        timeout: float | None = None,
    ) -> paramiko.Channel:
        ahead = None
        if kind == "session" and window_size is None and max_packet_size is None:
            with self.lock:
                ahead, self._ahead = self._ahead, None
        if ahead is not None:
            chan, event, login = ahead
            if login is self.auth_handler and login is not None and login.is_authenticated():
                # Transport.channel_timeout (paramiko >= 3.2, public): types-paramiko does not list
                # it yet.
                default = self.channel_timeout  # type: ignore[attr-defined]
                waited = default if timeout is None else timeout
                return compat.confirmed_ahead(self, chan, event, waited)
            with self.lock:
                # opened behind a login sshd refused: it will never be confirmed
                compat.forget_channel(self, chan)
        return super().open_channel(
            kind, dest_addr, src_addr, window_size, max_packet_size, timeout
        )


class JumpTransport(FleetTransport):
    """A jump host's connection: it only forwards to the next hop, so it opens no session ahead."""

    session_ahead = False


class FleetConnection(Connection):
    """Fabric's Connection, with the attributes it and fleetops set declared on the class. Invoke's
    DataProxy turns a write to an undeclared attribute into a config write, and each config write
    re-merges the whole config (about 1 ms of client CPU per connection for Fabric's own
    `inline_ssh_env` and our `fleetops_name`); a declared one is a plain attribute."""

    inline_ssh_env = None
    # what `trust` takes for this hop (a jump's own inventory name)
    fleetops_name: str | None = None
    # the inventory Host this hop was built for (its known_hosts, for a refusal)
    fleetops_host: Any = None
    # the SFTP session sftp() opened, for close_quietly
    fleetops_sftp: paramiko.SFTPClient | None = None

    def sftp(self) -> paramiko.SFTPClient:
        self.fleetops_sftp = client = super().sftp()
        return client

    def __setattr__(self, key: str, value: Any) -> None:
        # invoke's DataProxy decides "real attribute or config key" with `key in dir(self)` on every
        # write, ~17 writes per Connection (about 0.3 ms of client CPU per host): the same test,
        # dir() taken once. Fabric ships no types: to mypy this class derives from Any, whose type
        # it cannot prove hashable.
        if key in self.__dict__ or key in _class_attributes(type(self)):  # type: ignore[arg-type]
            object.__setattr__(self, key, value)
        else:
            super().__setattr__(key, value)


@functools.lru_cache(maxsize=8)
def _class_attributes(cls: type) -> frozenset[str]:
    return frozenset(dir(cls))
