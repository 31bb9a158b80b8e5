"""A lab node's sshd: the config it runs with (the lab user's, or with more users and another sftp
command for a test), starting it and waiting for its port, stopping it once it is ours."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ..agent.core.failpoints import FAILPOINTS_ENV
from ..agent.core.procfs import pid_alive, pids, read, stat_fields
from .common import LabError, port_open
from .node import Node
from .wheels import PIP_CACHE

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def config(node: Node, user: str, user_ca: Path | None = None) -> str:
    """The node's whole sshd config, letting `user` in with the lab's client key, or with an OpenSSH
    user certificate signed by `user_ca` (its public key) naming `user` among its principals."""
    # sftp (how the agent is uploaded) through OpenSSH's external sftp-server at log level INFO: it
    # records every file operation (open, close with bytes written, rename) in <node>/sftp.log, so
    # tests count uploads from the node's own record. internal-sftp logs only to syslog, which the
    # lab has not. The subsystem command runs through the user's shell, hence the redirection; a
    # path that would need quoting, or no sftp-server binary, keeps internal-sftp (uploads work,
    # they are just not logged).
    sftp_log = node.dir / "sftp.log"
    server = next(
        (
            p
            for p in (
                "/usr/lib/openssh/sftp-server",
                "/usr/libexec/openssh/sftp-server",
                "/usr/libexec/sftp-server",
            )
            if os.access(p, os.X_OK)
        ),
        None,
    )
    plain = all(ch.isalnum() or ch in "/._-+" for ch in str(sftp_log))
    sftp = f"{server} -e -l INFO 2>>{sftp_log}" if server and plain else "internal-sftp"
    # One complete config per node: -o overrides were not reliable here.
    return "\n".join(
        [
            f"Port {node.port}",
            "ListenAddress 127.0.0.1",
            *login_lines(node.host_key, node.pid_file, node.dir / "authorized_keys", user),
            *([f"TrustedUserCAKeys {user_ca}"] if user_ca is not None else []),
            "ClientAliveInterval 15",
            f"Subsystem sftp {sftp}",
            # SHLVL=1 keeps bash from sourcing ~/.bashrc for every exec (bash does for sshd-started
            # shells at level 1); a developer's rc file (pyenv init, ...) would otherwise cost ~90
            # ms of CPU per exec. FLEETOPS_FAILPOINTS_DIR: the only way failpoints are armed (tests
            # write failpoints.json there). PIP_CACHE_DIR: the node's own pip cache, holding the
            # wheels of its packages (wheels.py).
            f"SetEnv PATH={node.dir / 'bin'}:/usr/local/bin:/usr/bin:/bin SHLVL=1 "
            f"{FAILPOINTS_ENV}={node.faults_dir} PIP_CACHE_DIR={node.dir / PIP_CACHE}",
            "LogLevel VERBOSE",
            "",
        ]
    )


def login_lines(host_key: Path, pid_file: Path, authorized_keys: Path, user: str) -> list[str]:
    """The sshd config lines every lab sshd has (a node's, the scale lab's): its keys and pid file,
    `user` in by key only, and room for many connections and sessions."""
    return [
        f"HostKey {host_key}",
        f"PidFile {pid_file}",
        f"AuthorizedKeysFile {authorized_keys}",
        f"AllowUsers {user}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "StrictModes no",
        "MaxStartups 1000:30:2000",
        "MaxSessions 100",
        "PrintMotd no",
    ]


def allowing(text: str, user: str, users: tuple[str, ...] = (), sftp: str | None = None) -> str:
    """`text` (config's) letting these users log in too (a test's non-root login user) and with this
    sftp Subsystem command (a broken one, for a test)."""
    # sftp-server's log redirection is a file of the lab user's: internal-sftp
    if users and sftp is None:
        sftp = "internal-sftp"
    if users:
        text = text.replace(f"AllowUsers {user}\n", f"AllowUsers {' '.join((user, *users))}\n")
    if sftp is not None:
        text = "\n".join(
            f"Subsystem sftp {sftp}" if line.startswith("Subsystem sftp ") else line
            for line in text.split("\n")
        )
    return text


def start(node: Node) -> None:
    """The node's sshd started from its config, listening on its port within 10 s, else LabError."""
    (node.dir / "bin").mkdir(exist_ok=True)
    node.faults_dir.mkdir(mode=0o700, exist_ok=True)
    if node.pid_file.exists():
        node.pid_file.unlink()
    proc = subprocess.run(
        [SSHD, "-f", str(node.config), "-E", str(node.dir / "sshd.log")],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise LabError(
            f"sshd for {node.name} failed to start: {proc.stderr.strip()} "
            f"(log: {node.dir / 'sshd.log'})"
        )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if node.pid() and port_open(node.port):
            return
        time.sleep(0.05)
    raise LabError(
        f"sshd for {node.name} did not come up on port {node.port}; see {node.dir / 'sshd.log'}"
    )


def exited(pid: int) -> bool:
    """Gone, or a zombie: sshd daemonizes, so its exit is reaped by init, which may take a second or
    more, while the process itself (its port, its files) is already gone."""
    fields = stat_fields(pid)
    return not pid_alive(pid) or fields is None or fields[0] in ("Z", "X")


def listeners(node: Node) -> list[int]:
    """The node's sshd: the pid its pid file names, else every live process started from this node's
    config. sshd writes the pid file only after it has forked into the background, so a start
    interrupted in between (Ctrl-C during `lab.up`) leaves a listener that only its command line
    tells."""
    pid = node.pid()
    if pid is not None and pid_alive(pid) and node.ours(pid) and not exited(pid):
        return [pid]
    return [p for p in pids() if _is_sshd(p) and node.ours(p) and not exited(p)]


def _is_sshd(pid: int) -> bool:
    cmdline = read(pid, "cmdline") or b""
    return b"sshd" in cmdline.split(b"\0")[0]


def stop_strays(under: Path, sig: int = signal.SIGTERM) -> list[int]:
    """Stop every sshd started from a config below `under` that no recorded node owns: `lab.up`
    interrupted after it started a node's sshd but before it wrote the node into the lab's state.
    Returns their pids, each exited or waited for up to 5 s."""
    mark = (str(under).rstrip("/") + "/").encode()
    found = [
        p for p in pids() if _is_sshd(p) and mark in (read(p, "cmdline") or b"") and not exited(p)
    ]
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(exited(pid) for pid in found):
        time.sleep(0.02)
    return found


def stop(node: Node, sig: int = signal.SIGTERM) -> bool:
    """Signal the node's sshd (only one this node's config started) and wait up to 5 s for it to
    exit; False when none was running."""
    found = listeners(node)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(exited(pid) for pid in found):
        time.sleep(0.02)
    return bool(found)
