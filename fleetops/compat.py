"""Every private name of paramiko and Invoke that fleetops uses, in this one module: each fast path
is checked the first time it is asked about (the names exist, methods take the arguments used here)
and has a public path that its callers take when the check fails or the operator switches it off.
Correct either way; the fast path only saves time (docs/perf.md has what each one buys).

    FLEETOPS_PUBLIC_ONLY=1              every fast path off: public APIs only (the escape hatch when
                                        a new paramiko or Invoke breaks one)
    FLEETOPS_PUBLIC_ONLY=name,name      only those off (names: FAST_PATHS)

PyYAML needs no private name (plans/yamlload.py builds its C loader on the public yaml.CSafeLoader).
Fabric and Invoke are extended only through their public hooks (cli.py, fab/): the one private
method, Invoke's Program._make_parser, is overridden here (NamedTasksParser).

paramiko is imported only when a paramiko fast path is asked about or used (the wire imports it
anyway): `fleet` imports this module for its parser, and its start (--version, --help, a run up to
its first connection) loads no SSH code. So each check runs the first time its fast path is asked
about, and the classes built on paramiko's (PipelinedAuth, IndexedHostKeys) are made on first
use."""

from __future__ import annotations

import functools
import inspect
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from invoke.config import Config
from invoke.parser import Parser, ParserContext
from invoke.program import Program

if TYPE_CHECKING:
    import paramiko

SWITCH = "FLEETOPS_PUBLIC_ONLY"

# name -> (the private names it uses, what it buys)
FAST_PATHS: dict[str, tuple[tuple[str, ...], str]] = {
    "pipelined_auth": (
        (
            "paramiko AuthHandler._request_auth",
            "AuthHandler._parse_service_accept",
            "Transport.auth_publickey's body",
        ),
        "the login request sent behind the service request: one round trip per connection",
    ),
    "session_ahead": (
        (
            "paramiko Transport._next_channel",
            "Transport._channels",
            "Transport._send_message",
            "Channel._set_transport",
            "Channel._set_window",
            "Transport.open_channel's wait, copied",
        ),
        "the session channel opened behind the login request: one round trip per connection "
        "(only with pipelined_auth)",
    ),
    "indexed_host_keys": (
        ("paramiko HostKeys._entries", "the lookup's SubDict._hostkeys"),
        "known_hosts looked up by name instead of scanned: O(hosts) instead of O(hosts^2) per run",
    ),
    "shared_host_keys": (
        ("paramiko SSHClient._host_keys",),
        "known_hosts parsed once per run instead of once per connection",
    ),
    "shared_config": (
        ("Invoke Config._modify", "Config._remove"),
        "a write to the Fabric config all connections share fails at once instead of racing with "
        "the connections reading it (a reader saw no keys at all, once in 1920 runs)",
    ),
    "quiet_prefetch": (
        (
            "paramiko SFTPFile._prefetch_thread (its name, in a thread's traceback)",
            "threading.excepthook, for the whole process",
        ),
        "an SFTP download read ahead by paramiko's prefetch thread (up to 64 requests in flight) "
        "instead of one request per chunk read, with "
        "that thread's death at a closed link unprinted",
    ),
    "task_parser": (
        ("Invoke Program._make_parser",),
        "parser contexts built for the tasks the command line names, not for all of them",
    ),
}


def _arity(cls: type, name: str, wanted: int) -> str | None:
    """None when cls.name is a function taking `wanted` arguments after self, else why not."""
    fn = getattr(cls, name, None)
    if not callable(fn):
        return f"{cls.__module__}.{cls.__qualname__}.{name} is missing"
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]
    # a builtin without a signature: present is all that can be told
    except (TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) <= wanted <= len(positional) or any(
        p.kind is p.VAR_POSITIONAL for p in params
    ):
        return None
    return (
        f"{cls.__module__}.{cls.__qualname__}.{name} "
        f"takes {len(positional)} arguments, not {wanted}"
    )


def _first(*reasons: str | None) -> str | None:
    return next((r for r in reasons if r), None)


def _check_host_keys() -> str | None:
    import paramiko

    keys = paramiko.HostKeys()
    if not isinstance(getattr(keys, "_entries", None), list):
        return "paramiko.HostKeys has no _entries list"
    keys._entries.append(paramiko.hostkeys.HostKeyEntry(["probe"], None))
    found = keys.lookup("probe")
    if getattr(found, "_hostkeys", None) is not keys:
        return "paramiko.HostKeys.lookup's answer has no _hostkeys"
    return None


def _check_client() -> str | None:
    import paramiko

    client = paramiko.SSHClient()
    if getattr(client, "_host_keys", None) is not client.get_host_keys():
        return "paramiko.SSHClient keeps its host keys elsewhere than _host_keys"
    return None


def _check_pipelined_auth() -> str | None:
    import paramiko
    from paramiko.auth_handler import AuthHandler

    return _first(
        _arity(AuthHandler, "_request_auth", 0),
        _arity(AuthHandler, "_parse_service_accept", 1),
        _arity(paramiko.Transport, "auth_publickey", 3),
    )


def _check_session_ahead() -> str | None:
    import paramiko

    return _first(
        _arity(paramiko.Transport, "_next_channel", 0),
        _arity(paramiko.Transport, "_send_message", 1),
        _arity(paramiko.Channel, "_set_transport", 1),
        _arity(paramiko.Channel, "_set_window", 2),
        *(
            None
            if callable(getattr(paramiko.transport.ChannelMap, m, None))
            else f"paramiko.transport.ChannelMap.{m} is missing"
            for m in ("put", "get", "delete")
        ),
    )


def _check_prefetch() -> str | None:
    import paramiko

    if callable(getattr(paramiko.SFTPFile, "_prefetch_thread", None)):
        return None
    return "paramiko.SFTPFile._prefetch_thread is missing"


CHECKS: dict[str, Callable[[], str | None]] = {
    "pipelined_auth": _check_pipelined_auth,
    "session_ahead": _check_session_ahead,
    "indexed_host_keys": _check_host_keys,
    "shared_host_keys": _check_client,
    "shared_config": lambda: _first(_arity(Config, "_modify", 3), _arity(Config, "_remove", 2)),
    "quiet_prefetch": _check_prefetch,
    "task_parser": lambda: _arity(Program, "_make_parser", 0),
}
assert set(CHECKS) == set(FAST_PATHS)

_LOCK = threading.Lock()
# name -> why its check failed (None: it passed); run on first ask
_CHECKED: dict[str, str | None] = {}
_OFF: frozenset[str] = frozenset()  # switched off by the operator


def _switched_off(value: str) -> frozenset[str]:
    value = value.strip().lower()
    if value in ("", "0", "no", "false", "off"):
        return frozenset()
    if value in ("1", "yes", "true", "on", "all"):
        return frozenset(FAST_PATHS)
    return frozenset(w.strip() for w in value.split(",") if w.strip())


def _run_check(name: str) -> str | None:
    try:
        return CHECKS[name]()
    except Exception as exc:  # a check that cannot even run says the name is not what it was
        return f"{type(exc).__name__}: {exc}"


def _reason(name: str) -> str | None:
    """Why the fast path `name` fails its check (None: it passes), checked the first time it is
    asked."""
    with _LOCK:
        if name in _CHECKED:
            return _CHECKED[name]
    # outside the lock: a check may import paramiko, which may take a while
    reason = _run_check(name)
    with _LOCK:
        return _CHECKED.setdefault(name, reason)


def recheck() -> None:
    """Run every check again and read the switch again (tests hide names, then call this)."""
    global _OFF
    checked = {name: _run_check(name) for name in CHECKS}
    with _LOCK:
        _CHECKED.clear()
        _CHECKED.update(checked)
        _OFF = _switched_off(os.environ.get(SWITCH, ""))


def enabled(name: str) -> bool:
    """Whether the fast path `name` (FAST_PATHS) is used: its check passed and it is not switched
    off."""
    return name not in _OFF and _reason(name) is None


def report() -> dict[str, str]:
    """Each fast path: "on", "off (switched off)" or "off (the check's reason)"."""
    out = {}
    for name in FAST_PATHS:
        reason = _reason(name)
        out[name] = "off (switched off)" if name in _OFF else f"off ({reason})" if reason else "on"
    return out


# read when the program starts; the checks when first asked
_OFF = _switched_off(os.environ.get(SWITCH, ""))


# ---------------------------------------------------------------- login and session channel
# (paramiko)
@functools.cache
def _pipelined_auth_class() -> type:
    """PipelinedAuth, made on first use (it subclasses paramiko's AuthHandler)."""
    import paramiko
    from paramiko.auth_handler import AuthHandler

    class PipelinedAuth(AuthHandler):
        """Public-key login one round trip sooner: the USERAUTH_REQUEST goes out right behind the
        SERVICE_REQUEST instead of after the SERVICE_ACCEPT. OpenSSH's sshd handles a connection's
        packets in order, so the request is read once the service is accepted, exactly as if it had
        waited. Only where nothing in the request depends on the server's answer: an OpenSSH server,
        a key that is not RSA (RSA's signature algorithm is chosen from the server's
        server-sig-algs, which may still be in flight). Anything else is paramiko's own sequence."""

        _sent_ahead = False  # until the SERVICE_ACCEPT it went out ahead of arrives
        # for good: the transport opens its session channel right behind the request
        sent_ahead = False

        def _request_auth(self) -> None:
            super()._request_auth()  # SERVICE_REQUEST
            if self.auth_method == "publickey" and _may_send_auth_ahead(
                self.transport, self.private_key
            ):
                accept = paramiko.Message()
                accept.add_string("ssh-userauth")
                accept.rewind()
                # builds, signs and sends the USERAUTH_REQUEST now
                super()._parse_service_accept(accept)
                self._sent_ahead = self.sent_ahead = True

        def _parse_service_accept(self, m: paramiko.Message) -> None:
            if self._sent_ahead:
                self._sent_ahead = False  # the request this accept answers went out with it
                return
            super()._parse_service_accept(m)

    return PipelinedAuth


def auth_publickey_pipelined(
    transport: paramiko.Transport,
    username: str,
    key: paramiko.PKey,
    event: threading.Event | None,
    after_request: Callable[[bool], None],
) -> list[str] | None:
    """paramiko's Transport.auth_publickey with the handler that sends the request ahead
    (PipelinedAuth), its body copied (paramiko has no hook for the auth handler's class): None when
    pipelined_auth is off, and the caller takes paramiko's own. after_request(sent_ahead) runs once
    the request is out."""
    import paramiko

    if not enabled("pipelined_auth"):
        return None
    if not transport.active or not transport.initial_kex_done:
        raise paramiko.SSHException("No existing session")
    my_event = event or threading.Event()
    transport.auth_handler = handler = _pipelined_auth_class()(transport)
    handler.auth_publickey(username, key, my_event)
    after_request(handler.sent_ahead)
    if event is not None:
        return []
    return handler.wait_for_response(my_event)


def _may_send_auth_ahead(transport: paramiko.Transport, key: Any) -> bool:
    key_type = getattr(getattr(key, "public_blob", None), "key_type", None) or key.get_name()
    return "OpenSSH" in (transport.remote_version or "") and "rsa" not in key_type


def open_session_ahead(
    transport: paramiko.Transport, window: int, packet: int
) -> tuple[paramiko.Channel, threading.Event] | None:
    """paramiko's open_channel("session") without the wait for its confirmation: the channel and the
    event its confirmation sets, or None when session_ahead is off (the caller opens it the usual
    way, later). Called with transport.lock held."""
    import paramiko

    channels = getattr(transport, "_channels", None)
    if (
        not enabled("session_ahead")
        or channels is None
        or not hasattr(transport, "channel_events")
        or not hasattr(transport, "channels_seen")
    ):
        return None
    chanid = transport._next_channel()
    m = paramiko.Message()
    m.add_byte(paramiko.common.cMSG_CHANNEL_OPEN)
    m.add_string("session")
    m.add_int(chanid)
    m.add_int(window)
    m.add_int(packet)
    chan = paramiko.Channel(chanid)
    channels.put(chanid, chan)
    transport.channel_events[chanid] = event = threading.Event()
    transport.channels_seen[chanid] = True
    chan._set_transport(transport)
    chan._set_window(window, packet)
    transport._send_message(m)  # the login request is still unanswered: no rekey can be under way
    return chan, event


def confirmed_ahead(
    transport: paramiko.Transport, chan: paramiko.Channel, event: threading.Event, timeout: float
) -> paramiko.Channel:
    """The second half of paramiko's open_channel, its body copied, for a channel open_session_ahead
    sent: wait for OPEN_CONFIRMATION (or failure, or the end)."""
    import paramiko

    deadline = time.monotonic() + timeout
    while not event.wait(0.1):
        if not transport.active:
            break
        if time.monotonic() > deadline:
            raise paramiko.SSHException("Timeout opening channel.")
    if event.is_set() and channel_mapped(transport, chan):  # a refused open is unmapped
        return chan
    raise transport.get_exception() or paramiko.SSHException("Unable to open channel.")


def forget_channel(transport: paramiko.Transport, chan: paramiko.Channel) -> None:
    """A channel opened ahead that sshd never made (its login was refused): unmapped, nothing
    sent."""
    transport._channels.delete(chan.chanid)
    transport.channel_events.pop(chan.chanid, None)


def channel_mapped(transport: paramiko.Transport, chan: paramiko.Channel) -> bool:
    """Whether the transport still maps this channel (a refused open is unmapped by paramiko)."""
    return transport._channels.get(chan.chanid) is chan


# ---------------------------------------------------------------- SFTP read-ahead (paramiko)
def quiet_prefetch_thread() -> bool:
    """Whether a download may use paramiko's read-ahead (SFTPFile.prefetch): True once the hook is
    in place. paramiko reads ahead in a thread of its own (SFTPFile._prefetch_thread); when the link
    closes under it (Ctrl-C, a lost node) that thread dies with "Socket is closed", and Python
    prints its traceback. The copy's own thread already reports the stop, so that one exception is
    not printed; any other thread's is. Off: no read-ahead thread, so nothing to quiet (the download
    waits for each chunk)."""
    if not enabled("quiet_prefetch"):
        return False
    previous = threading.excepthook
    if getattr(previous, "_fleetops_prefetch", False):
        return True

    import paramiko

    def hook(args: threading.ExceptHookArgs) -> None:
        tb, names = args.exc_traceback, set()
        while tb is not None:  # the thread's own frames (Thread.run has dropped its target by now)
            names.add(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
        if "_prefetch_thread" in names and isinstance(
            args.exc_value, (OSError, EOFError, paramiko.SSHException)
        ):
            return
        previous(args)

    hook._fleetops_prefetch = True  # type: ignore[attr-defined]
    threading.excepthook = hook
    return True


# ---------------------------------------------------------------- known_hosts (paramiko)
@functools.cache
def _indexed_host_keys_class() -> type:
    """IndexedHostKeys, made on first use (it subclasses paramiko's HostKeys)."""
    import paramiko

    class IndexedHostKeys(paramiko.HostKeys):
        """paramiko's HostKeys with lookups by index. paramiko scans every entry on each lookup, and
        a connection looks up three times: O(hosts²) per run once known_hosts holds the fleet (~0.14
        ms per host at 128 hosts, ~1 s per run at 800). Plain names come from an index; hashed
        entries (|1|...) are still tried one by one, as they can only be. Same answer, entries in
        file order."""

        # (entries indexed, plain name -> [(position, entry)], hashed entries)
        _index: tuple[int, dict[str, list[tuple[int, Any]]], list[tuple[int, Any]]] | None = None

        def __init__(self, filename: str | None = None) -> None:
            # every connection of a run looks up at once: build it once
            self._index_lock = threading.Lock()
            super().__init__(filename)

        def lookup(self, hostname: str) -> Any:
            with self._index_lock:
                _, plain, hashed = self._index = self._indexed()
                candidates = sorted(
                    {
                        position: entry for position, entry in plain.get(hostname, []) + hashed
                    }.items(),
                    key=lambda item: item[0],
                )
            few = paramiko.HostKeys()
            few._entries = [entry for _, entry in candidates]
            found = few.lookup(hostname)
            if found is not None:
                # a key added through the answer lands here, as in paramiko's own
                found._hostkeys = self
            return found

        def _indexed(self) -> tuple[int, dict[str, list[tuple[int, Any]]], list[tuple[int, Any]]]:
            """The index, extended by the entries added since it was built. paramiko's load() looks
            each line up before adding it (to skip duplicates): rebuilding the whole index then made
            loading O(n²), 0.49 s for an 800-host known_hosts. paramiko only appends entries (add()
            of a known name and type replaces the key in place, which leaves the names as they
            were), so extending it gives the index of a fresh build."""
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

    return IndexedHostKeys


def host_keys(filename: str | None = None) -> paramiko.HostKeys:
    """A known_hosts file's keys (or none): IndexedHostKeys when indexed_host_keys is on, else
    paramiko's."""
    import paramiko

    return (
        _indexed_host_keys_class()(filename)
        if enabled("indexed_host_keys")
        else paramiko.HostKeys(filename)
    )


def share_host_keys(client: paramiko.SSHClient, keys: paramiko.HostKeys) -> bool:
    """Give the client these host keys, shared with every other client (shared_host_keys). False
    when that is off: the caller then loads them into client.get_host_keys() itself."""
    if not enabled("shared_host_keys"):
        return False
    client._host_keys = keys
    return True


# ---------------------------------------------------------------- the shared Fabric config (Invoke)
class RefuseWrites:
    """Mixed into a Config that every connection shares read-only: a write to it would re-merge the
    whole config while other connections read it (a connection reading during that merge sees no
    keys at all), so with shared_config on a write is refused loudly instead of racing. Invoke's
    DataProxy routes every write and delete of the config and its nested sections through
    _modify/_remove."""

    def _modify(self, keypath: tuple[str, ...], key: str, value: str) -> None:
        if enabled("shared_config"):
            raise RuntimeError(
                f"fleetops shares one Fabric config between connections; writing {key!r} to it "
                "would race (a fleetops bug: please report it)"
            )
        super()._modify(keypath, key, value)  # type: ignore[misc]

    def _remove(self, keypath: tuple[str, ...], key: str) -> None:
        if enabled("shared_config"):
            raise RuntimeError(
                f"fleetops shares one Fabric config between connections; removing {key!r} from "
                "it would race (a fleetops bug: please report it)"
            )
        super()._remove(keypath, key)  # type: ignore[misc]


# ---------------------------------------------------------------- the task parser (Invoke)
class NamedTasksParser:
    """Mixed into `fleet`'s Program: Invoke builds a parser context for every task of the
    collection, then deep-copies them all (and formats their repr for a debug line) on every parse:
    ~10 ms of each run's start-up for ~40 tasks. A parse only ever looks up the words typed, so
    contexts for the tasks the command line names (or asks --help for) parse it the same, with the
    same errors. The program sets `named_words` right before Invoke's parse_tasks; shell completion,
    which lists every task, gets Invoke's full parser (it builds one outside parse_tasks), as does
    every parse with task_parser off."""

    named_words: set[str] | None = None

    def _make_parser(self) -> Parser:
        named, self.named_words = self.named_words, None
        collection = getattr(self, "collection", None)
        if named is None or collection is None or not enabled("task_parser"):
            return super()._make_parser()  # type: ignore[misc]
        ignore = self.config.tasks.ignore_unknown_help  # type: ignore[attr-defined]
        contexts = [
            ParserContext(
                name=primary,
                aliases=aliases,
                args=collection[primary].get_arguments(ignore_unknown_help=ignore),
            )
            for primary, aliases in collection.task_names.items()
            if primary in named or any(alias in named for alias in aliases)
        ]
        return Parser(initial=self.initial_context, contexts=contexts)  # type: ignore[attr-defined]


def __getattr__(name: str) -> Any:
    """The classes built on paramiko's, made when first asked for (module attributes, as before)."""
    if name == "PipelinedAuth":
        return _pipelined_auth_class()
    if name == "IndexedHostKeys":
        return _indexed_host_keys_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
