"""What the system `ssh` says when it cannot connect (exit status 255, its stderr), as one
TransportError in the words errors.py uses for the paramiko transport: which host, the cause, the
next step. ssh's text is data: it is matched, never run, and only its lines are quoted."""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from ..plans.host import Host
from ..plans.trustadvice import verify_then_trust
from ..results import Evidence
from . import certs
from .connector import TransportError

SSH_FAILED = 255
# what ssh says when its ProxyCommand (a jump hop) ends
HOP_FAILED = "Connection closed by UNKNOWN port 65535"
_CHANGED = re.compile(
    r"The fingerprint for the (\S+) key sent by the remote host is\s*\r?\n\s*"
    r"(SHA256:[A-Za-z0-9+/=]+)"
)
_OFFENDING = re.compile(r"Offending \S+ key in (.+):(\d+)\s*$", re.M)
_SERVER_KEY = re.compile(r"Server host key: (\S+) (SHA256:[A-Za-z0-9+/=]+)")
_CONNECT = re.compile(r"connect to host (\S+) port (\d+): (.+)")
_RESOLVE = re.compile(r"Could not resolve hostname (\S+): (.+)")
_UNKNOWN_FOR = re.compile(r"host key is known for (\S+) and")
_KEY_TYPES = {"ED25519": "ssh-ed25519", "RSA": "ssh-rsa", "ECDSA": "ecdsa-sha2-nistp256"}


def label(host: Host, where: str) -> str:
    return host.name if host.name in (where, f"{host.user}@{where}") else f"{host.name} ({where})"


def _lines(text: str) -> list[str]:
    return [
        line.strip() for line in text.splitlines() if line.strip() and not line.startswith("@")
    ][-20:]


def fingerprint_of_line(path: str, number: int) -> str | None:
    """The SHA256 fingerprint of the key on line `number` of a known_hosts file (as ssh-keygen -l
    prints it)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for at, line in enumerate(f, 1):
                if at == number:
                    words = line.split()
                    blob = base64.b64decode(
                        words[2 if not words[0].startswith("@") else 3], validate=True
                    )
                    return "SHA256:" + base64.b64encode(
                        hashlib.sha256(blob).digest()
                    ).decode().rstrip("=")
    except (OSError, ValueError, IndexError):
        return None
    return None


def offered_key(argv: list[str], timeout: float) -> tuple[str, str] | None:
    """The key type and fingerprint the node offers, from ssh's own verbose log of one more
    handshake (ssh prints no fingerprint when strict checking refuses an unknown key). None when it
    does not say."""
    probe = [
        *argv[:-2],
        "-v",
        "-o",
        "ControlMaster=no",
        "-o",
        "ControlPath=none",
        *argv[-2:],
        "true",
    ]
    try:
        done = subprocess.run(
            probe,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=timeout,
            check=False,
            start_new_session=True,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = _SERVER_KEY.search(done.stderr.decode("utf-8", "replace"))
    return (found.group(1), found.group(2)) if found else None


def _endpoint(where: str) -> str:
    """`name:port` as ssh names a host in known_hosts: `[name]:port`, or the bare name on port
    22."""
    name, _, port = where.rpartition(":")
    return name if port == "22" else f"[{name}]:{port}"


# the login name and the certificate files ssh offered
Certificates = Callable[[], tuple[str, list[str]]]


def _auth_refused(
    host: Host, who: str, text: str, evidence: Evidence, certificates: Certificates | None
) -> TransportError:
    if certificates is not None:
        login, files = certificates()
        refused = (
            certs.refused_login(who, host.user or login, files) if host.user or login else None
        )
        if refused is not None:
            return TransportError("auth", refused, evidence)
    said = next(
        (line for line in _lines(text) if "Permission denied" in line), " ".join(text.split())
    )
    key = host.identity_file or "the keys ssh_config/ssh-agent offer"
    user = host.user or "the login user"
    return TransportError(
        "auth",
        (
            f"{who}: authentication failed for user {user!r} (refused by sshd: {said}); check "
            f"the user and the key ({key}) and that its public half is in that user's "
            "~/.ssh/authorized_keys on the node"
        ),
        evidence,
    )


def ssh_error(
    host: Host,
    text: str,
    argv: list[str],
    where: str,
    known_hosts: str,
    shown: str = "ssh",
    jump: str = "",
    certificates: Certificates | None = None,
) -> TransportError:
    """ssh's complaint (its stderr, exit 255) as one TransportError naming the host, the cause and
    the step. `jump`: the jump host's word (the inventory's, or ssh_config's ProxyJump), named when
    it is the one at fault. `certificates`: asked only when the login was refused, so that a refused
    certificate is named with its own fault (expired, another login name, a CA the node does not
    trust) as the paramiko transport does."""
    said = _Said(
        host=host,
        text=text,
        flat=" ".join(text.split()),
        argv=argv,
        where=where,
        who=label(host, where),
        known_hosts=known_hosts,
        jump=jump,
        certificates=certificates,
        evidence=Evidence(shown, SSH_FAILED, _lines(text), 0.0),
    )
    for explain in _EXPLAINERS:
        error = explain(said)
        if error is not None:
            return error
    return TransportError(
        "unreachable",
        f"{said.who}: ssh could not connect ({said.flat[:300] or 'exit 255, nothing said'}); "
        "check the node's sshd log and `ssh -v` to it",
        said.evidence,
    )


@dataclass(frozen=True)
class _Said:
    """What ssh said when it exited 255, with what the explainers below need to word it."""

    host: Host
    text: str
    flat: str  # the text on one line
    argv: list[str]
    where: str
    who: str
    known_hosts: str
    jump: str
    certificates: Certificates | None
    evidence: Evidence

    def unreachable(self, msg: str) -> TransportError:
        return TransportError("unreachable", msg, self.evidence)

    def hostkey(self, msg: str) -> TransportError:
        return TransportError("hostkey", msg, self.evidence)


def _jump_key_unknown(s: _Said) -> TransportError | None:
    """The jump host's own key is the unknown one: trust that host, not the one behind it."""
    unknown_for = _UNKNOWN_FOR.search(s.text)
    if not (s.jump and unknown_for and unknown_for.group(1) != _endpoint(s.where)):
        return None
    return s.hostkey(
        f"{s.who}: its jump host {s.jump} ({unknown_for.group(1)}): unknown host key; refusing "
        f"to connect. Check it out of band, then run: fab -H {s.jump} trust "
        "--fingerprint <SHA256:...>"
    )


def _key_changed(s: _Said) -> TransportError | None:
    changed = _CHANGED.search(s.text)
    if not changed and "REMOTE HOST IDENTIFICATION HAS CHANGED" not in s.text:
        return None
    offending = _OFFENDING.search(s.text)
    expected = f"(see {s.known_hosts})"
    if offending:
        expected = fingerprint_of_line(offending.group(1), int(offending.group(2))) or expected
    got, kind = "(not shown)", "ssh-ed25519"
    if changed:
        got, kind = changed.group(2), _KEY_TYPES.get(changed.group(1).upper(), kind)
    trust = verify_then_trust(s.host.name, got, kind, replace=True, known_hosts=s.known_hosts)
    return s.hostkey(
        f"{s.who}: host key does not match known_hosts: expected {expected}, got {got}; "
        f"refusing to connect. If the node was reinstalled, {trust}"
    )


def _key_unknown(s: _Said) -> TransportError | None:
    if "host key is known for" not in s.text and "Host key verification failed" not in s.text:
        return None
    offered = offered_key(s.argv, s.host.connect_timeout + 5)
    if offered is None:
        return s.hostkey(
            f"{s.who}: unknown host key; refusing to connect. Check it out of band, "
            f"then run: fab -H {s.host.name} trust --fingerprint <SHA256:...>"
        )
    kind, fingerprint = offered
    trust = verify_then_trust(s.host.name, fingerprint, kind, known_hosts=s.known_hosts)
    return s.hostkey(
        f"{s.who}: unknown host key {fingerprint} ({kind}); refusing to connect. {trust}"
    )


def _login_refused(s: _Said) -> TransportError | None:
    if "Permission denied" not in s.text:
        return None
    return _auth_refused(s.host, s.who, s.text, s.evidence, s.certificates)


def _unresolved(s: _Said) -> TransportError | None:
    resolved = _RESOLVE.search(s.text)
    if not resolved:
        return None
    return s.unreachable(
        f"{s.who}: cannot resolve {resolved.group(1).rstrip(':')!r} "
        f"({resolved.group(2).strip()}); check the name "
        "(the inventory's address, or HostName in ssh_config) and your DNS"
    )


def _connect_failed(s: _Said) -> TransportError | None:
    """`connect to host A port P: why`; a reset is left to the handshake's words below."""
    connect = _CONNECT.search(s.text)
    if not connect:
        return None
    addr, port, why = connect.group(1), connect.group(2), connect.group(3).strip()
    hop = ""
    if s.host.jump and (addr, port) != (s.host.address, str(s.host.port)):
        hop = " (the jump host)"
    if "refused" in why.lower():
        return s.unreachable(
            f"{s.who}: connection refused by {addr}:{port}{hop}: no sshd listens there; check "
            "that sshd runs on the node and that the port is right"
        )
    if "timed out" in why.lower():
        return s.unreachable(
            f"{s.who}: connection timed out after {s.host.connect_timeout}s{hop} (node down, a "
            "firewall, or a wrong address); check that the node is up and reachable, or raise "
            "connect_timeout"
        )
    if "reset" in why.lower():
        return None
    return s.unreachable(
        f"{s.who}: cannot connect{hop}: {why}; check the address, the port and the network path"
    )


def _no_banner(s: _Said) -> TransportError | None:
    if "banner exchange" not in s.text or "timed out" not in s.text:
        return None
    return s.unreachable(
        f"{s.who}: connection timed out after {s.host.connect_timeout}s: the port accepted TCP "
        "but sent no SSH banner (not an SSH server, or its sshd is overloaded); check the "
        "address and port"
    )


_CLOSED_WORDS = (
    "connection closed",
    "connection reset",
    "reset by peer",
    "broken pipe",
    "kex_exchange_identification",
)


def _closed(s: _Said) -> TransportError | None:
    lower = s.flat.lower()
    if not any(w in lower for w in _CLOSED_WORDS):
        return None
    return s.unreachable(
        f"{s.who}: the connection was closed during the SSH handshake ({s.flat[:300]}); the port "
        "is not a healthy sshd (sshd refusing clients, MaxStartups, a firewall or proxy in "
        "between); check the port and the node's sshd log, then retry"
    )


def _timed_out(s: _Said) -> TransportError | None:
    if "timed out" not in s.flat.lower():
        return None
    return s.unreachable(
        f"{s.who}: connection timed out after {s.host.connect_timeout}s (node down, a firewall, "
        "or a wrong address); check that the node is up and reachable, or raise connect_timeout"
    )


# In the order they are tried: the first that recognises ssh's words answers.
_EXPLAINERS: tuple[Callable[[_Said], TransportError | None], ...] = (
    _jump_key_unknown,
    _key_changed,
    _key_unknown,
    _login_refused,
    _unresolved,
    _connect_failed,
    _no_banner,
    _closed,
    _timed_out,
)
