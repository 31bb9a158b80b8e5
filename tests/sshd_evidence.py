"""What a lab node itself recorded about a run: connections, exec sessions and agent uploads, read
from the node's sshd log (LogLevel VERBOSE, written by `sshd -E <node>/sshd.log`) and sftp-server
log (<node>/sftp.log, level INFO), counting only what was written after `mark()`.

This is the independent side of every "one connection per host" / "uploads once" claim: the tool's
own counters (FLEETOPS_TRACE, `counters` in --json) are compared with it, never trusted alone.

What sshd 9.x logs at VERBOSE, one line per event (no timestamps with -E):
    Accepted publickey for USER from 127.0.0.1 port P ssh2: ED25519 SHA256:...
    Starting session: command for USER from 127.0.0.1 port P id N        (an exec channel)
    Starting session: subsystem 'sftp' for USER from 127.0.0.1 port P id N
    Close session: user USER from 127.0.0.1 port P id N
The exec'd command text is not logged at VERBOSE (nor at DEBUG1); fleetops execs nothing but its
agent, so every exec session is an agent call. sftp-server logs each file operation:
    open "PATH" flags WRITE,CREATE,TRUNCATE mode 0666
    close "PATH" bytes read 0 written N
    posix-rename old "TMP" new "FINAL"
An upload is a rename whose new name is an agent zip (<state_dir>/bin/fleetops-agent-<sha>.pyz).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from conftest import run_fab

ACCEPTED = re.compile(r"^Accepted publickey for \S+ from \S+ port (\d+) ")
CONNECTION_FROM = re.compile(r"^Connection from \S+ port (\d+) on ")
EXEC = re.compile(r"^Starting session: command for \S+ from \S+ port (\d+) id (\d+)$")
SUBSYSTEM = re.compile(
    r"^Starting session: subsystem '([^']+)' for \S+ from \S+ port (\d+) id (\d+)$"
)
CLOSE = re.compile(r"^Close session: user \S+ from \S+ port (\d+) id (\d+)$")
SFTP_CLOSE = re.compile(r'^close "(.*)" bytes read (\d+) written (\d+)$')
SFTP_RENAME = re.compile(r'^(?:posix-)?rename old "(.*)" new "(.*)"$')
AGENT_ZIP = re.compile(r"/fleetops-agent-[0-9a-f]+\.pyz$")
# The tool's own count of one host's run (FLEETOPS_TRACE=1), what the node's logs are compared with.
TRACE_LINE = re.compile(r"^trace (\S+): (\d+) connections, (\d+) execs, (\d+) uploads$", re.M)


@dataclass
class Wire:
    """One node's record of a run."""

    # client port of each accepted (authenticated) connection
    accepted: list[int] = field(default_factory=list)
    # client port of each TCP connection sshd saw, authenticated or not
    tcp: list[int] = field(default_factory=list)
    # client port -> exec sessions on that connection
    execs: dict[int, int] = field(default_factory=dict)
    sftp_sessions: int = 0
    sessions_started: int = 0
    sessions_closed: int = 0
    uploads: list[str] = field(default_factory=list)  # agent zips renamed into place, in order
    written: dict[str, int] = field(default_factory=dict)  # temp file -> bytes written into it
    upload_bytes: list[int] = field(default_factory=list)  # bytes written for each upload, in order

    def counts(self) -> dict[str, int]:
        """Same shape as the tool's counters, so the two can be compared with ==."""
        return {
            "connections": len(self.accepted),
            "execs": sum(self.execs.values()),
            "uploads": len(self.uploads),
        }

    def describe(self) -> str:
        return (
            f"sshd log: {len(self.accepted)} accepted connection(s) (client ports "
            f"{self.accepted}), exec sessions per connection {self.execs}, {self.sftp_sessions} "
            f"sftp session(s); sftp log: {len(self.uploads)} agent upload(s) {self.uploads} "
            f"({self.upload_bytes} bytes)"
        )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _complete_lines(path: Path, offset: int) -> list[str]:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return []
    # A line sshd is still writing is not evidence yet.
    return data[: data.rfind(b"\n") + 1].decode("utf-8", "replace").splitlines()


class NodeLogs:
    """Byte offsets of a node's logs at mark(); read() parses what was appended since."""

    def __init__(self, node) -> None:  # fleetops.lab.Node
        self.node = node
        self.sshd = Path(node.dir) / "sshd.log"
        self.sftp = Path(node.dir) / "sftp.log"
        self.mark()

    def mark(self) -> None:
        self.sshd_offset = _size(self.sshd)
        self.sftp_offset = _size(self.sftp)

    def read(self) -> Wire:
        wire = Wire()
        for line in _complete_lines(self.sshd, self.sshd_offset):
            if m := ACCEPTED.match(line):
                wire.accepted.append(int(m[1]))
            elif m := CONNECTION_FROM.match(line):
                wire.tcp.append(int(m[1]))
            elif m := EXEC.match(line):
                wire.execs[int(m[1])] = wire.execs.get(int(m[1]), 0) + 1
                wire.sessions_started += 1
            elif m := SUBSYSTEM.match(line):
                wire.sessions_started += 1
                wire.sftp_sessions += int(m[1] == "sftp")
            elif CLOSE.match(line):
                wire.sessions_closed += 1
        for line in _complete_lines(self.sftp, self.sftp_offset):
            if m := SFTP_CLOSE.match(line):
                wire.written[m[1]] = int(m[3])
            elif (m := SFTP_RENAME.match(line)) and AGENT_ZIP.search(m[2]):
                wire.uploads.append(m[2])
                wire.upload_bytes.append(wire.written.get(m[1], -1))
        return wire

    def settled(self, timeout: float = 60) -> Wire:
        """read() once every session the run started has also closed in the log (sshd writes the
        close after the client may already have exited), polling up to `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            wire = self.read()
            if wire.sessions_closed >= wire.sessions_started or time.monotonic() > deadline:
                return wire
            time.sleep(0.1)


def logs_for(lab, names: list[str]) -> dict[str, NodeLogs]:  # fleetops.lab.Lab
    """Mark the named nodes' logs now. Fails loudly when the lab's sshd cannot write the sftp
    log."""
    out = {}
    for name in names:
        node = lab.node(name)
        wanted = lab._sshd_config(node)
        if Path(node.config).read_text() != wanted:
            # A lab kept from before (FLEETOPS_TEST_LAB) runs an older config: bring this node's
            # sshd up to date.
            Path(node.config).write_text(wanted)
            lab.stop_node(node)
            lab.start_node(node)
        assert "sftp-server -e -l INFO" in wanted, (
            f"{name}'s sshd cannot log sftp operations "
            f"({node.config}: no OpenSSH sftp-server binary, or a lab "
            "path that needs quoting); upload counts need it"
        )
        out[name] = NodeLogs(node)
    return out


def clear_agent_cache(node) -> list[str]:  # fleetops.lab.Node
    """Empty <state_dir>/bin, so the next run must upload the agent. Returns what was removed."""
    import shutil

    removed = []
    bin_dir = Path(node.state_dir) / "bin"
    if bin_dir.is_dir():
        for entry in sorted(bin_dir.iterdir()):
            removed.append(entry.name)
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    return removed


def agent_zips(node) -> dict[str, tuple[int, int]]:  # fleetops.lab.Node
    """Agent zips on the node: name -> (inode, mtime_ns). A new upload is a new inode (rename
    over)."""
    bin_dir = Path(node.state_dir) / "bin"
    if not bin_dir.is_dir():
        return {}
    return {
        p.name: (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in bin_dir.glob("fleetops-agent-*.pyz")
    }


def trace_counts(output: str) -> dict[str, dict[str, int]]:
    """The FLEETOPS_TRACE lines of a run's output, by host: its connections, execs and uploads."""
    return {
        m[1]: {"connections": int(m[2]), "execs": int(m[3]), "uploads": int(m[4])}
        for m in TRACE_LINE.finditer(output)
    }


def traced_run(
    project: Path, hosts: list[str], *args: str
) -> tuple[dict[str, dict[str, int]], str]:
    """`fab -H HOSTS ARGS` with FLEETOPS_TRACE=1, which must pass with a trace line for each host:
    the counts by host (trace_counts), and the run's whole output."""
    proc = run_fab(project, "-H", ",".join(hosts), *args, env={"FLEETOPS_TRACE": "1"})
    both = proc.stdout + proc.stderr
    assert proc.returncode == 0, both
    traced = trace_counts(both)
    assert sorted(traced) == sorted(hosts), both
    return traced, both
