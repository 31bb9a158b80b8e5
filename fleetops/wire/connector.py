"""What the rest of fleetops knows about reaching a node: the Connector protocol (call / submit /
exec / upload / download), the errors a connector raises, and the per-run pool of connectors. No SSH
here: wire/ssh.py is one Connector; a second one (local, for tests) plugs in through
RunState(connector=...) and nothing above the wire changes."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..plans.inventory import Host, Inventory
from ..results import Evidence

STDERR_TAIL_LINES = 20
# a node's stderr line longer than this is cut in the evidence (a flood has no newlines)
EVIDENCE_LINE_CHARS = 1000

# What one host's session may hold on the client. A node is not trusted to be brief: one answer
# line, the agent's stderr between two answers and a raw exec's output are each capped, and a
# session over its cap is dropped with one line naming the host (the other hosts go on). The largest
# honest answer is `run`'s head and tail of two streams (remote_scripts/jobs/adhoc.py: 4 MiB of
# text, up to 6x that as JSON escapes).
MAX_ANSWER_BYTES = 32 * 1024 * 1024
MAX_STDERR_BYTES = 16 * 1024 * 1024  # written by the agent while serving one request
STDERR_KEPT_BYTES = 64 * 1024  # of that, the end is kept as evidence
MAX_EXEC_BYTES = 64 * 1024 * 1024  # stdout + stderr of one raw exec


# File descriptors on the client for one host at work: its TCP socket, and at most one more while it
# opens (the connect's socket before paramiko takes it) or reads a local file for it (an upload's
# source); the agent session's channel and paramiko's transport thread need none. What the process
# keeps for itself: the terminal, the audit log, the imports' files, the inventory and known_hosts
# while they are read, and the `ssh -G`s resolving hosts (fabconfig.SSH_G_AT_ONCE at a time, 6 each
# while they start).
FDS_PER_HOST = 3
# Through the system `ssh` (the openssh transport): the agent session's stdin, stdout and stderr
# pipes, its poll set and its master's control socket or ssh child's pidfd (5), and while it opens
# the three pipe ends handed over (and an ssh child's error pipe); an SFTP session beside it, or a
# master's start (its stderr file, /dev/null, the error pipe).
FDS_PER_HOST_OPENSSH = 14
FDS_KEPT = 48 + 8 * 6
# macOS refuses a soft limit above OPEN_MAX even when the hard limit is "unlimited"
MAC_OPEN_MAX = 10240


def open_fds() -> int:
    """File descriptors this process has open now (0 where the system does not say)."""
    for where in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(where))
        except OSError:
            continue
    return 0


def fork_bound(wanted: int, per_host: int = FDS_PER_HOST) -> tuple[int, str | None]:
    """How many hosts may be at work at once within this process's open-file limit, each holding up
    to `per_host` descriptors: `wanted`, or fewer with the line that says so. The soft limit is
    first raised towards the hard one (as OpenSSH's client and most servers do): a Mac's default
    soft limit, 256, sits under a far higher hard limit."""
    try:
        import resource
    except ImportError:  # no POSIX limits here: nothing to respect
        return wanted, None
    infinity = resource.RLIM_INFINITY
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = open_fds()
    need = in_use + FDS_KEPT + wanted * per_host
    if soft != infinity and soft < need:
        for target in dict.fromkeys(
            (need if hard == infinity else min(need, hard), min(need, MAC_OPEN_MAX))
        ):
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
                break
            except (ValueError, OSError):
                continue
    if soft == infinity or soft >= need:
        return wanted, None
    room = max(1, (soft - in_use - FDS_KEPT) // per_host)
    return room, (
        f"forks lowered from {wanted} to {room}: this process may open {soft} files (ulimit -n) "
        f"and each host at work holds up to {per_host}; `ulimit -n {need}` before the "
        f"command works on {wanted} hosts at once"
    )


def link_errors() -> tuple[type[BaseException], ...]:
    """What a broken link raises under any transport: OS errors and EOF, and paramiko's own errors
    when a paramiko connection is in use (when paramiko is not loaded, nothing can raise them)."""
    paramiko = sys.modules.get("paramiko")
    return (OSError, EOFError) if paramiko is None else (OSError, EOFError, paramiko.SSHException)


def mib(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB"


class TransportError(Exception):
    """The node could not be reached or the link broke. `kind` is unreachable / hostkey / auth /
    lost / timeout / remote (the agent itself failed)."""

    def __init__(self, kind: str, message: str, evidence: Evidence | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.evidence = evidence


def _unanswered(command: str, started: float) -> Evidence:
    return Evidence(command, None, [], round(time.monotonic() - started, 3))


def step_overflow(host: str, exc: Exception, command: str, started: float) -> TransportError:
    """An exec's output went over its bound: both transports stop reading it."""
    return TransportError(
        "remote",
        f"{host}: {exc}; stopped reading it, the node's outcome is unknown",
        _unanswered(command, started),
    )


def step_timeout(host: str, timeout: float, command: str, started: float) -> TransportError:
    """An exec that did not end within its time."""
    return TransportError(
        "timeout", f"{host}: no answer within {timeout:.0f}s", _unanswered(command, started)
    )


def step_lost(host: str, exc: BaseException, command: str, started: float) -> TransportError:
    """The link broke while an exec ran (`exc`: what the transport raised)."""
    return TransportError(
        "lost",
        f"connection to {host} lost during the step ({exc or 'EOF'}); "
        "the node's outcome is unknown",
        _unanswered(command, started),
    )


def step_ended_unsaid(host: str, result: ExecResult) -> TransportError:
    """An exec whose channel closed without an exit status: the link went with it."""
    return TransportError(
        "lost",
        f"connection to {host} lost during the step; the node's outcome is unknown",
        result.evidence(),
    )


def upload_refused(host: Host, path: str, exc: BaseException) -> TransportError:
    """An SFTP write of the agent that failed, the same words over either transport."""
    reason = getattr(exc, "strerror", None) or " ".join(str(exc).split()) or type(exc).__name__
    return TransportError(
        "remote",
        f"{host.name}: cannot write {path} on the node over SFTP ({reason}); "
        f"check that the login user may write {host.state_dir} and the "
        "node's free disk space",
    )


@dataclass
class ExecResult:
    command: str
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    seconds: float

    def evidence(self) -> Evidence:
        tail = [
            _cut(line)
            for line in self.stderr.decode("utf-8", "replace").splitlines()[-STDERR_TAIL_LINES:]
        ]
        return Evidence(self.command, self.exit_code, tail, round(self.seconds, 3))


def _cut(line: str) -> str:
    if len(line) <= EVIDENCE_LINE_CHARS:
        return line
    return (
        f"{line[:EVIDENCE_LINE_CHARS]} … "
        f"[{len(line) - EVIDENCE_LINE_CHARS:,} more characters not shown]"
    )


class Counters:
    """Connections, execs and uploads made by this process, for --trace and the benchmark; requests
    sent ahead (before the previous answer arrived) and the agent sessions' sends, answers and
    closes, in order, for the tests that prove pipelining and early closing (a bounded log: a long
    run keeps the last ones)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.per_host: dict[str, dict[str, int]] = {}
        self.ahead: dict[str, int] = {}
        self.events: deque[tuple[float, str, str, str]] = deque(maxlen=20000)
        # hosts whose agent, started before the program's start-up (warmstart.py), the run took over
        self.early: set[str] = set()

    def bump(self, host: str, what: str, n: int = 1) -> None:
        with self.lock:
            row = self.per_host.setdefault(host, {"connections": 0, "execs": 0, "uploads": 0})
            row[what] += n

    def event(self, host: str, what: str, op: str = "") -> None:
        """what: sent / sent_ahead / answered (an agent request), closed (the host's agent
        session)."""
        with self.lock:
            if what == "sent_ahead":
                self.ahead[host] = self.ahead.get(host, 0) + 1
            self.events.append((time.monotonic(), host, what, op))


COUNTERS = Counters()


class Pending(Protocol):
    """A request handed to a connector ahead of time (Connector.submit)."""

    def result(self) -> tuple[dict, Evidence]:
        """Its answer, as call() would give it (waiting for it if need be); raises what call()
        raises."""

    def discard(self) -> None:
        """Its answer is not wanted (the step before it failed): not sent if it is still held, else
        its answer is read and dropped in its turn."""


def discard_quietly(pending: Pending | None) -> None:
    """Drop an answer that is no longer wanted; a failure to drop it must not turn a skip into a
    crash."""
    if pending is not None:
        try:
            pending.discard()
        except Exception:  # the link may already be gone: the step is reported skipped either way
            pass


class Connector(Protocol):
    """One node, one link, many calls. Raises TransportError for anything that is the link's
    fault."""

    host: Host

    def call(self, op: str, request: dict, timeout: float = 300) -> tuple[dict, Evidence]:
        """One agent op (remote_scripts/core/protocol.py OPS): request in, the agent's JSON answer
        out."""

    def submit(self, op: str, request: dict, timeout: float = 300) -> Pending:
        """call(), pipelined: the request goes out behind the requests in flight, or right behind
        the next request sent, without waiting for the answers before it. Only for ops that change
        nothing on the node (protocol.READ_ONLY_OPS): the step before it may still fail, and then
        its answer is dropped."""

    def exec(self, argv: list[str], stdin: bytes = b"", timeout: float = 300) -> ExecResult:
        """Run argv on the node (no shell), collect stdout, stderr, exit status."""

    def upload(self, path: str, data: bytes) -> None:
        """Write data to path on the node atomically (a reader sees the old file or the whole new
        one)."""

    def download(self, path: str) -> bytes:
        """The bytes of path on the node."""

    def download_to(
        self, remote: str, local_path: str, offset: int, end: int, progress: object = None
    ) -> int:
        """Bytes [offset, end) of remote into local_path at offset (a partial copy resumes);
        progress(n) is called with the bytes written so far. Returns them."""

    def close(self) -> None:
        """Drop the link; the next call opens a new one."""


class Pool:
    """One connector per host name for the life of a run; `factory` makes them (ssh.NodeConnection,
    or another)."""

    def __init__(
        self, inventory: Inventory | None, factory: Callable[[Host, Inventory | None], Connector]
    ) -> None:
        self.inventory = inventory
        self.factory = factory
        self.nodes: dict[str, Connector] = {}
        self.lock = threading.Lock()

    def get(self, host: Host) -> Connector:
        with self.lock:
            node = self.nodes.get(host.name)
            if node is None:
                node = self.nodes[host.name] = self.factory(host, self.inventory)
            return node

    def release(self, name: str) -> None:
        """This host is done for this run: its agent and connection end now, not with the whole run
        (a large run does not hold every finished host's agent and sshd session until its slowest
        host ends). The connector stays in the pool (a later use reconnects; the audit log still
        reads its host)."""
        with self.lock:
            node = self.nodes.get(name)
        if node is not None:
            node.close()

    def close_all(self) -> None:
        for node in self.nodes.values():
            node.close()
        self.nodes.clear()
