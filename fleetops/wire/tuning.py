"""paramiko tuned for a fleet: identity keys loaded once, AES-GCM first, the login pipelined with the
service request and the session channel, and Fabric's Connection without per-write config merges."""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from typing import Any

import paramiko
from fabric import Connection
from paramiko.auth_handler import AuthHandler

# paramiko's transport thread logs its own tracebacks (e.g. a missing SSH banner); fleetops reports the
# failure itself, so none of that may reach a user's terminal through logging's last-resort handler.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


_LOCK = threading.Lock()
_KEYS: dict[tuple, paramiko.PKey | None] = {}


def identity_key(path: str, passphrase: str | None) -> paramiko.PKey | None:
    """The inventory's identity file loaded once per process and file version. paramiko loads key_filename
    anew for every connection, trying each key type in turn (three parses of an ed25519 key per host: issue
    16). None when it cannot be loaded here: then paramiko loads it itself and reports why, as before."""
    try:
        st = os.stat(os.path.expanduser(path))
    except OSError:
        return None
    cache_key = (path, st.st_mtime_ns, st.st_size, passphrase)
    with _LOCK:
        if cache_key in _KEYS:
            return _KEYS[cache_key]
    try:
        key: paramiko.PKey | None = paramiko.PKey.from_path(os.path.expanduser(path), passphrase)
    except Exception:  # any failure: paramiko's own load names it, as without the cache
        key = None
    with _LOCK:
        return _KEYS.setdefault(cache_key, key)


class PipelinedAuth(AuthHandler):
    """Public-key login one round trip sooner: the USERAUTH_REQUEST goes out right behind the SERVICE_REQUEST
    instead of after the SERVICE_ACCEPT (paramiko waits for it; one RTT of every connection, 50 ms at
    the bench's RTT). OpenSSH's sshd handles a connection's packets in order, so the request is read once the
    service is accepted, exactly as if it had waited. Only where nothing in the request depends on the server's
    answer: an OpenSSH server, a key that is not RSA (RSA's signature algorithm is chosen from the server's
    server-sig-algs, which may still be in flight). Anything else is paramiko's own sequence."""

    _sent_ahead = False  # until the SERVICE_ACCEPT it went out ahead of arrives
    sent_ahead = False  # for good: the transport opens its session channel right behind the request

    def _request_auth(self) -> None:
        super()._request_auth()  # SERVICE_REQUEST
        if self.auth_method == "publickey" and _may_send_auth_ahead(self.transport, self.private_key):
            accept = paramiko.Message()
            accept.add_string("ssh-userauth")
            accept.rewind()
            super()._parse_service_accept(accept)  # builds, signs and sends the USERAUTH_REQUEST now
            self._sent_ahead = self.sent_ahead = True

    def _parse_service_accept(self, m: paramiko.Message) -> None:
        if self._sent_ahead:
            self._sent_ahead = False  # the request this accept answers went out with it
            return
        super()._parse_service_accept(m)


def _may_send_auth_ahead(transport: paramiko.Transport, key: Any) -> bool:
    key_type = getattr(getattr(key, "public_blob", None), "key_type", None) or key.get_name()
    return "OpenSSH" in (transport.remote_version or "") and "rsa" not in key_type


class FleetTransport(paramiko.Transport):
    """paramiko's Transport asking for AES-GCM first (OpenSSH's own order puts it right after chacha20, which
    paramiko lacks). With CTR + HMAC every packet also pays a Python-level MAC comparison and two cipher calls;
    an AEAD cipher is one call: ~0.6 ms less client CPU per connection. A server without GCM still
    gets paramiko's usual list, in paramiko's order."""

    _preferred_ciphers = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com",
                          *(c for c in paramiko.Transport._preferred_ciphers if "gcm" not in c))

    def _parse_debug(self, m: paramiko.Message) -> None:
        # OpenSSH's sshd sends debug messages on every publickey login (the key's options from
        # authorized_keys); paramiko escapes each byte by byte in Python only to log it at DEBUG.
        if self.logger.isEnabledFor(logging.DEBUG):
            super()._parse_debug(m)

    def auth_publickey(self, username: str, key: paramiko.PKey, event: threading.Event | None = None) -> list[str]:
        # paramiko's own body, with the handler that sends the request ahead (PipelinedAuth)
        if not self.active or not self.initial_kex_done:
            raise paramiko.SSHException("No existing session")
        my_event = event or threading.Event()
        self.auth_handler = handler = PipelinedAuth(self)
        handler.auth_publickey(username, key, my_event)
        if handler.sent_ahead and self.session_ahead:
            self._open_session_ahead()
        if event is not None:
            return []
        return handler.wait_for_response(my_event)

    session_ahead = True  # a node's connection runs a session; a jump host's only forwards (JumpTransport)

    # The session channel, opened right behind the login request (one RTT of every connection, 50 ms
    # at the bench's RTT). sshd reads the CHANNEL_OPEN only once the login it follows has succeeded: its
    # pre-login loop returns on success, and the packets already read travel with the connection's state to
    # the logged-in process. The first open_session() takes this channel instead of asking for one (paramiko's
    # open_channel, split in two). If that login is refused, sshd's pre-login loop reads the open and answers
    # UNIMPLEMENTED: the channel is never confirmed, so it is only used after the very login it followed.
    # (channel, its confirmation, the login it followed); paramiko maps channels weakly: this holds it
    _session_ahead: tuple[paramiko.Channel, threading.Event, AuthHandler] | None = None

    def _open_session_ahead(self) -> None:
        window, packet = self.default_window_size, self.default_max_packet_size
        with self.lock:
            if self._session_ahead is not None:  # behind an earlier key, refused
                self._forget(self._session_ahead[0])
            chanid = self._next_channel()
            m = paramiko.Message()
            m.add_byte(paramiko.common.cMSG_CHANNEL_OPEN)
            m.add_string("session")
            m.add_int(chanid)
            m.add_int(window)
            m.add_int(packet)
            chan = paramiko.Channel(chanid)
            self._channels.put(chanid, chan)
            self.channel_events[chanid] = event = threading.Event()
            self.channels_seen[chanid] = True
            chan._set_transport(self)
            chan._set_window(window, packet)
            self._session_ahead = (chan, event, self.auth_handler)
        self._send_message(m)  # the login request is still unanswered: no rekey can be under way

    def open_channel(self, kind: str, dest_addr: Any = None, src_addr: Any = None, window_size: int | None = None,
                     max_packet_size: int | None = None, timeout: float | None = None) -> paramiko.Channel:
        ahead = None
        if kind == "session" and window_size is None and max_packet_size is None:
            with self.lock:
                ahead, self._session_ahead = self._session_ahead, None
        if ahead is not None:
            chan, event, login = ahead
            if login is self.auth_handler and login.is_authenticated():
                return self._opened(chan, event, self.channel_timeout if timeout is None else timeout)
            with self.lock:
                self._forget(chan)  # opened behind a login sshd refused: it will never be confirmed
        return super().open_channel(kind, dest_addr, src_addr, window_size, max_packet_size, timeout)

    def _forget(self, chan: paramiko.Channel) -> None:
        # under self.lock; sshd never made this channel, so there is nothing to close on its side
        self._channels.delete(chan.chanid)
        self.channel_events.pop(chan.chanid, None)

    def _opened(self, chan: paramiko.Channel, event: threading.Event, timeout: float) -> paramiko.Channel:
        # the second half of paramiko's open_channel: wait for OPEN_CONFIRMATION (or failure, or the end)
        deadline = time.monotonic() + timeout
        while not event.wait(0.1):
            if not self.active:
                break
            if time.monotonic() > deadline:
                raise paramiko.SSHException("Timeout opening channel.")
        if event.is_set() and self._channels.get(chan.chanid) is chan:  # a refused open is unmapped
            return chan
        raise self.get_exception() or paramiko.SSHException("Unable to open channel.")

    def _filter_algorithm(self, type_: str) -> tuple[str, ...]:
        # paramiko filters each list against disabled_algorithms on every read (16 per handshake); with
        # nothing disabled the answer is the list itself.
        if not self.disabled_algorithms:
            return tuple(getattr(self, f"_preferred_{type_}"))
        return super()._filter_algorithm(type_)


class JumpTransport(FleetTransport):
    """A jump host's connection: it only forwards to the next hop, so it opens no session ahead."""

    session_ahead = False


class FleetConnection(Connection):
    """Fabric's Connection, with the attributes it and fleetops set declared on the class. Invoke's DataProxy
    turns a write to an undeclared attribute into a config write, and each config write re-merges the whole
    config (about 1 ms of client CPU per connection for Fabric's own `inline_ssh_env` and our `fleetops_name`);
    a declared one is a plain attribute."""

    inline_ssh_env = None
    fleetops_name: str | None = None  # what `trust` takes for this hop (a jump's own inventory name)

    def __setattr__(self, key: str, value: Any) -> None:
        # invoke's DataProxy decides "real attribute or config key" with `key in dir(self)` on every write,
        # ~17 writes per Connection (about 0.3 ms of client CPU per host): the same test, dir() taken once.
        if key in self.__dict__ or key in _class_attributes(type(self)):
            object.__setattr__(self, key, value)
        else:
            super().__setattr__(key, value)


@functools.lru_cache(maxsize=8)
def _class_attributes(cls: type) -> frozenset[str]:
    return frozenset(dir(cls))
