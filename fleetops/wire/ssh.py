"""The SSH connector: the only module that talks SSH (paramiko, Fabric's Connection). One connection per host
per run, strict host keys, one agent per host per run (one exec; every call a JSON line on its channel, and
a request handed over by submit() sent before the answers before it are in), and the agent zip uploaded only
when the node does not have that exact version. It implements wire.connector.Connector."""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import select
import shlex
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import paramiko
from fabric import Config, Connection
from paramiko.auth_handler import AuthHandler

from remote_scripts.core.protocol import PROTOCOL

from ..identity import operator
from ..plans import sshconfig
from ..plans.inventory import Host, Inventory, UnknownHost, plain_host, split_target
from ..plans.yamlsrc import ConfigError
from ..results import Evidence
from .bundle import ALLOW_INSECURE_VENV, BOOTSTRAP, EXIT_BOOTSTRAP_REFUSED, PYTHON_FLAGS, agent_bundle
from .connector import (
    COUNTERS,
    MAX_ANSWER_BYTES,
    MAX_EXEC_BYTES,
    MAX_STDERR_BYTES,
    STDERR_KEPT_BYTES,
    ExecResult,
    TransportError,
    mib,
)

__all__ = ["NodeConnection", "TransportError", "connect_error", "known_hosts_path", "trust_host",
           "use_ssh_config"]

# paramiko's transport thread logs its own tracebacks (e.g. a missing SSH banner); fleetops reports the
# failure itself, so none of that may reach a user's terminal through logging's last-resort handler.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def fingerprint_of(key: paramiko.PKey) -> str:
    return key.fingerprint if hasattr(key, "fingerprint") else key.get_base64()[:20]


_SHARED_LOCK = threading.Lock()
_HOST_KEYS: dict[str, tuple[float, paramiko.HostKeys]] = {}
_CONFIG: Config | None = None
_SSH_CONFIG_PATH: str | None = None  # fab -S FILE, set by use_ssh_config()
_PLAIN_KEYS: tuple[str, ...] = ()  # fab -i KEY: offered to hosts outside the inventory


def use_ssh_config(path: str | None, identity_files: list[str] | tuple[str, ...] = ()) -> frozenset[str]:
    """Connect with this ssh_config file from now on (Fabric's -S; None: $FLEETOPS_SSH_CONFIG, else
    ~/.ssh/config and /etc/ssh/ssh_config), Includes followed; `identity_files` (Fabric's -i) are offered
    to hosts outside the inventory, before ssh_config's IdentityFile (an inventory host uses its own key).
    Returns the names the file defines, for `load_inventory(..., ssh_aliases=...)`, so those names are -H
    words. Raises ConfigError (usage, exit 2) when the file is missing or unparsable."""
    global _CONFIG, _SSH_CONFIG_PATH, _PLAIN_KEYS
    config = _ssh_config(path)
    with _SHARED_LOCK:
        _SSH_CONFIG_PATH, _CONFIG = path, _SharedConfig(ssh_config=config)
        _PLAIN_KEYS = tuple(os.path.expanduser(k) for k in identity_files)
    return ssh_config_aliases(config)


def _ssh_config(path: str | None) -> paramiko.SSHConfig:
    text, files = sshconfig.config_text(path)
    try:
        return paramiko.SSHConfig.from_text(text)
    except paramiko.ssh_exception.ConfigParseError as exc:
        raise ConfigError(sshconfig.chosen_path(path) or ", ".join(files) or "ssh_config", None,
                          f"cannot parse ssh_config: {exc}") from None


def ssh_config_aliases(config: paramiko.SSHConfig) -> frozenset[str]:
    """Literal names of `Host` blocks and `Match host/originalhost` criteria (no wildcards, no negation).
    paramiko's own get_hostnames() fails on a config with a Match block, hence the walk."""
    names: set[str] = set()
    for entry in config._config:  # SSHConfig exposes its blocks no other way
        names.update(entry.get("host", []))
        for match in entry.get("matches", []):
            if match.get("type") in ("host", "originalhost") and not match.get("negate"):
                names.update(str(match.get("param") or "").split(","))
    return frozenset(n for n in names if n and not any(c in n for c in "*?!"))


class _SharedConfig(Config):
    """The process's one Fabric Config, shared read-only by every connection. Cloning it per connection cost
    ~0.4 ms of client CPU per host; sharing is safe only while nothing writes it, because a write
    re-merges the whole config and a connection reading during that merge sees no keys at all ("No attribute
    ... 'authentication'", seen once in 1920 runs when Fabric's `inline_ssh_env` still wrote it). So a write
    is refused loudly instead of racing."""

    def __getattr__(self, key: str) -> Any:
        # invoke asks hasattr(config, "_keypath"/"_root") on reads; a root config has neither, and invoke's
        # miss builds an error message from dir() each time (~0.1 ms per connection).
        if key in ("_keypath", "_root"):
            raise AttributeError(key)
        return super().__getattr__(key)

    def clone(self, into: type[Config] | None = None) -> Config:
        # Fabric clones it for each ProxyJump hop it builds from ssh_config; that copy is the hop's own and
        # Fabric writes to it, so it is a plain Config.
        return super().clone(into=into or Config)

    def _modify(self, keypath: tuple[str, ...], key: str, value: str) -> None:
        raise RuntimeError(f"fleetops shares one Fabric config between connections; writing {key!r} to it "
                           "would race (a fleetops bug: please report it)")

    def _remove(self, keypath: tuple[str, ...], key: str) -> None:
        raise RuntimeError(f"fleetops shares one Fabric config between connections; removing {key!r} from it "
                           "would race (a fleetops bug: please report it)")


def _fabric_config() -> Config:
    """The process's one Fabric Config (building one reads the ssh_config files again)."""
    global _CONFIG
    with _SHARED_LOCK:
        if _CONFIG is None:
            try:
                _CONFIG = _SharedConfig(ssh_config=_ssh_config(_SSH_CONFIG_PATH))
            except ConfigError as exc:
                raise TransportError("refused", f"{exc}; fix or name another file with -S") from None
        return _CONFIG


class _IndexedHostKeys(paramiko.HostKeys):
    """paramiko's HostKeys with lookups by index. paramiko scans every entry on each lookup, and a connection
    looks up three times: O(hosts²) per run once known_hosts holds the fleet (~0.14 ms per host at 128 hosts,
    ~1 s per run at 800). Plain names come from an index; hashed entries (|1|...) are still tried one by one,
    as they can only be. Same answer, entries in file order."""

    # (entries indexed, plain name -> [(position, entry)], hashed entries)
    _index: tuple[int, dict[str, list[tuple[int, Any]]], list[tuple[int, Any]]] | None = None

    def __init__(self, filename: str | None = None) -> None:
        self._index_lock = threading.Lock()  # every connection of a run looks up at once: build it once
        super().__init__(filename)

    def lookup(self, hostname: str) -> Any:
        with self._index_lock:
            _, plain, hashed = self._index = self._indexed()
            candidates = sorted({position: entry for position, entry in plain.get(hostname, []) + hashed}.items(),
                                key=lambda item: item[0])
        few = paramiko.HostKeys()
        few._entries = [entry for _, entry in candidates]
        found = few.lookup(hostname)
        if found is not None:
            found._hostkeys = self  # a key added through the answer lands here, as in paramiko's own
        return found

    def _indexed(self) -> tuple[int, dict[str, list[tuple[int, Any]]], list[tuple[int, Any]]]:
        """The index, extended by the entries added since it was built. paramiko's load() looks each line up
        before adding it (to skip duplicates): rebuilding the whole index then made loading O(n²), 0.49 s for an
        800-host known_hosts. paramiko only appends entries (add() of a known name and type replaces the key in
        place, which leaves the names as they were), so extending it gives the index of a fresh build."""
        count, plain, hashed = self._index or (0, {}, [])
        if count > len(self._entries):  # entries were removed (fleetops never does): start over
            count, plain, hashed = 0, {}, []
        for position in range(count, len(self._entries)):
            entry = self._entries[position]
            if any(h.startswith("|1|") for h in entry.hostnames):
                hashed.append((position, entry))
            for name in set(entry.hostnames):
                if not name.startswith("|1|"):
                    plain.setdefault(name, []).append((position, entry))
        return (len(self._entries), plain, hashed)


def _known_hosts(path: str) -> paramiko.HostKeys:
    """known_hosts parsed once per process and file version, shared by every connection that uses it."""
    mtime = os.stat(path).st_mtime
    with _SHARED_LOCK:
        cached = _HOST_KEYS.get(path)
        if cached is None or cached[0] != mtime:
            cached = _HOST_KEYS[path] = (mtime, _IndexedHostKeys(path))
        return cached[1]


def _known_hosts_files(host: Host, cxn: Connection | None) -> list[str]:
    """The inventory's known_hosts, else ssh_config's UserKnownHostsFile (first named is the one `trust`
    writes), else ~/.ssh/known_hosts."""
    if host.known_hosts:
        return [host.known_hosts]
    named = str((cxn.ssh_config if cxn is not None else {}).get("userknownhostsfile") or "").split()
    return [os.path.expanduser(p) for p in named] or [os.path.expanduser("~/.ssh/known_hosts")]


_MERGED_KEYS: dict[tuple, paramiko.HostKeys] = {}


def _host_keys_for(files: list[str]) -> paramiko.HostKeys:
    """The known_hosts files' keys merged, once per process and set of file versions, shared read-only by
    every connection that uses them (merging per connection cost ~14 ms of client CPU per host at N=128:
    paramiko's HostKeys.add scans every entry). With the RejectPolicy nothing ever adds to it."""
    loaded: list[tuple[str, float, paramiko.HostKeys]] = []
    for path in files:
        try:
            mtime = os.stat(path).st_mtime
            entries = _known_hosts(path)
        except FileNotFoundError:
            continue
        except (OSError, paramiko.SSHException, ValueError) as exc:
            raise TransportError("hostkey", f"cannot read known_hosts {path}: {exc}; fix or remove that file") \
                from None
        loaded.append((path, mtime, entries))
    key = tuple((path, mtime) for path, mtime, _ in loaded)
    with _SHARED_LOCK:
        merged = _MERGED_KEYS.get(key)
    if merged is not None:
        return merged
    if len(loaded) == 1:
        merged = loaded[0][2]
    else:
        merged = _IndexedHostKeys()
        for _, _, entries in loaded:
            for name, entry in entries.items():
                for keytype, hostkey in entry.items():
                    merged.add(name, keytype, hostkey)
    with _SHARED_LOCK:
        return _MERGED_KEYS.setdefault(key, merged)


_KEYS: dict[tuple, paramiko.PKey | None] = {}


def _identity_key(path: str, passphrase: str | None) -> paramiko.PKey | None:
    """The inventory's identity file loaded once per process and file version. paramiko loads key_filename
    anew for every connection, trying each key type in turn (three parses of an ed25519 key per host: issue
    16). None when it cannot be loaded here: then paramiko loads it itself and reports why, as before."""
    try:
        st = os.stat(os.path.expanduser(path))
    except OSError:
        return None
    cache_key = (path, st.st_mtime_ns, st.st_size, passphrase)
    with _SHARED_LOCK:
        if cache_key in _KEYS:
            return _KEYS[cache_key]
    try:
        key: paramiko.PKey | None = paramiko.PKey.from_path(os.path.expanduser(path), passphrase)
    except Exception:  # any failure: paramiko's own load names it, as without the cache
        key = None
    with _SHARED_LOCK:
        return _KEYS.setdefault(cache_key, key)


def _strict_client(files: list[str]) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client._host_keys = _host_keys_for(files)  # shared, read-only (see _host_keys_for)
    # Fabric auto-adds unknown host keys, and ssh_config's StrictHostKeyChecking is not consulted: a fleet
    # tool connects only to keys the operator trusted (`trust --fingerprint`).
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


class _PipelinedAuth(AuthHandler):
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


class _FleetTransport(paramiko.Transport):
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
        # paramiko's own body, with the handler that sends the request ahead (_PipelinedAuth)
        if not self.active or not self.initial_kex_done:
            raise paramiko.SSHException("No existing session")
        my_event = event or threading.Event()
        self.auth_handler = handler = _PipelinedAuth(self)
        handler.auth_publickey(username, key, my_event)
        if handler.sent_ahead and self.session_ahead:
            self._open_session_ahead()
        if event is not None:
            return []
        return handler.wait_for_response(my_event)

    session_ahead = True  # a node's connection runs a session; a jump host's only forwards (_JumpTransport)

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


class _JumpTransport(_FleetTransport):
    """A jump host's connection: it only forwards to the next hop, so it opens no session ahead."""

    session_ahead = False


class _Connection(Connection):
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


_OWN = object()  # _fabric_connection: the gateway comes from the host's own entry (inventory, ssh_config)
MAX_JUMPS = 8  # ProxyJump hops one connection may go through, all chains together


def _fabric_connection(host: Host, inventory: Inventory | None, depth: int = 0, gateway: Any = _OWN,
                       trail: tuple[tuple[str, int, str], ...] = ()) -> Connection:
    """The Connection for `host` (not opened). `gateway`: the hop it goes through when a ProxyJump list names
    the one before it; `trail`: the endpoints being reached through this one (a loop back to one is refused)."""
    if host.example:
        raise TransportError("refused", f"{host.name} comes from an example inventory ({host.source}); copy it to "
                                        "your own hosts/*.yaml to use it")
    config = _fabric_config()
    if gateway is _OWN and host.jump and not host.plain:
        if depth > 3:
            raise TransportError("unreachable", f"jump chain too long at {host.name}")
        try:
            # Through the inventory: names, user@name:port, ssh_config aliases; a typo is refused with a
            # "did you mean" instead of becoming a DNS lookup.
            jump = inventory.resolve(host.jump) if inventory else plain_host(host.jump)
        except UnknownHost as exc:
            raise TransportError("refused", f"{host.name}: its jump host: {exc}") from None
        gateway = _fabric_connection(jump, inventory, depth + 1)
    elif gateway is _OWN:
        gateway = _ssh_config_jump(host, inventory, config, depth, trail)
    connect_kwargs: dict = {"banner_timeout": host.connect_timeout, "auth_timeout": host.connect_timeout,
                            "transport_factory": _JumpTransport if depth else _FleetTransport}
    if host.identity_file:
        connect_kwargs.update(key_filename=host.identity_file, look_for_keys=False, allow_agent=False)
        key = _identity_key(host.identity_file, host.identity_passphrase)
        if key is not None:  # tried first; key_filename stays, so a refusal reads as it always did
            connect_kwargs["pkey"] = key
    if host.identity_passphrase:
        connect_kwargs["passphrase"] = host.identity_passphrase
    try:
        if host.plain:
            # ssh_config decides HostName, IdentityFile, ProxyJump; a user or port typed in the -H word wins
            # over its User/Port, as `ssh -l`/`-p` do.
            user, _, port = split_target(host.name)
            if _PLAIN_KEYS:
                connect_kwargs["key_filename"] = list(_PLAIN_KEYS)
            cxn = _Connection(host.address, user=user, port=port, connect_timeout=host.connect_timeout,
                              connect_kwargs=connect_kwargs, gateway=gateway, config=config)
        else:
            cxn = _Connection(host.address, user=host.user, port=host.port, connect_timeout=host.connect_timeout,
                              connect_kwargs=connect_kwargs, gateway=gateway, config=config)
    except (ValueError, TypeError, UnknownHost) as exc:  # e.g. a Port in ssh_config that is not a number
        raise TransportError("refused", f"{host.name}: cannot use its ssh_config entry: {exc}") from None
    except RecursionError:  # Fabric's own ProxyJump walk (a gateway it looks up itself); ours refuses loops first
        raise TransportError("refused", f"{host.name}: its ssh_config ProxyJump chain never ends (a loop); fix "
                                        "ProxyJump in ssh_config") from None
    cxn.client = _strict_client(_known_hosts_files(host, cxn))
    cxn.fleetops_name = host.name
    _strict_gateways(cxn)
    return cxn


def _endpoint(name: str, user: str | None, port: int | None, config: Config) -> tuple[str, int, str]:
    """(HostName, Port, User) that a connection to `name` would use, per ssh_config (a user or port given wins)."""
    entry = config.base_ssh_config.lookup(name)
    try:
        real_port = int(port or entry.get("port") or 22)
    except ValueError:
        real_port = 22  # reported where the connection is made (a Port that is not a number)
    return str(entry.get("hostname") or name), real_port, str(user or entry.get("user") or config.user)


def _ssh_config_jump(host: Host, inventory: Inventory | None, config: Config, depth: int,
                     trail: tuple[tuple[str, int, str], ...]) -> Any:
    """The gateway ssh_config's ProxyJump gives a connection to `host`, built as OpenSSH builds it, or None when
    it names none (Fabric then applies a ProxyCommand, if any). For `ProxyJump h1,h2`: h1 is reached directly
    (or through its own ProxyJump), h2 through h1, the host through h2. Every hop gets the strict host key
    check. Refused, never silently dropped or recursed into: a hop that is the host itself or a connection
    being made through it (a loop: the same HostName, Port and User, as OpenSSH's "jumphost loop"), a chain
    of more than MAX_JUMPS hops, a hop that is not user@name:port."""
    if host.plain:
        user, _, port = split_target(host.name)
    else:
        user, port = host.user, host.port
    raw = str(config.base_ssh_config.lookup(host.address).get("proxyjump") or "").strip()
    if not raw:
        return None
    if raw.lower() == "none":
        return False  # not None: that would make Fabric look it up again, and take "none" for a host name
    here = _endpoint(host.address, user, port, config)
    trail = (*trail, here)
    words = [w.strip() for w in raw.split(",") if w.strip()]
    if len(trail) + len(words) > MAX_JUMPS + 1:
        raise TransportError("refused", f"{host.name}: its ssh_config ProxyJump chain is longer than {MAX_JUMPS} "
                                        f"hops (at {raw!r}); a loop? Fix ProxyJump in ssh_config")
    previous: Any = _OWN
    for word in words:
        try:
            hop = plain_host(word)
        except UnknownHost as exc:
            raise TransportError("refused", f"{host.name}: its ssh_config ProxyJump {raw!r}: {exc}") from None
        hop_user, _, hop_port = split_target(word)
        end = _endpoint(hop.address, hop_user, hop_port, config)
        if end in trail:
            path = " -> ".join(f"{u}@{h}:{p}" for h, p, u in (*trail, end))
            itself = "itself" if end == here else "a host that is reached through it"
            raise TransportError("refused", f"{host.name}: ssh_config ProxyJump loop: {path} (the jump host "
                                            f"{word!r} is {itself}); fix ProxyJump in ssh_config (`ProxyJump none` "
                                            "in the jump host's own entry ends a chain)")
        previous = _fabric_connection(hop, inventory, depth + 1, gateway=previous, trail=trail)
    return previous


def _hops(cxn: Connection) -> Iterator[Connection]:
    """The connection, then each jump host it goes through, nearest first (a ProxyCommand gateway ends it)."""
    hop: object = cxn
    while isinstance(hop, Connection):
        yield hop
        hop = hop.gateway


def _transport(hop: Connection) -> paramiko.Transport | None:
    return hop.client.get_transport() if hop.client is not None else None


def _strict_gateways(cxn: Connection) -> None:
    """A ProxyJump from ssh_config (a host outside the inventory) makes Fabric build the jump Connections
    itself, with its auto-add client: give each hop the strict client, its known_hosts from its own entry."""
    for hop in list(_hops(cxn))[1:]:
        if not isinstance(getattr(hop.client, "_policy", None), paramiko.RejectPolicy):  # not one of ours
            hop.client = _strict_client(_known_hosts_files(plain_host(hop.original_host), hop))


class _CaptureKey(paramiko.MissingHostKeyPolicy):
    """Records the key an unknown host offers, then refuses it (used only by `trust`)."""

    def __init__(self) -> None:
        self.key: paramiko.PKey | None = None

    def missing_host_key(self, client, hostname, key):  # paramiko's signature
        self.key = key
        raise paramiko.SSHException(f"captured host key for {hostname}")


def known_hosts_path(host: Host) -> str:
    return _known_hosts_files(host, None)[0]


def _where(cxn: Connection) -> str:
    return f"{cxn.host}:{cxn.port}"


def _who(host: Host, cxn: Connection) -> str:
    where = _where(cxn)
    return host.name if host.name in (where, f"{cxn.user}@{where}") else f"{host.name} ({where})"


def _refused_hop(cxn: Connection) -> Connection | None:
    """The jump host whose handshake got as far as its key and no further (its key was refused), if any."""
    for hop in list(_hops(cxn))[1:]:
        transport = _transport(hop)
        if transport is not None and transport.remote_version and not transport.is_authenticated():
            return hop
    return None


def connect_error(exc: BaseException, host: Host, cxn: Connection) -> TransportError:
    """Any failure to open an SSH connection → one TransportError whose message names the host, the cause
    and the next step. Nothing here re-raises: no traceback reaches the operator for a network fault."""
    who, seconds = _who(host, cxn), host.connect_timeout
    transport = cxn.client.get_transport() if cxn.client is not None else None
    hop = _refused_hop(cxn) if isinstance(exc, paramiko.SSHException) else None
    if hop is not None:  # a jump host's key was refused: name that host, and trust that one
        name = getattr(hop, "fleetops_name", None)
        # An inventory jump keeps the inventory's known_hosts; an ssh_config jump reads its own entry.
        host = replace(host, name=name) if name else plain_host(hop.original_host)
        who = f"{who}: its jump host {host.name} ({_where(hop)})"
        cxn, transport = hop, hop.client.get_transport()
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, paramiko.BadHostKeyException):
        return TransportError("hostkey", (
            f"{who}: host key does not match known_hosts: expected {fingerprint_of(exc.expected_key)}, got "
            f"{fingerprint_of(exc.key)}; refusing to connect. If the node was reinstalled, check the new key "
            f"out of band, then run: fab -H {host.name} trust --replace --fingerprint {fingerprint_of(exc.key)}"))
    if isinstance(exc, paramiko.PasswordRequiredException):
        return TransportError("auth", f"{who}: the private key is encrypted and no passphrase was given; set "
                                      "identity_passphrase ({secret_from_env: VAR}) in the inventory")
    if isinstance(exc, paramiko.AuthenticationException):
        key = host.identity_file or "the keys ssh_config/ssh-agent offer"
        return TransportError("auth", (
            f"{who}: authentication failed for user {cxn.user!r} (refused by sshd: {text}); check the user and the "
            f"key ({key}) and that its public half is in that user's ~/.ssh/authorized_keys on the node"))
    if isinstance(exc, paramiko.SSHException) and "No authentication methods available" in text:
        return TransportError("auth", (
            f"{who}: no key to log in with (none given, no ssh-agent, no ~/.ssh/id_* key); name one: identity_file "
            "in the inventory, IdentityFile in ssh_config, or fab -i KEY"))
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in text:
        key = transport.get_remote_server_key() if transport is not None else None
        if key is None:
            return TransportError("hostkey", f"{who}: unknown host key; refusing to connect. Check it out of band, "
                                             f"then run: fab -H {host.name} trust --fingerprint <SHA256:...>")
        offered = fingerprint_of(key)
        return TransportError("hostkey", (
            f"{who}: unknown host key {offered} ({key.get_name()}); refusing to connect. Check it out of band "
            f"(ssh-keygen -lf on the node's host key), then run: fab -H {host.name} trust --fingerprint {offered}"))
    if isinstance(exc, socket.gaierror):
        return TransportError("unreachable", (
            f"{who}: cannot resolve {cxn.host!r} ({exc.strerror or text}); check the name (the inventory's "
            "address, or HostName in ssh_config) and your DNS"))
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        # paramiko tried every address of the name; report the cause of the first unless all were refused.
        causes = list(exc.errors.values())
        if causes and not all(getattr(c, "errno", None) == errno.ECONNREFUSED for c in causes):
            return connect_error(causes[0], host, cxn)
    if isinstance(exc, (paramiko.ssh_exception.NoValidConnectionsError, ConnectionRefusedError)):
        # The address that refused: a jump host's, when the hop is the one that is down.
        addr, port = next(iter(getattr(exc, "errors", {}) or {}), (cxn.host, cxn.port))[:2]
        hop = " (the jump host)" if host.jump and (str(addr), int(port)) != (cxn.host, int(cxn.port)) else ""
        return TransportError("unreachable", (
            f"{who}: connection refused by {addr}:{port}{hop}: no sshd listens there; check that sshd runs on the "
            "node and that the port is right"))
    reset = isinstance(exc, (ConnectionResetError, EOFError, BrokenPipeError)) or any(
        w in text.lower() for w in ("reset by peer", "broken pipe", "eof", "connection closed", "socket is closed"))
    if reset:
        return TransportError("unreachable", (
            f"{who}: the connection was closed during the SSH handshake ({text}); the port is not a healthy sshd "
            "(sshd refusing clients, MaxStartups, a firewall or proxy in between); check the port and the node's "
            "sshd log, then retry"))
    if isinstance(exc, (TimeoutError, socket.timeout)) or (transport is not None and not transport.remote_version):
        # A port that accepts TCP and never speaks SSH: paramiko's start_client gives up silently at the
        # timeout and auth then says "No existing session"; a silent address times out in connect().
        if transport is not None and not transport.remote_version:
            return TransportError("unreachable", (
                f"{who}: connection timed out after {seconds}s: the port accepted TCP but sent no SSH banner (not "
                "an SSH server, or its sshd is overloaded); check the address and port"))
        return TransportError("unreachable", (
            f"{who}: connection timed out after {seconds}s (node down, a firewall, or a wrong address); check "
            "that the node is up and reachable, or raise connect_timeout"))
    if isinstance(exc, OSError):
        return TransportError("unreachable", (
            f"{who}: cannot connect: {exc.strerror or text}; check the address, the port and the network path"))
    if isinstance(exc, paramiko.SSHException):
        return TransportError("unreachable", (
            f"{who}: SSH handshake failed ({text}); check that the port runs OpenSSH's sshd and that it accepts "
            "this client's algorithms"))
    return TransportError("unreachable", f"{who}: connection failed ({type(exc).__name__}: {text}); this is "
                                         "unexpected: check the node's sshd log and report it with this line")


def _known_name(cxn: Connection) -> str:
    return cxn.host if int(cxn.port) == 22 else f"[{cxn.host}]:{cxn.port}"


def trust_host(host: Host, inventory: Inventory | None, fingerprint: str | None,
               replace: bool = False) -> tuple[str, str]:
    """Add the host's key to its known_hosts only when the operator names the fingerprint they verified;
    with `replace`, a changed key (a reimaged node) replaces the old entry, again only for the named
    fingerprint. Returns (outcome, message); outcome is trusted / already / refused."""
    cxn = _fabric_connection(host, inventory)
    capture = _CaptureKey()
    cxn.client.set_missing_host_key_policy(capture)
    try:
        cxn.open()
    except paramiko.BadHostKeyException as exc:
        old, new, path = fingerprint_of(exc.expected_key), fingerprint_of(exc.key), _known_hosts_files(host, cxn)[0]
        if replace and fingerprint == new:
            removed = _replace_known_host(path, _known_name(cxn), exc.key)
            return "trusted", f"replaced {old} with {new} for {_known_name(cxn)} in {path} ({removed} old line(s))"
        if replace:
            return "refused", (f"host key CHANGED for {_who(host, cxn)}: the host offers {new}, not the "
                               f"{fingerprint or '(no fingerprint)'} you named; nothing replaced")
        return "refused", (f"host key CHANGED for {_who(host, cxn)}: known_hosts has {old}, the host offers {new}; "
                           "if the change is expected (node reinstalled), check the new key out of band, then run: "
                           f"fab -H {host.name} trust --replace --fingerprint {new}")
    except Exception as exc:  # every failure becomes a message (connect_error), none a traceback
        if capture.key is None:
            raise connect_error(exc, host, cxn) from None
    finally:
        cxn.close()
    if capture.key is None:
        return "already", "host key already in known_hosts and matches"
    offered = fingerprint_of(capture.key)
    if fingerprint is None:
        return "refused", (f"unknown host key {offered} ({capture.key.get_name()}); check it out of band, then run: "
                           f"fab -H {host.name} trust --fingerprint {offered}")
    if fingerprint != offered:
        return "refused", f"the host offers {offered}, not the {fingerprint} you named; nothing trusted"
    path = _known_hosts_files(host, cxn)[0]
    name = _known_name(cxn)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{name} {capture.key.get_name()} {capture.key.get_base64()}\n")
    return "trusted", f"added {offered} for {name} to {path}"


def _replace_known_host(path: str, name: str, key: paramiko.PKey) -> int:
    """known_hosts without the lines for `name` (plain or hashed), plus the new key; written to a temp file
    and renamed, so a crash leaves the old file. Returns how many lines were dropped."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    kept = []
    for line in lines:
        names = line.split(None, 1)[0] if line.strip() and not line.lstrip().startswith("#") else ""
        hashed = [n for n in names.split(",") if n.startswith("|1|")]
        plain = [n for n in names.split(",") if not n.startswith("|1|")]
        if name in plain or any(paramiko.HostKeys.hash_host(name, h.split("|")[2]) == h for h in hashed):
            continue
        kept.append(line if line.endswith("\n") else line + "\n")
    kept.append(f"{name} {key.get_name()} {key.get_base64()}\n")
    tmp = f"{path}.{os.urandom(16).hex()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(kept)
    os.chmod(tmp, os.stat(path).st_mode & 0o777)
    os.replace(tmp, path)
    with _SHARED_LOCK:
        _HOST_KEYS.pop(path, None)
        _MERGED_KEYS.clear()
    return len(lines) - (len(kept) - 1)


# paramiko's transport thread wakes every 0.1 s on a quiet connection to look for our own close, a keepalive
# or a rekey. A fleet run holds every host's connection open while the others work, and at N=128 those
# wakeups cost ~0.5 ms of client CPU per host per second held. Once connected, once a second is
# enough: data, a peer's close or a reset still wake recv at once; only our own close is noticed up to a
# second later, by a daemon thread that has nothing left to do.
IDLE_CHECK_SECONDS = 1.0


def _slow_idle_checks(cxn: Connection) -> None:
    for hop in _hops(cxn):
        transport = _transport(hop)
        if transport is not None and transport.sock is not None:
            transport.sock.settimeout(IDLE_CHECK_SECONDS)


def _close_quietly(cxn: Connection) -> None:
    """Close each hop's SFTP session while the connection still carries its goodbye, then hang up, then let
    Fabric release the rest. Closing never raises: the node may already be gone, and a close that fails must not
    turn a finished run into a traceback (SFTP's close after the hang-up raised EOFError, found by CI).

    Hanging up is a shutdown() of each hop's socket: paramiko's close() only closes the descriptor, and while its
    transport thread sits in recv() the kernel keeps the connection open until that recv times out (up to
    IDLE_CHECK_SECONDS, during which the node's session lives on). shutdown() ends the recv and sends the FIN at
    once."""
    hops = list(_hops(cxn))
    for hop in hops:
        sftp, hop._sftp = hop._sftp, None
        if sftp is not None:
            try:
                sftp.close()
            except (OSError, EOFError, paramiko.SSHException):
                pass  # the connection is gone already: nothing left to say goodbye on
    for hop in hops:
        sock = getattr(_transport(hop), "sock", None)
        if isinstance(sock, socket.socket):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already gone
    try:
        cxn.close()
    except (OSError, EOFError, paramiko.SSHException):
        pass


class NodeConnection:
    """One node, one SSH connection, many agent calls."""

    def __init__(self, host: Host, inventory: Inventory | None = None) -> None:
        self.host = host
        self.inventory = inventory
        self.cxn: Connection | None = None
        self.session: _Session | None = None  # the agent of this run on this host
        self.requests = 0
        self.held: list[_Ticket] = []  # submitted, to go out right behind the next request sent
        self.lock = threading.Lock()
        # The connection being opened, and its sockets, so that close() from another thread (Ctrl-C) ends a
        # connect or a handshake in progress at once instead of after connect_timeout.
        self._opening: Connection | None = None
        self._sockets: list[socket.socket] = []
        self._aborted = False

    # -- connecting
    def open(self) -> None:
        if self.cxn is not None and self.cxn.is_connected:
            return
        host = self.host
        cxn = _fabric_connection(host, self.inventory)
        self._aborted = False
        self._opening = cxn
        try:
            if not cxn.gateway and "sock" not in cxn.connect_kwargs:
                cxn.connect_kwargs["sock"] = self._tcp_connect(cxn)
            cxn.open()
        except Exception as exc:  # connect_error names host, cause, next step for every failure
            error = (TransportError("interrupted", f"{host.name}: connecting was stopped (the run was interrupted) "
                                                   "before the SSH login finished; nothing ran there")
                     if self._aborted else connect_error(exc, host, cxn))
            _close_quietly(cxn)
            raise error from None
        finally:
            self._opening = None
            self._sockets = []
        self.cxn = cxn
        _slow_idle_checks(cxn)
        COUNTERS.bump(host.name, "connections")

    def _tcp_connect(self, cxn: Connection) -> socket.socket:
        """The TCP connection paramiko's SSHClient.connect would make (every address of the name in turn, the
        same errors), on sockets close() can reach while it waits."""
        timeout = cxn.connect_timeout
        infos = socket.getaddrinfo(cxn.host, cxn.port, socket.AF_UNSPEC, socket.SOCK_STREAM)
        to_try = [(i[0], i[4]) for i in infos if i[1] == socket.SOCK_STREAM] or [(i[0], i[4]) for i in infos]
        errors: dict = {}
        for family, addr in to_try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            self._sockets.append(sock)
            if self._aborted:
                raise ConnectionAbortedError(errno.ECONNABORTED, "interrupted")
            try:
                sock.settimeout(timeout)
                sock.connect(addr)
                return sock
            except OSError as exc:
                sock.close()
                if exc.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH):
                    raise
                errors[addr] = exc
        raise paramiko.ssh_exception.NoValidConnectionsError(errors)

    @staticmethod
    def prepare() -> None:
        """Build (or read from its cache) the agent bundle every connection's first request needs."""
        agent_bundle()

    def close(self) -> None:
        """End the agent (its stdin closes: it exits) and the connection, or stop a connect in progress. Safe from
        another thread (Ctrl-C)."""
        opening = self._opening
        if opening is not None:
            self._aborted = True
            for sock in list(self._sockets):
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # a connect() waiting for its SYN-ACK ends at once
                except OSError:
                    pass
            _close_quietly(opening)  # a handshake waiting for the banner, on this hop or a jump host's
        session, self.session = self.session, None
        self.held = []  # never sent: nothing to undo
        if session is not None:
            try:
                session.chan.shutdown_write()
            except (OSError, EOFError, paramiko.SSHException):
                pass
            self._end_session(session)
        if self.cxn is not None:
            _close_quietly(self.cxn)
            self.cxn = None
            COUNTERS.event(self.host.name, "closed")

    # -- raw exec
    def exec(self, argv: list[str], stdin: bytes = b"", timeout: float = 300, shown: str | None = None) -> ExecResult:
        """Run argv (quoted word by word: no value ever becomes shell syntax) with stdin, collect all. `shown`:
        how the evidence names the command (the agent's bootstrap is long; its text is bundle.BOOTSTRAP)."""
        self.open()
        assert self.cxn is not None
        command = shlex.join(argv)
        started = time.monotonic()
        COUNTERS.bump(self.host.name, "execs")
        try:
            chan = self.cxn.transport.open_session(timeout=self.host.connect_timeout)
            _exec_without_waiting(chan, command)
            command = shown or command
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err, code = _drain(chan, started + timeout)
        except paramiko.ChannelException as exc:
            self.close()
            raise _session_refused(self.host, exc, shown or command) from None
        except _Overflow as exc:
            raise TransportError("remote", f"{self.host.name}: {exc}; stopped reading it, the node's outcome is "
                                           "unknown", Evidence(command, None, [], round(time.monotonic() - started,
                                                                                       3))) from None
        except TimeoutError:
            raise TransportError("timeout", f"{self.host.name}: no answer within {timeout:.0f}s",
                                 Evidence(command, None, [], round(time.monotonic() - started, 3))) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.close()
            raise TransportError("lost", f"connection to {self.host.name} lost during the step ({exc or 'EOF'}); "
                                         "the node's outcome is unknown",
                                 Evidence(command, None, [], round(time.monotonic() - started, 3))) from None
        result = ExecResult(command, code, out, err, time.monotonic() - started)
        if code is None:
            self.close()
            raise TransportError("lost", f"connection to {self.host.name} lost during the step; the node's "
                                         "outcome is unknown", result.evidence())
        return result

    # -- the agent
    def _agent_argv(self) -> tuple[list[str], str]:
        """The agent's command, and how evidence shows it: the constant bootstrap (bundle.BOOTSTRAP) checks the
        state dir like StrictModes and runs the zip only if its bytes have the sha256 this client expects."""
        bundle = agent_bundle()
        path = f"{self.host.state_dir}/bin/{bundle.filename}"
        allow = [ALLOW_INSECURE_VENV] if self.inventory is not None and self.inventory.allow_insecure_venv else []
        words = [self.host.state_dir, path, bundle.sha256, *allow]
        return ([self.host.python, *PYTHON_FLAGS, "-c", BOOTSTRAP, *words],
                shlex.join([self.host.python, *PYTHON_FLAGS, "-c", "<fleetops bootstrap>", *words]))

    def upload_agent(self) -> None:
        bundle = agent_bundle()
        self.upload(f"{self.host.state_dir}/bin/{bundle.filename}", bundle.data)
        COUNTERS.bump(self.host.name, "uploads")

    def upload(self, path: str, data: bytes) -> None:
        """Write path atomically over SFTP (temp name, then rename), making its missing folders 0700."""
        self.open()
        try:
            self._upload(path, data)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            reason = getattr(exc, "strerror", None) or " ".join(str(exc).split()) or type(exc).__name__
            raise TransportError("remote", f"{self.host.name}: cannot write {path} on the node over SFTP ({reason}); "
                                           f"check that the login user may write {self.host.state_dir} and the "
                                           "node's free disk space") from None

    def _upload(self, path: str, data: bytes) -> None:
        assert self.cxn is not None
        sftp = self.cxn.sftp()
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        directory = ""
        for part in parent.split("/"):
            directory = f"{directory}/{part}" if directory or parent.startswith("/") else part
            if not part:
                continue
            try:
                sftp.stat(directory)
            except OSError:
                sftp.mkdir(directory, 0o700)
        tmp = f"{path}.{os.urandom(4).hex()}.tmp"
        with sftp.open(tmp, "wb") as f:
            f.write(data)
        sftp.posix_rename(tmp, path)

    def download(self, path: str) -> bytes:
        self.open()
        assert self.cxn is not None
        with self.cxn.sftp().open(path, "rb") as f:
            return f.read()

    def download_to(self, remote: str, local_path: str, offset: int, end: int, progress: object = None) -> int:
        """Bytes [offset, end) of remote, over SFTP, into local_path at offset (truncated there first, so a
        partial copy resumes). progress(n) is called with the bytes written so far. Returns them."""
        self.open()
        assert self.cxn is not None
        written = 0
        try:
            mode = "r+b" if os.path.exists(local_path) else "wb"
            with open(local_path, mode) as out, self.cxn.sftp().open(remote, "rb") as f:
                out.truncate(offset)
                out.seek(offset)
                f.seek(offset)
                f.prefetch(end, max_concurrent_requests=64)
                while offset + written < end:
                    chunk = f.read(min(1 << 20, end - offset - written))
                    if not chunk:
                        raise EOFError(f"{remote} ended at byte {offset + written} (expected {end})")
                    out.write(chunk)
                    written += len(chunk)
                    if callable(progress):
                        progress(written)
        except (EOFError, paramiko.SSHException, OSError) as exc:
            reason = getattr(exc, "strerror", None) or " ".join(str(exc).split()) or type(exc).__name__
            lost = self.cxn is None or not self.cxn.is_connected
            raise TransportError("lost" if lost else "remote", f"{self.host.name}: download of {remote} stopped at "
                                 f"byte {offset + written} ({reason}); run fetch again to resume") from None
        return written

    def call(self, op: str, request: dict, timeout: float = 300) -> tuple[dict, Evidence]:
        """One request to this host's agent: the first call of the run starts it (one exec, through the
        verifying bootstrap), every later one is a line on the same channel. Requests held by
        submit() go out right behind it, before its answer is in."""
        with self.lock:
            ticket = _Ticket(self, op, request, timeout)
            self._send([ticket, *self._take_held()])
            return self._answer_of(ticket)

    def submit(self, op: str, request: dict, timeout: float = 300) -> _Ticket:
        """call(), pipelined (Connector.submit; read-only ops only): sent now, behind the requests in flight,
        or held and sent right behind the next request that goes out. Its answer is read in turn (the agent
        answers in request order) by result()."""
        with self.lock:
            ticket = _Ticket(self, op, request, timeout, ahead=True)
            session = self.session
            if session is not None and session.queue and not self.held and session.alive():
                self._send([ticket])
            else:
                self.held.append(ticket)
            return ticket

    def _take_held(self) -> list[_Ticket]:
        held, self.held = self.held, []
        return held

    def _collect(self, ticket: _Ticket) -> tuple[dict, Evidence]:
        with self.lock:
            if ticket in self.held:  # nothing went out before it (the step it followed made no call): now
                self.held.remove(ticket)
                ticket.ahead = False
                self._send([ticket, *self._take_held()])
            elif ticket.stale:
                # A request of the step before it went out after it, so its answer may predate that request's
                # effect: ask again, in turn (the early answer is read and dropped on the way).
                ticket.dropped = True
                ticket = _Ticket(self, ticket.op, ticket.request, ticket.timeout)
                self._send([ticket, *self._take_held()])
            return self._answer_of(ticket)

    def _discard(self, ticket: _Ticket) -> None:
        with self.lock:
            if ticket in self.held:
                self.held.remove(ticket)
            ticket.dropped = True

    def _send(self, tickets: list[_Ticket]) -> None:
        """Write the request lines on the live agent session (started if there is none: one exec), in order."""
        session = self._agent_session()
        for ticket in tickets:
            self._write(session, ticket)

    def _write(self, session: _Session, ticket: _Ticket, again: bool = False) -> None:
        if ticket.id is None:
            self.requests += 1
            ticket.id = self.requests
        if not ticket.ahead:  # a request of the step itself, after ones sent ahead: theirs may predate it
            for earlier in session.queue:
                earlier.stale = earlier.stale or earlier.ahead
        ahead = ticket.ahead and bool(session.queue)
        payload = (json.dumps({"protocol": PROTOCOL, "op": ticket.op, "state_dir": self.host.state_dir,
                               "operator": operator(), **ticket.request, "_id": ticket.id}) + "\n").encode()
        ticket.session, ticket.sent = session, time.monotonic()
        session.queue.append(ticket)
        try:
            session.chan.sendall(payload)
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the read that follows finds out why (a refusal line, the agent's end, a lost link)
        if not again:
            COUNTERS.event(self.host.name, "sent_ahead" if ahead else "sent", ticket.op)

    def _answer_of(self, ticket: _Ticket) -> tuple[dict, Evidence]:
        """Read answers in request order (keeping earlier tickets' answers on them) up to this ticket's."""
        deadline = time.monotonic() + ticket.timeout
        while not ticket.done:
            session = ticket.session
            if session is None or session is not self.session or not session.queue:
                raise TransportError("lost", f"connection to {self.host.name} lost during the step; the node's "
                                             "outcome is unknown", Evidence(session.shown if session else "(agent)",
                                                                            None, [], 0.0))
            self._read_next(session, ticket, deadline)
        if ticket.error is not None:
            raise ticket.error
        assert ticket.answer is not None and ticket.evidence is not None
        return ticket.answer, ticket.evidence

    def _read_next(self, session: _Session, waiting: _Ticket, deadline: float) -> None:
        """The answer of the oldest request in flight, onto its ticket; when the session ends instead, every
        request in flight gets the error (the one waited for raises it; the others were sent ahead)."""
        head = session.queue[0]
        try:
            line = session.read_line(deadline)
        except _Overflow as exc:
            evidence = session.evidence(None, head.sent)
            self._end_session(session)  # its channel closes: the node's agent goes with it
            self._fail(session, TransportError("remote", f"{self.host.name}: {exc}; its session is dropped and the "
                                                         "node's outcome is unknown (a fleetops agent never sends "
                                                         f"that much: check what {self.host.python} runs on the "
                                                         "node)", evidence))
            return
        except TimeoutError:
            self._end_session(session)  # the agent's watchdog sees its client go and stops where it is
            self._fail(session, TransportError("timeout", f"{self.host.name}: no answer within {waiting.timeout:.0f}s",
                                               session.evidence(None, head.sent)))
            return
        except (OSError, EOFError, paramiko.SSHException) as exc:
            evidence = session.evidence(None, head.sent)
            self.close()
            self._fail(session, TransportError("lost", f"connection to {self.host.name} lost during the step "
                                                       f"({exc or 'EOF'}); the node's outcome is unknown", evidence))
            return
        if line is None:  # the agent ended instead of answering (refused, no interpreter, crashed)
            self._end_session(session)
            code = session.code
            evidence = session.evidence(code, head.sent)
            if code is None:
                self.close()
                error = TransportError("lost", f"connection to {self.host.name} lost during the step; the node's "
                                               "outcome is unknown", evidence)
            elif code == 127:
                error = TransportError("remote", f"{self.host.name}: the target python {self.host.python} was not "
                                                 "found on the node", evidence)
            else:
                error = TransportError("remote", f"{self.host.name}: the node agent failed (exit {code}) before it "
                                                 "answered", evidence)
            self._fail(session, error)
            return
        fresh = session.answered == 0
        session.answered += 1
        try:
            answer = json.loads(line.decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested deeper than Python can
            answer = None
        if not isinstance(answer, dict):
            self._end_session(session)
            self._fail(session, TransportError("remote", f"{self.host.name}: the node agent gave no JSON answer (or "
                                                         "one nested too deeply to read); its session is dropped "
                                                         "and the node's outcome is unknown",
                                               session.evidence(None, head.sent)))
            return
        if answer.get("bootstrap") is True:  # nothing of ours ran; a next call starts afresh
            evidence = session.evidence(EXIT_BOOTSTRAP_REFUSED, head.sent)
            self._end_session(session)
            if fresh and answer.get("error_kind") == "agent_missing" and not session.retried:
                self.upload_agent()  # first visit of this agent version; then every request in flight again
                again = self._agent_session()
                again.retried = True
                for ticket in list(session.queue):
                    self._write(again, ticket, again=True)
                session.queue.clear()
                return
            self._fail(session, TransportError("untrusted", f"{self.host.name}: {answer.get('error')}", evidence))
            return
        evidence = session.evidence(0, head.sent)
        session.answered_one()
        if answer.get("_id") != head.id:
            self.close()
            self._fail(session, TransportError("remote", f"{self.host.name}: the node agent answered out of turn "
                                                         f"(request {head.id}, answer {answer.get('_id')}); "
                                                         "connection reset", evidence))
            return
        session.queue.popleft()
        head.done, head.evidence = True, evidence
        if answer.get("agent_error"):
            head.error = TransportError("remote", f"{self.host.name}: the node agent failed on {head.op}: "
                                                  f"{answer.get('error')} (its traceback is in the node's stderr "
                                                  "below; the agent goes on)", evidence)
        else:
            head.answer = answer
        COUNTERS.event(self.host.name, "answered", head.op)

    @staticmethod
    def _fail(session: _Session, error: TransportError) -> None:
        for ticket in session.queue:
            ticket.done, ticket.error = True, error
        session.queue.clear()

    def _agent_session(self) -> _Session:
        """The live agent of this connection, started if there is none (or the last one ended)."""
        session = self.session
        if session is not None and session.alive():
            return session
        if session is not None:
            self._end_session(session)
        self.open()
        assert self.cxn is not None
        argv, shown = self._agent_argv()
        COUNTERS.bump(self.host.name, "execs")
        try:
            chan = self.cxn.transport.open_session(timeout=self.host.connect_timeout)
            _exec_without_waiting(chan, shlex.join(argv))  # the first request follows in the same flight
        except paramiko.ChannelException as exc:
            self.close()
            raise _session_refused(self.host, exc, shown) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.close()
            raise TransportError("lost", f"connection to {self.host.name} lost while starting the agent "
                                         f"({exc or 'EOF'})", Evidence(shown, None, [], 0.0)) from None
        self.session = _Session(chan, shown)
        return self.session

    def _end_session(self, session: _Session) -> None:
        if self.session is session:
            self.session = None
        try:
            session.chan.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass


class _Ticket:
    """One request of the agent session (wire.connector.Pending): sent at once, or held to go out right behind
    the next request sent; answered in request order, its answer (or error) kept here until asked for."""

    def __init__(self, conn: NodeConnection, op: str, request: dict, timeout: float, ahead: bool = False) -> None:
        self.conn, self.op, self.request, self.timeout = conn, op, request, timeout
        self.ahead = ahead  # handed over before the step it follows has its answer (Connector.submit)
        self.id: int | None = None
        self.session: _Session | None = None
        self.sent = 0.0
        self.done = False
        self.answer: dict | None = None
        self.evidence: Evidence | None = None
        self.error: TransportError | None = None
        self.stale = False  # a request of the step before it went out after it
        self.dropped = False  # discarded: nobody reads its answer

    def result(self) -> tuple[dict, Evidence]:
        return self.conn._collect(self)  # the ticket is the connection's own

    def discard(self) -> None:
        self.conn._discard(self)


class _Overflow(Exception):
    """The node sent more than a session may hold (wire.connector's caps)."""


class _Session:
    """The agent's channel: answers are lines on stdout, in request order (`queue`: the requests sent and not
    yet answered, oldest first); stderr is kept per answer (its last STDERR_KEPT_BYTES). Memory is bounded:
    an answer line over MAX_ANSWER_BYTES or more than MAX_STDERR_BYTES of stderr for one request raise
    _Overflow, and each byte of stdout is searched for the newline once (`scanned`), however it arrives."""

    def __init__(self, chan: paramiko.Channel, shown: str) -> None:
        self.chan = chan
        self.shown = shown
        self.out = bytearray()
        self.scanned = 0  # self.out[:scanned] holds no newline
        self.err = bytearray()
        self.err_bytes = 0  # stderr since the last answer, all of it (self.err keeps only the end)
        self.answered = 0
        self.code: int | None = None  # the agent's exit status once it ended
        self.queue: deque[_Ticket] = deque()
        self.retried = False  # started again after uploading the agent

    def alive(self) -> bool:
        return not self.chan.closed and not self.chan.exit_status_ready()

    def evidence(self, code: int | None, started: float) -> Evidence:
        return ExecResult(self.shown, code, b"", bytes(self.err), time.monotonic() - started).evidence()

    def answered_one(self) -> None:
        """What the agent wrote while serving a request is that request's evidence alone."""
        self.err.clear()
        self.err_bytes = 0

    def _read_stderr(self) -> None:
        chan = self.chan
        while chan.recv_stderr_ready():
            chunk = chan.recv_stderr(65536)
            self.err_bytes += len(chunk)
            self.err += chunk
            if len(self.err) > 2 * STDERR_KEPT_BYTES:
                del self.err[:-STDERR_KEPT_BYTES]
            if self.err_bytes > MAX_STDERR_BYTES:
                raise _Overflow(f"the node agent wrote more than {mib(MAX_STDERR_BYTES)} to stderr while serving "
                                "one request")

    def _line(self) -> bytes | None:
        newline = self.out.find(b"\n", self.scanned)
        if newline < 0:
            self.scanned = len(self.out)
            if self.scanned > MAX_ANSWER_BYTES:
                raise _Overflow(f"the node agent sent more than {mib(MAX_ANSWER_BYTES)} without ending its answer "
                                "line")
            return None
        line = bytes(self.out[:newline])
        del self.out[: newline + 1]
        self.scanned = 0
        return line

    def read_line(self, deadline: float) -> bytes | None:
        """The next answer line, or None when the agent ended first (self.code: its exit status or None).
        Raises _Overflow when the node sends more than the caps allow."""
        chan = self.chan
        while True:
            self._read_stderr()
            line = self._line()
            if line is not None:
                self._read_stderr()  # what the agent wrote before it answered
                return line
            if chan.recv_ready():
                self.out += chan.recv(65536)
                continue
            if chan.exit_status_ready() or chan.closed or chan.eof_received:
                if chan.recv_ready() or chan.recv_stderr_ready():
                    continue
                if chan.exit_status_ready() or not chan.closed:
                    code = chan.recv_exit_status()  # after EOF the status follows at once (or -1 on close)
                    self.code = None if code == -1 else code
                if self.out:  # a last line without its newline
                    line, self.out, self.scanned = bytes(self.out), bytearray(), 0
                    return line if self.code is not None else None
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            select.select([chan], [], [], min(remaining, 1.0))
            transport = chan.get_transport()
            if (transport is None or not transport.is_active()) and not chan.recv_ready() \
                    and not chan.recv_stderr_ready():
                raise EOFError("transport closed")


def _session_refused(host: Host, exc: paramiko.ChannelException, shown: str) -> TransportError:
    # The login worked and sshd would not open a session (MaxSessions 0, a Match block, a restricted key):
    # nothing ran on the node, and no retry can change it.
    return TransportError("refused", f"{host.name}: its sshd accepted the login but refused a session channel "
                                     f"({exc.text}, SSH code {exc.code}); nothing ran there. Check MaxSessions and "
                                     "any Match or ForceCommand for this user in the node's sshd_config",
                          Evidence(shown, None, [], 0.0))


def _exec_without_waiting(chan: paramiko.Channel, command: str) -> None:
    """Channel.exec_command, minus the round trip spent waiting for the server to say it accepted the
    request: stdin follows in the same flight. A refused exec still shows, as a channel closed without an
    exit status (reported as a lost step)."""
    m = paramiko.Message()
    m.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
    m.add_int(chan.remote_chanid)
    m.add_string("exec")
    m.add_boolean(False)  # want_reply: no
    m.add_string(command)
    chan.transport._send_user_message(m)


def _drain(chan: paramiko.Channel, deadline: float) -> tuple[bytes, bytes, int | None]:
    out, err = bytearray(), bytearray()
    while True:
        while chan.recv_ready():
            out += chan.recv(65536)
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        if len(out) + len(err) > MAX_EXEC_BYTES:
            chan.close()
            raise _Overflow(f"the command sent more than {mib(MAX_EXEC_BYTES)} of output")
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
            break
        if chan.closed and not chan.recv_ready() and not chan.recv_stderr_ready():
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            chan.close()
            raise TimeoutError
        select.select([chan], [], [], min(remaining, 1.0))
        if chan.get_transport() is None or not chan.get_transport().is_active():
            if not chan.recv_ready() and not chan.recv_stderr_ready():
                raise EOFError("transport closed")
    code = chan.recv_exit_status() if chan.exit_status_ready() else None
    if code == -1:
        code = None  # paramiko's way of saying the channel closed without an exit status
    chan.close()
    return bytes(out), bytes(err), code
