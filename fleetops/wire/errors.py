"""Error translation: any failure to open an SSH connection becomes one TransportError that names
the host (or the jump host at fault), the cause and the next step."""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from dataclasses import dataclass

import paramiko
from fabric import Connection
from paramiko.pkey import PublicBlob

from ..plans.inventory import Host, plain_host
from ..plans.trustadvice import verify_then_trust
from . import certs
from .connector import TransportError
from .hops import each_hop, transport_of
from .hostkeys import fingerprint_of, known_hosts_files


def _where(cxn: Connection) -> str:
    return f"{cxn.host}:{cxn.port}"


def host_label(host: Host, cxn: Connection) -> str:
    where = _where(cxn)
    return host.name if host.name in (where, f"{cxn.user}@{where}") else f"{host.name} ({where})"


def _refused_hop(cxn: Connection) -> Connection | None:
    """The jump host whose handshake got as far as its key and no further (its key was refused), if
    any."""
    for hop in list(each_hop(cxn))[1:]:
        transport = transport_of(hop)
        if transport is not None and transport.remote_version and not transport.is_authenticated():
            return hop
    return None


def _key_or_login_refused(
    exc: BaseException,
    host: Host,
    cxn: Connection,
    transport: paramiko.Transport | None,
    who: str,
    text: str,
) -> TransportError | None:
    """The SSH-level refusals (a host key, a login): the next step is the operator's, never a
    retry."""
    if isinstance(exc, paramiko.BadHostKeyException):
        return TransportError(
            "hostkey",
            (
                f"{who}: host key does not match known_hosts: expected "
                f"{fingerprint_of(exc.expected_key)}, got {fingerprint_of(exc.key)}; refusing to "
                "connect. If the node was reinstalled, "
                + verify_then_trust(
                    host.name,
                    fingerprint_of(exc.key),
                    exc.key.get_name(),
                    replace=True,
                    known_hosts=known_hosts_files(host, cxn)[0],
                )
            ),
        )
    if isinstance(exc, paramiko.PasswordRequiredException):
        return TransportError(
            "auth",
            f"{who}: the private key is encrypted and no passphrase was given; load it "
            "into ssh-agent (ssh-add KEY), run with --prompt-for-passphrase, or set "
            "identity_passphrase ({secret_from_env: VAR}) in the inventory",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        refused = _certificate_refused(cxn, who)
        if refused is not None:
            return refused
        key = host.identity_file or "the keys ssh_config/ssh-agent offer"
        return TransportError(
            "auth",
            (
                f"{who}: authentication failed for user {cxn.user!r} (refused by sshd: {text}); "
                f"check the user and the key ({key}) and that its public half is in that user's "
                "~/.ssh/authorized_keys on the node"
            ),
        )
    if isinstance(exc, paramiko.SSHException) and "No authentication methods available" in text:
        return TransportError(
            "auth",
            (
                f"{who}: no key to log in with (none given, no ssh-agent, no ~/.ssh/id_* key); "
                "name one: identity_file "
                "in the inventory, IdentityFile in ssh_config, or fab -i KEY"
            ),
        )
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in text:
        server_key = transport.get_remote_server_key() if transport is not None else None
        if server_key is None:
            return TransportError(
                "hostkey",
                f"{who}: unknown host key; refusing to connect. Check it out of band, "
                f"then run: fab -H {host.name} trust --fingerprint <SHA256:...>",
            )
        offered = fingerprint_of(server_key)
        return TransportError(
            "hostkey",
            (
                (
                    f"{who}: unknown host key {offered} "
                    f"({server_key.get_name()}); refusing to connect. "
                )
                + verify_then_trust(
                    host.name,
                    offered,
                    server_key.get_name(),
                    known_hosts=known_hosts_files(host, cxn)[0],
                )
            ),
        )
    return None


def _certificate_refused(cxn: Connection, who: str) -> TransportError | None:
    """A login refused while a certificate was offered (ssh_config's CertificateFile joined to the
    key): its own fault (expired, not yet valid, another login name), else the CA the node does not
    trust."""
    blob = getattr(cxn.connect_kwargs.get("pkey"), "public_blob", None)
    if blob is None:
        return None
    offered = [
        c for c in cxn.ssh_config.get("certificatefile") or [] if _blob_of(c) == blob.key_blob
    ]
    said = certs.refused_login(who, str(cxn.user), offered[:1])
    return TransportError("auth", said) if said else None


def _blob_of(path: str) -> bytes | None:
    try:
        return PublicBlob.from_file(path).key_blob
    except (OSError, ValueError, paramiko.SSHException):
        return None


def connect_error(exc: BaseException, host: Host, cxn: Connection) -> TransportError:
    """Any failure to open an SSH connection → one TransportError whose message names the host, the
    cause and the next step. Nothing here re-raises: no traceback reaches the operator for a network
    fault."""
    who = host_label(host, cxn)
    transport = cxn.client.get_transport() if cxn.client is not None else None
    hop = _refused_hop(cxn) if isinstance(exc, paramiko.SSHException) else None
    if hop is not None:  # a jump host's key was refused: name that host, and trust that one
        # The jump host as it was reached (hops.py): its known_hosts is the inventory's, or its own
        # entry's.
        host = getattr(hop, "fleetops_host", None) or plain_host(hop.original_host)
        who = f"{who}: its jump host {host.name} ({_where(hop)})"
        cxn, transport = hop, hop.client.get_transport()
    text = " ".join(str(exc).split()) or type(exc).__name__
    refusal = _key_or_login_refused(exc, host, cxn, transport, who, text)
    if refusal is not None:
        return refusal
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        # paramiko tried every address of the name; report the cause of the first unless all were
        # refused.
        causes = list(exc.errors.values())
        if causes and not all(getattr(c, "errno", None) == errno.ECONNREFUSED for c in causes):
            return connect_error(causes[0], host, cxn)
    failed = _Failed(exc, host, cxn, transport, who, text)
    for explain in _EXPLAINERS:
        error = explain(failed)
        if error is not None:
            return error
    return TransportError(
        "unreachable",
        f"{who}: connection failed ({type(exc).__name__}: {text}); this is "
        "unexpected: check the node's sshd log and report it with this line",
    )


@dataclass(frozen=True)
class _Failed:
    """A connection that failed, as the explainers below read it."""

    exc: BaseException
    host: Host
    cxn: Connection
    transport: paramiko.Transport | None
    who: str
    text: str


def _unresolved(f: _Failed) -> TransportError | None:
    if not isinstance(f.exc, socket.gaierror):
        return None
    return TransportError(
        "unreachable",
        f"{f.who}: cannot resolve {f.cxn.host!r} ({f.exc.strerror or f.text}); check the name "
        "(the inventory's address, or HostName in ssh_config) and your DNS",
    )


def _refused(f: _Failed) -> TransportError | None:
    refusals = (paramiko.ssh_exception.NoValidConnectionsError, ConnectionRefusedError)
    if not isinstance(f.exc, refusals):
        return None
    # The address that refused: a jump host's, when the hop is the one that is down.
    addr, port = next(iter(getattr(f.exc, "errors", {}) or {}), (f.cxn.host, f.cxn.port))[:2]
    hop = ""
    if f.host.jump and (str(addr), int(port)) != (f.cxn.host, int(f.cxn.port)):
        hop = " (the jump host)"
    return TransportError(
        "unreachable",
        f"{f.who}: connection refused by {addr}:{port}{hop}: no sshd listens there; check that "
        "sshd runs on the node and that the port is right",
    )


_RESET_WORDS = ("reset by peer", "broken pipe", "eof", "connection closed", "socket is closed")


def _reset(f: _Failed) -> TransportError | None:
    resets = (ConnectionResetError, EOFError, BrokenPipeError)
    lower = f.text.lower()
    if not isinstance(f.exc, resets) and not any(w in lower for w in _RESET_WORDS):
        return None
    return TransportError(
        "unreachable",
        f"{f.who}: the connection was closed during the SSH handshake ({f.text}); the port is "
        "not a healthy sshd (sshd refusing clients, MaxStartups, a firewall or proxy in "
        "between); check the port and the node's sshd log, then retry",
    )


def _timed_out(f: _Failed) -> TransportError | None:
    seconds = f.host.connect_timeout
    # A port that accepts TCP and never speaks SSH: paramiko's start_client gives up silently at
    # the timeout and auth then says "No existing session"; a silent address times out in
    # connect().
    if f.transport is not None and not f.transport.remote_version:
        return TransportError(
            "unreachable",
            f"{f.who}: connection timed out after {seconds}s: the port accepted TCP but sent no "
            "SSH banner (not an SSH server, or its sshd is overloaded); check the address and "
            "port",
        )
    if not isinstance(f.exc, (TimeoutError, socket.timeout)):
        return None
    return TransportError(
        "unreachable",
        f"{f.who}: connection timed out after {seconds}s (node down, a firewall, or a wrong "
        "address); check that the node is up and reachable, or raise connect_timeout",
    )


def _os_error(f: _Failed) -> TransportError | None:
    if not isinstance(f.exc, OSError):
        return None
    return TransportError(
        "unreachable",
        f"{f.who}: cannot connect: {f.exc.strerror or f.text}; check the address, the port and "
        "the network path",
    )


def _handshake(f: _Failed) -> TransportError | None:
    if not isinstance(f.exc, paramiko.SSHException):
        return None
    return TransportError(
        "unreachable",
        f"{f.who}: SSH handshake failed ({f.text}); check that the port runs OpenSSH's sshd and "
        "that it accepts this client's algorithms",
    )


# In the order they are tried: the first that recognises the failure words it.
_EXPLAINERS: tuple[Callable[[_Failed], TransportError | None], ...] = (
    _unresolved,
    _refused,
    _reset,
    _timed_out,
    _os_error,
    _handshake,
)
