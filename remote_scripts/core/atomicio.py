"""Atomic files: writes that readers see whole or not at all (temp file, fsync, rename), the state
directories they go in, and the operator's words for an OSError. Stdlib only."""

from __future__ import annotations

import errno
import json
import os

from .failpoints import failpoint
from .procfs import pid_alive
from .statetrust import trusted_stat


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


TMP_MARK = ".fleetops-tmp-"


def clean_stale_temps(path: str) -> list[str]:
    """Temp files a killed writer left beside `path` (its pid is gone): remove them."""
    directory, base = os.path.split(path)
    prefix = f".{base}{TMP_MARK}"
    removed = []
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return removed
    for name in names:
        if name.startswith(prefix) and name[len(prefix):].isdigit() and not pid_alive(int(name[len(prefix):])):
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(name)
            except OSError:
                pass
    return removed


def atomic_write(path: str, data: bytes, mode: int | None = None, like: str | None = None,
                 point: str = "write", durable: bool = True) -> None:
    """Write via a temp file in the same directory, fsync, rename: readers see old or new, never half.

    `like` copies mode and ownership from an existing file (the file being replaced). `durable=False` skips
    the fsyncs (still old or new, never half, while the machine stays up): for notes a crash may lose."""
    directory = os.path.dirname(path) or "."
    st = os.stat(like) if like else None
    clean_stale_temps(path)
    tmp = os.path.join(directory, f".{os.path.basename(path)}{TMP_MARK}{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if st is not None:
            os.chmod(tmp, st.st_mode & 0o7777)
            if os.geteuid() == 0:
                os.chown(tmp, st.st_uid, st.st_gid)
        elif mode is not None:
            os.chmod(tmp, mode)
        failpoint(f"{point}.before_rename", path)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = path  # write() and fsync() name no file; "no space left on device" alone names no disk
        raise
    failpoint(f"{point}.after_rename", path)
    if durable:
        fsync_dir(directory)


def ensure_dir(path: str) -> None:
    """Make a state directory (0700) and refuse one that is a symlink or not ours alone."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(path, mode=0o700, exist_ok=True)
    trusted_stat(path, want_dir=True)


def write_json_atomic(path: str, obj: object, point: str = "json", durable: bool = True) -> None:
    atomic_write(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode(), mode=0o600, point=point,
                 durable=durable)


def os_error_message(exc: OSError, what: str) -> str:
    reason = {errno.ENOSPC: "no space left on device", errno.EROFS: "read-only file system",
              errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
              errno.EDQUOT: "disk quota exceeded"}.get(exc.errno or 0, exc.strerror or str(exc))
    if exc.errno in (errno.ENOSPC, errno.EDQUOT) and exc.filename:
        where = os.path.dirname(str(exc.filename)) or "."
        return f"{what}: {reason} writing {exc.filename}; free space on that filesystem (df -h {where})"
    target = f" ({exc.filename})" if exc.filename else ""
    return f"{what}: {reason}{target}"
