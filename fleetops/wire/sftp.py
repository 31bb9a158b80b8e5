"""SFTP transfers on an open connection: a file written atomically, a byte range copied
resumably."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..plans.inventory import Host
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
            sftp.mkdir(directory, 0o700)
    tmp = f"{path}.{os.urandom(4).hex()}.tmp"
    with sftp.open(tmp, "wb") as f:
        f.write(data)
    sftp.posix_rename(tmp, path)


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
