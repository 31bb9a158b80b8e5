"""What the system `ssh` says when it cannot connect (exit status 255, its stderr), as one
TransportError in the words errors.py uses for the paramiko transport: which host, the cause, the
next step. ssh's text is data: it is matched, never run, and only its lines are quoted."""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
from collections.abc import Callable

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
    who = label(host, where)
    unknown_for = _UNKNOWN_FOR.search(text)
    if jump and unknown_for and unknown_for.group(1) != _endpoint(where):
        # the jump host's own key is the unknown one: trust that host, not the one behind it
        return TransportError(
            "hostkey",
            (
                f"{who}: its jump host {jump} ({unknown_for.group(1)}): unknown host key; "
                f"refusing to connect. Check it out of band, then run: fab -H {jump} trust "
                "--fingerprint <SHA256:...>"
            ),
            Evidence(shown, SSH_FAILED, _lines(text), 0.0),
        )
    seconds = host.connect_timeout
    evidence = Evidence(shown, SSH_FAILED, _lines(text), 0.0)
    flat = " ".join(text.split())
    changed = _CHANGED.search(text)
    if changed or "REMOTE HOST IDENTIFICATION HAS CHANGED" in text:
        offending = _OFFENDING.search(text)
        expected = (
            fingerprint_of_line(offending.group(1), int(offending.group(2))) if offending else None
        )
        got = changed.group(2) if changed else "(not shown)"
        kind = _KEY_TYPES.get(changed.group(1).upper(), "ssh-ed25519") if changed else "ssh-ed25519"
        return TransportError(
            "hostkey",
            (
                f"{who}: host key does not match known_hosts: expected "
                f"{expected or '(see ' + known_hosts + ')'}, got {got}; refusing to connect. If "
                "the node was reinstalled, "
                + verify_then_trust(host.name, got, kind, replace=True, known_hosts=known_hosts)
            ),
            evidence,
        )
    if "host key is known for" in text or "Host key verification failed" in text:
        offered = offered_key(argv, seconds + 5)
        if offered is None:
            return TransportError(
                "hostkey",
                f"{who}: unknown host key; refusing to connect. Check it out of band, "
                f"then run: fab -H {host.name} trust --fingerprint <SHA256:...>",
                evidence,
            )
        kind, fingerprint = offered
        return TransportError(
            "hostkey",
            (
                f"{who}: unknown host key {fingerprint} ({kind}); refusing to connect. "
                + verify_then_trust(host.name, fingerprint, kind, known_hosts=known_hosts)
            ),
            evidence,
        )
    if "Permission denied" in text:
        return _auth_refused(host, who, text, evidence, certificates)
    resolved = _RESOLVE.search(text)
    if resolved:
        return TransportError(
            "unreachable",
            (
                f"{who}: cannot resolve {resolved.group(1).rstrip(':')!r} "
                f"({resolved.group(2).strip()}); check the name "
                "(the inventory's address, or HostName in ssh_config) and your DNS"
            ),
            evidence,
        )
    connect = _CONNECT.search(text)
    if connect:
        addr, port, why = connect.group(1), connect.group(2), connect.group(3).strip()
        hop = (
            " (the jump host)"
            if host.jump and (addr, port) != (host.address, str(host.port))
            else ""
        )
        if "refused" in why.lower():
            return TransportError(
                "unreachable",
                (
                    f"{who}: connection refused by {addr}:{port}{hop}: no sshd listens there; "
                    "check that sshd runs on "
                    "the node and that the port is right"
                ),
                evidence,
            )
        if "timed out" in why.lower():
            return TransportError(
                "unreachable",
                (
                    f"{who}: connection timed out after {seconds}s{hop} (node down, a firewall, "
                    "or a wrong address); "
                    "check that the node is up and reachable, or raise connect_timeout"
                ),
                evidence,
            )
        if "reset" not in why.lower():
            return TransportError(
                "unreachable",
                f"{who}: cannot connect{hop}: {why}; check the address, the port "
                "and the network path",
                evidence,
            )
    if "banner exchange" in text and "timed out" in text:
        return TransportError(
            "unreachable",
            (
                f"{who}: connection timed out after {seconds}s: the port accepted TCP but sent "
                "no SSH banner (not an "
                "SSH server, or its sshd is overloaded); check the address and port"
            ),
            evidence,
        )
    if any(
        w in flat.lower()
        for w in (
            "connection closed",
            "connection reset",
            "reset by peer",
            "broken pipe",
            "kex_exchange_identification",
        )
    ):
        return TransportError(
            "unreachable",
            (
                f"{who}: the connection was closed during the SSH handshake ({flat[:300]}); the "
                "port is not a healthy "
                "sshd (sshd refusing clients, MaxStartups, a firewall or proxy in between); "
                "check the port and the "
                "node's sshd log, then retry"
            ),
            evidence,
        )
    if "timed out" in flat.lower():
        return TransportError(
            "unreachable",
            (
                f"{who}: connection timed out after {seconds}s (node down, a firewall, or a "
                "wrong address); check that "
                "the node is up and reachable, or raise connect_timeout"
            ),
            evidence,
        )
    return TransportError(
        "unreachable",
        f"{who}: ssh could not connect ({flat[:300] or 'exit 255, nothing said'}); "
        "check the node's sshd log and `ssh -v` to it",
        evidence,
    )
