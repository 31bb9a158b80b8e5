"""The SSH connector: the only module that talks SSH (paramiko, Fabric's Connection). One connection per host
per run, strict host keys, one exec per agent call, and the agent zip uploaded only when the node does not
have that exact version. It implements wire.connector.Connector."""

from __future__ import annotations

import json
import logging
import os
import select
import shlex
import threading
import time
import uuid

import paramiko
from fabric import Config, Connection

from remote_scripts.protocol import PROTOCOL

from ..identity import operator
from ..plans.inventory import Host, Inventory
from ..results import Evidence
from .bundle import agent_bundle
from .connector import COUNTERS, ExecResult, TransportError

__all__ = ["NodeConnection", "TransportError", "trust_host", "known_hosts_path"]

# paramiko's transport thread logs its own tracebacks (e.g. a missing SSH banner); fleetops reports the
# failure itself, so none of that may reach a user's terminal through logging's last-resort handler.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def fingerprint_of(key: paramiko.PKey) -> str:
    return key.fingerprint if hasattr(key, "fingerprint") else key.get_base64()[:20]


_SHARED_LOCK = threading.Lock()
_HOST_KEYS: dict[str, tuple[float, paramiko.HostKeys]] = {}
_CONFIG: Config | None = None


def _fabric_config() -> Config:
    """One Fabric Config per process: building one reads the ssh_config files again, per host."""
    global _CONFIG
    with _SHARED_LOCK:
        if _CONFIG is None:
            _CONFIG = Config()
        return _CONFIG


def _known_hosts(path: str) -> paramiko.HostKeys:
    """known_hosts parsed once per process and file version, shared by every connection that uses it."""
    mtime = os.stat(path).st_mtime
    with _SHARED_LOCK:
        cached = _HOST_KEYS.get(path)
        if cached is None or cached[0] != mtime:
            cached = _HOST_KEYS[path] = (mtime, paramiko.HostKeys(path))
        return cached[1]


def _strict_client(known_hosts: str | None) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    path = known_hosts or os.path.expanduser("~/.ssh/known_hosts")
    if os.path.exists(path):
        keys = client.get_host_keys()
        for name, entry in _known_hosts(path).items():
            for keytype, key in entry.items():
                keys.add(name, keytype, key)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


def _fabric_connection(host: Host, inventory: Inventory | None, depth: int = 0) -> Connection:
    if host.example:
        raise TransportError("refused", f"{host.name} comes from an example inventory ({host.source}); copy it to "
                                        "your own hosts/*.yaml to use it")
    gateway = None
    if host.jump:
        if depth > 3:
            raise TransportError("unreachable", f"jump chain too long at {host.name}")
        jump = inventory.hosts.get(host.jump) if inventory else None
        if jump is None:
            from ..plans.inventory import plain_host

            jump = plain_host(host.jump)
        gateway = _fabric_connection(jump, inventory, depth + 1)
    connect_kwargs: dict = {"banner_timeout": host.connect_timeout, "auth_timeout": host.connect_timeout}
    if host.identity_file:
        connect_kwargs.update(key_filename=host.identity_file, look_for_keys=False, allow_agent=False)
    if host.identity_passphrase:
        connect_kwargs["passphrase"] = host.identity_passphrase
    if host.plain:
        # Not ours to decide: let ssh_config (HostName, Port, User, IdentityFile, ProxyJump) resolve it.
        cxn = Connection(host.name, connect_timeout=host.connect_timeout, config=_fabric_config())
    else:
        cxn = Connection(host.address, user=host.user, port=host.port, connect_timeout=host.connect_timeout,
                         connect_kwargs=connect_kwargs, gateway=gateway, config=_fabric_config())
    # Fabric auto-adds unknown host keys; a fleet tool must not.
    cxn.client = _strict_client(host.known_hosts)
    return cxn


class _CaptureKey(paramiko.MissingHostKeyPolicy):
    """Records the key an unknown host offers, then refuses it (used only by `trust`)."""

    def __init__(self) -> None:
        self.key: paramiko.PKey | None = None

    def missing_host_key(self, client, hostname, key):  # noqa: ANN001 - paramiko's signature
        self.key = key
        raise paramiko.SSHException(f"captured host key for {hostname}")


def known_hosts_path(host: Host) -> str:
    return host.known_hosts or os.path.expanduser("~/.ssh/known_hosts")


def trust_host(host: Host, inventory: Inventory | None, fingerprint: str | None) -> tuple[str, str]:
    """Add the host's key to its known_hosts only when the operator names the fingerprint they verified.
    Returns (outcome, message); outcome is trusted / already / refused."""
    cxn = _fabric_connection(host, inventory)
    capture = _CaptureKey()
    cxn.client.set_missing_host_key_policy(capture)
    try:
        cxn.open()
    except paramiko.BadHostKeyException as exc:
        return "refused", (f"host key CHANGED: known_hosts has {fingerprint_of(exc.expected_key)}, the host offers "
                           f"{fingerprint_of(exc.key)}; if the change is expected, remove the old entry yourself "
                           f"(ssh-keygen -R) and run trust again")
    except paramiko.SSHException:
        if capture.key is None:
            raise
    except (OSError, EOFError) as exc:
        raise TransportError("unreachable", f"cannot connect to {host.address}:{host.port}: {exc}") from None
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
    path = known_hosts_path(host)
    name = host.address if host.port == 22 else f"[{host.address}]:{host.port}"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{name} {capture.key.get_name()} {capture.key.get_base64()}\n")
    return "trusted", f"added {offered} for {name} to {path}"


class NodeConnection:
    """One node, one SSH connection, many agent calls."""

    def __init__(self, host: Host, inventory: Inventory | None = None) -> None:
        self.host = host
        self.inventory = inventory
        self.cxn: Connection | None = None
        self.agent_path: str | None = None
        self.lock = threading.Lock()

    # -- connecting
    def open(self) -> None:
        if self.cxn is not None and self.cxn.is_connected:
            return
        host = self.host
        cxn = _fabric_connection(host, self.inventory)
        where = f"{cxn.host}:{cxn.port}"
        try:
            cxn.open()
        except paramiko.BadHostKeyException as exc:
            raise TransportError("hostkey", f"host key for {where} does not match known_hosts: expected "
                                            f"{fingerprint_of(exc.expected_key)}, got {fingerprint_of(exc.key)}; "
                                            "refusing to connect") from None
        except paramiko.SSHException as exc:
            text = str(exc)
            transport = cxn.client.get_transport()
            if transport is not None and not transport.remote_version:
                # paramiko's start_client gives up silently at the timeout; auth then says "No existing session".
                cxn.close()
                raise TransportError("unreachable", f"connection to {where} timed out after {host.connect_timeout}s: "
                                                    "the port accepted TCP but sent no SSH banner (not an SSH server, "
                                                    "or its sshd is overloaded); check the address and port") from None
            if "not found in known_hosts" in text:
                key = cxn.client.get_transport().get_remote_server_key() if cxn.client.get_transport() else None
                shown = f" (it offered {fingerprint_of(key)})" if key else ""
                raise TransportError("hostkey", f"unknown host key for {where}{shown}; refusing to connect. "
                                                f"Add it to {host.known_hosts or '~/.ssh/known_hosts'} after "
                                                "checking it out of band") from None
            if isinstance(exc, paramiko.AuthenticationException):
                raise TransportError("auth", f"authentication failed for {host.user or '?'}@{where}: {exc}") from None
            raise TransportError("unreachable", f"SSH error with {where}: {exc}") from None
        except TimeoutError:
            raise TransportError("unreachable", f"connection to {where} timed out after "
                                                f"{host.connect_timeout}s") from None
        except (OSError, EOFError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
                reason = "connection refused"
            raise TransportError("unreachable", f"cannot connect to {where}: {reason}") from None
        self.cxn = cxn
        COUNTERS.bump(host.name, "connections")

    def close(self) -> None:
        if self.cxn is not None:
            self.cxn.close()
            self.cxn = None

    # -- raw exec
    def exec(self, argv: list[str], stdin: bytes = b"", timeout: float = 300) -> ExecResult:
        """Run argv (quoted word by word: no value ever becomes shell syntax) with stdin, collect all."""
        self.open()
        assert self.cxn is not None
        command = shlex.join(argv)
        started = time.monotonic()
        COUNTERS.bump(self.host.name, "execs")
        try:
            chan = self.cxn.transport.open_session(timeout=self.host.connect_timeout)
            _exec_without_waiting(chan, command)
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err, code = _drain(chan, started + timeout)
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
    def _agent_argv(self) -> list[str]:
        bundle = agent_bundle()
        path = f"{self.host.state_dir}/bin/{bundle.filename}"
        return [self.host.python, path]

    def upload_agent(self) -> None:
        bundle = agent_bundle()
        self.upload(f"{self.host.state_dir}/bin/{bundle.filename}", bundle.data)
        COUNTERS.bump(self.host.name, "uploads")

    def upload(self, path: str, data: bytes) -> None:
        """Write path atomically over SFTP (temp name, then rename), making its missing folders 0700."""
        self.open()
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
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        with sftp.open(tmp, "wb") as f:
            f.write(data)
        sftp.posix_rename(tmp, path)

    def download(self, path: str) -> bytes:
        self.open()
        assert self.cxn is not None
        with self.cxn.sftp().open(path, "rb") as f:
            return f.read()

    def call(self, op: str, request: dict, timeout: float = 300) -> tuple[dict, Evidence]:
        payload = json.dumps({"protocol": PROTOCOL, "op": op, "state_dir": self.host.state_dir,
                              "operator": operator(), **request}).encode()
        with self.lock:
            argv = self._agent_argv()
            res = self.exec(argv, payload, timeout)
            if res.exit_code == 2 and b"can't open file" in res.stderr:
                self.upload_agent()  # first visit of this agent version
                res = self.exec(argv, payload, timeout)
        evidence = res.evidence()
        if res.exit_code == 127:
            raise TransportError("remote", f"{self.host.name}: the target python {self.host.python} was not "
                                           "found on the node", evidence)
        if res.exit_code != 0:
            raise TransportError("remote", f"{self.host.name}: the node agent failed (exit {res.exit_code})",
                                 evidence)
        try:
            answer = json.loads(res.stdout.decode("utf-8").strip().splitlines()[-1])
        except (ValueError, IndexError, UnicodeDecodeError):
            raise TransportError("remote", f"{self.host.name}: the node agent gave no JSON answer", evidence) from None
        return answer, evidence


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
