"""SFTP transfers on an open connection: a file written atomically, a byte range copied
resumably."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..plans.inventory import Host
from ..plans.pathtrust import Entry, judge_read
from .connector import TransportError, link_errors

if TYPE_CHECKING:
    import paramiko


def sftp_failed(host: Host, exc: BaseException) -> str:
    """The SFTP subsystem would not start (sshd's Subsystem line names a program that is missing or
    fails, or the login's shell prints on stdout): paramiko says only "EOF during negotiation"."""
    reason = getattr(exc, "strerror", None) or " ".join(str(exc).split()) or type(exc).__name__
    return (
        f"{host.name}: the node's sftp-server did not start: "
        f"{reason}; check the `Subsystem sftp` line of the "
        "node's sshd_config (its program must exist and run for "
        f"{host.user or 'the login user'}) and that "
        "the login shell's start-up files print nothing, or "
        "set `become: sudo` for this host (the agent then "
        "travels on stdin, without SFTP)"
    )


def write_atomically(sftp: paramiko.SFTPClient | Any, path: str, data: bytes) -> None:
    """path written whole or not at all (a temp name, then a rename), its missing folders made
    0700."""
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    directory = ""
    for part in parent.split("/"):
        directory = f"{directory}/{part}" if directory or parent.startswith("/") else part
        if not part:
            continue
        try:
            sftp.stat(directory)
        except OSError:
            try:
                sftp.mkdir(directory, 0o700)
            except OSError:
                # another run made it between the look and the mkdir (runs at once at a new node),
                # which SFTP refuses with a bare failure: the folder there now is as good, as with
                # `mkdir -p`; anything else is the mkdir's error
                if not _is_directory(sftp, directory):
                    raise
    tmp = f"{path}.{os.urandom(4).hex()}.tmp"
    with sftp.open(tmp, "wb") as f:
        f.write(data)
    sftp.posix_rename(tmp, path)


def _is_directory(sftp: paramiko.SFTPClient | Any, path: str) -> bool:
    try:
        return stat.S_ISDIR(sftp.stat(path).st_mode or 0)
    except OSError:
        return False


def copy_range(
    sftp: Callable[[], paramiko.SFTPClient | Any],
    remote: str,
    local_path: str,
    offset: int,
    end: int,
    progress: object,
    name: str,
    connected: Callable[[], bool],
    denied: str = "",
    read_ahead: bool = True,
) -> int:
    """Bytes [offset, end) of remote (over the SFTP session sftp() gives) into local_path at offset
    (truncated there first, so a partial copy resumes); progress(n) is called with the bytes written
    so far. Returns them. A copy that stops raises TransportError naming host `name` and the byte it
    stopped at ("lost" when the connection is gone). A file the login user may not read is said as
    such, with `denied` (why, and what to do), and no resume: running fetch again cannot change who
    reads it. `read_ahead`: whether the file's prefetch() may be used (paramiko's needs
    compat.quiet_prefetch_thread())."""
    written = 0
    try:
        mode = "r+b" if os.path.exists(local_path) else "wb"
        with open(local_path, mode) as out, sftp().open(remote, "rb") as f:
            out.truncate(offset)
            out.seek(offset)
            f.seek(offset)
            # else paramiko reads each chunk when asked: no thread of its own to die loudly
            if read_ahead:
                f.prefetch(end, max_concurrent_requests=64)
            while offset + written < end:
                chunk = f.read(min(1 << 20, end - offset - written))
                if not chunk:
                    raise EOFError(f"{remote} ended at byte {offset + written} (expected {end})")
                out.write(chunk)
                written += len(chunk)
                if callable(progress):
                    progress(written)
    except PermissionError:
        raise TransportError(
            "remote",
            f"{name}: cannot read {remote}: SFTP reads as the login user, who may not "
            f"read it{denied or ''}; nothing of it was downloaded",
        ) from None
    except link_errors() as exc:
        reason = getattr(exc, "strerror", None) or " ".join(str(exc).split()) or type(exc).__name__
        lost = not connected()
        raise TransportError(
            "lost" if lost else "remote",
            f"{name}: download of {remote} stopped at "
            f"byte {offset + written} ({reason}); run fetch again to resume",
        ) from None
    return written


def denied_hint(host: Host) -> str:
    """What copy_range adds to "may not read it" on a `become` host (why, and what to do): the
    files a root agent made are root's, and SFTP reads as the login user."""
    if not host.become:
        return ""
    return (
        " (under become: sudo the job's files are root's, and fleetops never reads files as "
        f"root over SFTP; make them readable by {host.user or 'the login user'}, "
        "e.g. chmod a+r on the node, then fetch again)"
    )


@dataclass
class ReadPathSeen:
    """One connection's answers for check_read_path: the login user's uid, and the directories
    lstat'ed (a directory of many files is asked once)."""

    login_uid: int | None = None
    directories: dict[str, Entry] = field(default_factory=dict)


def check_read_path(
    sftp: paramiko.SFTPClient | Any, host: Host, remote: str, seen: ReadPathSeen
) -> None:
    """become: the agent (root) listed the file by descriptor; the login user's SFTP read goes by
    path, so it reads only through directories no one but root and the login user can change
    (pathtrust.judge_read), else it is refused plainly (TransportError), nothing read."""
    user = host.user or "the login user"
    try:
        if seen.login_uid is None:
            home = sftp.lstat(sftp.normalize("."))
            if home.st_uid is None:
                raise OSError("the SFTP start directory says no owner")
            seen.login_uid = int(home.st_uid)
        problem = judge_read(
            remote,
            lambda path: _lstat(sftp, path, seen),
            lambda path: sftp.readlink(path) or "",
            frozenset({0, seen.login_uid}),
        )
    except PermissionError:
        # what the login user may not lstat it may not open either: the read says so plainly
        return
    except link_errors() as exc:
        reason = getattr(exc, "strerror", None) or " ".join(str(exc).split()) or type(exc).__name__
        raise TransportError(
            "remote",
            f"{host.name}: cannot check the path of {remote} as {user} before "
            f"reading it ({reason}); nothing read",
        ) from None
    if problem is not None:
        raise TransportError(
            "remote",
            f"{host.name}: refusing to read {remote} as {user}: {problem.describe()}; nothing read",
        )


def _lstat(sftp: paramiko.SFTPClient | Any, path: str, seen: ReadPathSeen) -> Entry | None:
    known = seen.directories.get(path)
    if known is not None:
        return known
    try:
        attrs = sftp.lstat(path)
    except FileNotFoundError:
        return None
    entry = Entry(
        int(attrs.st_mode or 0),
        int(attrs.st_uid if attrs.st_uid is not None else -1),
        int(attrs.st_gid if attrs.st_gid is not None else -1),
    )
    if stat.S_ISDIR(entry.mode):
        seen.directories[path] = entry
    return entry
