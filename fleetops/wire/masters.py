"""The OpenSSH master connections in the control directory (controldir.py), asked and closed through
ssh's own control commands: `ssh -O check` says whether a master answers on a socket and its pid,
`ssh -O exit` closes it. A socket no master answers on (the master was killed) is stale: closing it
removes the socket and its record. Used by `connections`, `disconnect`, `lab.down` and the cap on
how many masters persist.

    masters(directory)              every socket there: live (with its pid) or stale, least recently
                                    used first
    open_master(path, ...)          a master to a lab node, with only the options named
    check(path)                     the pid of the master on one socket, None when stale
    close(directory, socket)        `ssh -O exit`, or the stale socket removed; its record forgotten
    close_all(directory, masters)   close each of them (at once), each one's outcome
    listening_pids(directory)       every process that listens on a socket there, from /proc (Linux)
    rss_kib(pid), proc_kib(pid, field, source), fd_count(pid)
                                    what a master costs, from /proc (None where it does not say)
    survey(words) / disconnect(words)   `connections` and `disconnect` as data (the report draws
                                        them)

A failure to ask (no ssh binary, a master that does not answer in time) raises MasterError; nothing
is removed on doubt."""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import re
import shutil
import socket as sockets
import stat
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..agent.core import procfs
from . import controldir
from .controldir import MasterRecord

CHECK_TIMEOUT_S = 5.0
EXIT_WAIT_S = 5.0
WORKERS = 8  # ssh -O calls at once: each is a short ssh process
_PID = re.compile(rb"\(pid=(\d+)\)")
# ssh binds a new master's socket as `<path>.<16 random characters>` and renames it into place once
# it listens
_BINDING = re.compile(r".\.[A-Za-z0-9]{16}$")


class MasterError(Exception):
    """A master could not be asked or closed; the message names the socket, the cause and what to
    do."""


@dataclass(frozen=True)
class Master:
    """One socket in the control directory: `pid` the master's when it answers, None when stale."""

    socket: str
    pid: int | None
    record: MasterRecord | None
    # ssh could not say (a master that did not answer in time): neither live nor stale
    error: str = ""

    @property
    def stale(self) -> bool:
        return self.pid is None and not self.error

    @property
    def host(self) -> str:
        """The host as fleetops named it, or the socket's name for a master fleetops has no record
        of."""
        return self.record.host if self.record else self.socket


@dataclass(frozen=True)
class Closed:
    socket: str
    host: str
    outcome: str  # "closed", "stale" (no master answered: its socket removed), "failed"
    detail: str = ""


def ssh_binary() -> str:
    found = shutil.which("ssh")
    if found is None:
        raise MasterError(
            "no `ssh` on PATH: master connections are OpenSSH's (install openssh-client)"
        )
    return found


def _control(path: str, command: str, timeout: float) -> subprocess.CompletedProcess[bytes]:
    """`ssh -O COMMAND` on the socket at `path`. -F /dev/null: no ssh_config is read (a `Match exec`
    there would run for a question about a local socket); ssh expands % in a control path, hence the
    doubling."""
    argv = [
        ssh_binary(),
        "-F",
        "/dev/null",
        "-S",
        path.replace("%", "%%"),
        "-O",
        command,
        "fleetops-master",
    ]
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise MasterError(
            f"{path}: the master did not answer `ssh -O {command}` within {timeout:g} s "
            f"(see its pid with `ssh -S {path} -O check x`, or stop it: `ssh -S {path} -O exit x`)"
        ) from None
    except OSError as exc:
        raise MasterError(f"{path}: cannot run ssh: {exc.strerror or exc}") from None


def open_master(
    path: str,
    destination: str,
    port: int,
    identity: str,
    known_hosts: str,
    persist_s: int,
    timeout: float = 30.0,
) -> None:
    """A master on the socket at `path` (`ssh -M -fN`, ControlPersist `persist_s`) to `destination`
    (user@address) with only the key and known_hosts named: -F /dev/null and BatchMode, so nothing
    of the caller's ssh_config applies and nothing is asked. For measuring and testing masters
    against the lab's nodes (the transport opens its own, with the host's whole ssh_config).
    subprocess.CalledProcessError or TimeoutExpired when ssh fails."""
    subprocess.run(
        [
            ssh_binary(),
            "-F",
            "/dev/null",
            "-M",
            "-S",
            path,
            "-o",
            f"ControlPersist={persist_s}",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-i",
            identity,
            "-o",
            f"UserKnownHostsFile={known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-p",
            str(port),
            "-fN",
            destination,
        ],
        check=True,
        capture_output=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def check(path: str, timeout: float | None = None) -> int | None:
    """The pid of the master listening on the socket at `path`; None when no master is there
    (nothing listens: the master was killed, or the socket is gone). MasterError when that cannot be
    told (within `timeout` seconds, CHECK_TIMEOUT_S by default)."""
    proc = _control(path, "check", CHECK_TIMEOUT_S if timeout is None else timeout)
    found = _PID.search(proc.stderr)
    if proc.returncode == 0 and found:
        return int(found.group(1))
    if _refused(path):
        return None
    said = proc.stderr.decode(errors="replace").strip().splitlines()
    raise MasterError(
        f"{path}: `ssh -O check` exited {proc.returncode}: {said[-1] if said else 'nothing said'}"
    )


def _refused(path: str) -> bool:
    """Nothing listens on the socket at `path` (or it is gone): connecting is refused, not merely
    slow."""
    probe = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    probe.settimeout(CHECK_TIMEOUT_S)
    try:
        probe.connect(path)
    except OSError as exc:
        return exc.errno in (errno.ECONNREFUSED, errno.ENOENT)
    else:
        return False
    finally:
        probe.close()


def socket_names(directory: str) -> list[str]:
    """The sockets in the directory, but one ssh is still binding (it renames it into place)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(
        n
        for n in names
        if not n.startswith(".")
        and not _BINDING.search(n)
        and _is_socket(os.path.join(directory, n))
    )


def masters(directory: str) -> list[Master]:
    """Every master socket in the directory, each asked at once: live ones least recently used first
    (those without a record first of all: nothing says when they were used), then stale and
    unanswering ones."""
    from concurrent.futures import ThreadPoolExecutor  # a run's warm start asks no master list

    names = socket_names(directory)
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        found = list(pool.map(lambda name: _ask(directory, name), names))
    return sorted(
        found, key=lambda m: (m.pid is None, m.record.used if m.record else 0.0, m.socket)
    )


def _ask(directory: str, name: str) -> Master:
    record = controldir.read_record(directory, name)
    try:
        return Master(name, check(os.path.join(directory, name)), record)
    except MasterError as exc:
        return Master(name, None, record, str(exc))


def close(directory: str, name: str) -> Closed:
    """Close the master on socket `name` (`ssh -O exit`, then wait for it to exit), or remove the
    socket when no master answers there; either way forget its record. Never raises: the outcome
    says what happened."""
    path = os.path.join(directory, name)
    host = _host(directory, name)
    try:
        pid = check(path)
        if pid is None:
            with contextlib.suppress(FileNotFoundError):
                if _is_socket(path):
                    os.unlink(path)
            controldir.forget(directory, name)
            return Closed(name, host, "stale", "no master answered; its socket was removed")
        proc = _control(path, "exit", CHECK_TIMEOUT_S)
        if proc.returncode != 0 and not _refused(path):
            said = proc.stderr.decode(errors="replace").strip().splitlines()
            raise MasterError(
                f"{path}: `ssh -O exit` exited {proc.returncode}: "
                f"{said[-1] if said else 'nothing said'}"
            )
        if not _exited(pid, EXIT_WAIT_S):
            raise MasterError(
                f"{path}: the master (pid {pid}) was asked to exit and still runs after "
                f"{EXIT_WAIT_S:g} s (kill {pid})"
            )
        controldir.forget(directory, name)
        return Closed(name, host, "closed", f"pid {pid}")
    except MasterError as exc:
        return Closed(name, host, "failed", str(exc))


def close_all(directory: str, chosen: Iterable[Master]) -> list[Closed]:
    """close() each of these masters, at once; the outcomes in their order."""
    from concurrent.futures import ThreadPoolExecutor

    names = [m.socket for m in chosen]
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        return list(pool.map(lambda name: close(directory, name), names))


def _host(directory: str, name: str) -> str:
    record = controldir.read_record(directory, name)
    return record.host if record else name


def _exited(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while True:
        if not _alive(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    """Running (a zombie has exited: its parent has yet to reap it)."""
    if not procfs.pid_alive(pid):
        return False
    fields = procfs.stat_fields(pid)
    # no /proc (macOS): kill(0) said it exists
    return fields is None or fields[0] not in ("Z", "X")


def listening_pids(directory: str) -> dict[int, str]:
    """pid → socket path of every process of this user listening on a Unix socket under `directory`
    (the path ssh gives the socket once it listens, whether or not a file is still there), from the
    kernel's own tables (/proc/net/unix, each process's fds): it finds a master whose socket file
    was removed too. Empty where there is no /proc."""
    prefix = os.path.abspath(directory).rstrip("/") + "/"
    inodes: dict[str, str] = {}
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
            next(f, None)
            for line in f:
                fields = line.split(None, 7)
                # Num RefCount Protocol Flags Type St Inode Path; flag 0x10000 is __SO_ACCEPTCON
                # (listening)
                path = fields[7].rstrip("\n") if len(fields) == 8 else ""
                if path.startswith(prefix) and int(fields[3], 16) & 0x10000:
                    # the name it was bound under: ssh's temporary one, linked to the socket's name
                    # after
                    inodes[f"socket:[{fields[6]}]"] = path[:-17] if _BINDING.search(path) else path
    except (OSError, ValueError):
        return {}
    out: dict[int, str] = {}
    if not inodes:
        return out
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            if os.stat(f"/proc/{entry}").st_uid != os.geteuid():
                continue
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                target = os.readlink(f"{fd_dir}/{fd}")
                if target in inodes:
                    out[int(entry)] = inodes[target]
                    break
    return out


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def chosen(found: Iterable[Master], words: Iterable[str] | None) -> list[Master]:
    """The masters the words name (None: all): a word matches the host as fleetops named it, its
    address, user@host, host:port, or the socket's name; globs as in -H. A master without a record
    has only its socket."""
    if words is None:
        return list(found)
    patterns = [w.strip() for w in words if w.strip()]
    out = []
    for m in found:
        names = {m.socket}
        if m.record is not None:
            r = m.record
            names |= {
                r.host,
                r.hostname,
                f"{r.user}@{r.host}",
                f"{r.host}:{r.port}",
                f"{r.user}@{r.host}:{r.port}",
                f"{r.user}@{r.hostname}",
                f"{r.hostname}:{r.port}",
            }
        if any(fnmatch.fnmatchcase(name, p) for p in patterns for name in names):
            out.append(m)
    return out


def row(m: Master, now: float | None = None) -> dict[str, Any]:
    """One master as data (`connections --json`): age and idle in seconds from its record (None
    without one), its resident memory in KiB where /proc says."""
    now = time.time() if now is None else now
    r = m.record
    return {
        "socket": m.socket,
        "host": m.host,
        "hostname": r.hostname if r else None,
        "user": r.user if r else None,
        "port": r.port if r else None,
        "jump": (r.jump or None) if r else None,
        "age_s": round(max(0.0, now - r.opened), 1) if r else None,
        "idle_s": round(max(0.0, now - r.used), 1) if r else None,
        "pid": m.pid,
        "rss_kib": rss_kib(m.pid) if m.pid else None,
        "state": "live" if m.pid else ("stale" if m.stale else "unknown"),
        "error": m.error,
    }


def rss_kib(pid: int) -> int | None:
    """A process's resident memory in KiB (VmRSS), None where /proc has none: what a master costs,
    shown."""
    return proc_kib(pid, "VmRSS")


def proc_kib(pid: int, field: str, source: str = "status") -> int | None:
    """A `Field:  N kB` line of /proc/PID/status (or of smaps_rollup: `Pss`, the share of memory a
    process alone accounts for), in KiB; None where /proc has none (gone, not Linux, an older
    kernel without smaps_rollup)."""
    prefix = field.encode() + b":"
    for line in (procfs.read(pid, source) or b"").splitlines():
        if line.startswith(prefix):
            try:
                return int(line.split()[1])
            except (ValueError, IndexError):
                return None
    return None


def fd_count(pid: int) -> int | None:
    """How many file descriptors a process holds open; None where /proc does not say."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _directory() -> str | None:
    """The control directory if there is one (none made: no master can exist). ControlDirError if
    unsafe."""
    try:
        return controldir.control_dir(create=False)
    except controldir.ControlDirError:
        for path in controldir.candidates():
            if os.path.lexists(path):  # there, but unsafe: say so rather than "no masters"
                controldir.check(path)
        return None


def survey(words: Iterable[str] | None = None) -> dict[str, Any]:
    """`connections` as data: {"directory", "masters": [row...], "error"} (error: the directory is
    unsafe)."""
    try:
        directory = _directory()
    except (controldir.ControlDirError, OSError) as exc:
        return {"directory": None, "masters": [], "error": str(exc)}
    found = masters(directory) if directory else []
    now = time.time()
    return {
        "directory": directory,
        "masters": [row(m, now) for m in chosen(found, words)],
        "error": "",
    }


def disconnect(words: Iterable[str] | None = None) -> dict[str, Any]:
    """`disconnect` as data: {"directory", "hosts" (the words, None: all), "closed": [{"socket",
    "host", "outcome", "detail"}...], "error"}."""
    hosts = list(words) if words is not None else None
    try:
        directory = _directory()
    except (controldir.ControlDirError, OSError) as exc:
        return {"directory": None, "hosts": hosts, "closed": [], "error": str(exc)}
    found = chosen(masters(directory), hosts) if directory else []
    done = close_all(directory, found) if directory else []
    return {
        "directory": directory,
        "hosts": hosts,
        "error": "",
        "closed": [
            {"socket": c.socket, "host": c.host, "outcome": c.outcome, "detail": c.detail}
            for c in done
        ],
    }
