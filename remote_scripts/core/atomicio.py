"""Atomic files: writes that readers see whole or not at all (temp file, fsync, rename), the state
directories they go in, and the operator's words for an OSError. Stdlib only."""

from __future__ import annotations

import errno
import json
import os
import stat

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


def clean_stale_temps(path: str, dir_fd: int | None = None) -> list[str]:
    """Temp files a killed writer left beside `path` (its pid is gone): remove them (in `dir_fd`,
    when given: the directory the writer opened)."""
    directory, base = os.path.split(path)
    prefix = f".{base}{TMP_MARK}"
    removed: list[str] = []
    try:
        names = os.listdir(dir_fd if dir_fd is not None else directory or ".")
    except OSError:
        return removed
    for name in names:
        if (
            name.startswith(prefix)
            and name[len(prefix) :].isdigit()
            and not pid_alive(int(name[len(prefix) :]))
        ):
            try:
                if dir_fd is not None:
                    os.unlink(name, dir_fd=dir_fd)
                else:
                    os.unlink(os.path.join(directory, name))
                removed.append(name)
            except OSError:
                pass
    return removed


# ---------------------------------------------------------------- who may change where fleetops
# writes
def login_uids() -> tuple[int, ...]:
    """Who may own (and alone write) a directory fleetops writes into: root and the login user (the
    connecting user; under become, the user sudo ran the agent for: sudo's own SUDO_UID)."""
    uid = os.geteuid()
    sudo_uid = os.environ.get("SUDO_UID", "") if uid == 0 else ""
    return (0, uid, int(sudo_uid)) if sudo_uid.isdigit() and int(sudo_uid) != uid else (0, uid)


class UnsafeTarget(OSError):
    """A write refused before anything was written: the target, or a directory on its path, could be
    changed by another user than root and the login user. An OSError, so that every writer's caller
    reports it as it reports a failed write (a patch set is put back whole). The message names the
    path, its mode and owner."""

    kind = "untrusted_target"

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.details = details


WRITE_FIX = (
    "another user who may write there could swap what fleetops writes as uid %d for a link to "
    "any file: make it writable by its owner alone (chmod go-w {path}), or run again with "
    "--allow-insecure-venv to go on with a warning"
)


def _refusal(target: str, path: str, why: str, st: os.stat_result | None, fix: str) -> UnsafeTarget:
    mode = (
        f" [mode {stat.filemode(st.st_mode)} ({st.st_mode & 0o7777:04o}), owner uid {st.st_uid}]"
        if st
        else ""
    )
    return UnsafeTarget(
        f"refusing to write {target}: {path} {why}{mode}; {fix}",
        path=path,
        mode=f"{st.st_mode & 0o7777:04o}" if st else None,
        uid=st.st_uid if st else None,
    )


def _paths() -> tuple:
    from . import launch

    if launch.PATHS is None:
        raise RuntimeError(
            "this process was not started through the verifying bootstrap: it has no walk to check "
            "where it writes, and writes nothing"
        )
    return launch.PATHS


def _write_rules(target: str) -> object:
    uids = login_uids()
    rules = _paths()[1]

    class WriteRules(rules):  # type: ignore[misc,valid-type]
        def refuse(self, path: str, why: str, st: os.stat_result, fix: str) -> None:
            raise _refusal(target, path, why, st, fix)

        def owner(self, path: str, st: os.stat_result, on_way: str) -> None:
            if st.st_uid not in uids:
                self.refuse(
                    path,
                    f"{on_way}is owned by uid {st.st_uid}, not by root or the login user (uid "
                    f"{uids[-1]})",
                    st,
                    f"check who changed it, then chown {uids[-1]} {path} (or remove "
                    "it) and run again",
                )

    return WriteRules("the file", "untrusted_target", WRITE_FIX % os.geteuid(), "")


def open_write_dir(directory: str, target: str) -> int:
    """A descriptor (O_DIRECTORY|O_NOFOLLOW) of the directory `target` is written into, reached by
    the bootstrap's walk from /: every directory on its path root's or the login user's and writable
    by no one else (one on the way may be sticky), a symlink on the way followed only where no other
    user may change it. UnsafeTarget otherwise (--allow-insecure-venv: written anyway, with a
    warning in the answer)."""
    try:
        fd = _paths()[0](os.path.abspath(directory), _write_rules(target), final_link=True)
    except UnsafeTarget as exc:
        from .launch import insecure_allowed, warn

        if not insecure_allowed():
            raise
        warn(
            "--allow-insecure-venv: writing anyway, as asked: "
            f"{str(exc).split(': ', 1)[1].split('; ')[0]}"
        )
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    if fd is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), directory)
    return fd


def _target_stat(dir_fd: int, name: str, path: str) -> os.stat_result | None:
    """The file being replaced, never through a link: a symlink or anything not a regular file is
    refused (--allow-insecure-venv or not: the link's own mode and owner mean nothing)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            to = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            to = "?"
        raise _refusal(
            path,
            path,
            f"is a symlink (to {to}); fleetops never writes through a link",
            st,
            "check who put it there; replace it by the file itself and run again",
        )
    if not stat.S_ISREG(st.st_mode):
        raise _refusal(
            path,
            path,
            "is not a regular file",
            st,
            f"move it aside (mv {path} {path}.moved) and run again",
        )
    return st


def check_target(path: str) -> None:
    """What atomic_write would refuse for `path`, found without writing (check mode):
    UnsafeTarget."""
    directory, name = os.path.split(os.path.abspath(path))
    dir_fd = open_write_dir(directory, path)
    try:
        _target_stat(dir_fd, name, path)
    finally:
        os.close(dir_fd)


def atomic_write(
    path: str,
    data: bytes,
    mode: int | None = None,
    like: str | None = None,
    point: str = "write",
    durable: bool = True,
) -> None:
    """Write via a temp file in the same directory, fsync, rename: readers see old or new, never
    half. By descriptor throughout: the directory is opened once (open_write_dir: refused when
    another user may change it), the temp file created in it, its mode and owner set on the open
    file, and renamed within it; the file replaced is looked at without following a link (a symlink
    there is refused). Nothing is written when refused.

    `like` copies mode and ownership from an existing file (the file being replaced).
    `durable=False` skips the fsyncs (still old or new, never half, while the machine stays up): for
    notes a crash may lose."""
    directory, name = os.path.split(os.path.abspath(path))
    dir_fd = open_write_dir(directory, path)
    try:
        st = _target_stat(dir_fd, name, path)
        if like is not None and os.path.abspath(like) != os.path.abspath(path):
            like_dir = open_write_dir(os.path.dirname(os.path.abspath(like)), like)
            try:
                st = _target_stat(like_dir, os.path.basename(like), like)
            finally:
                os.close(like_dir)
        if like is not None and st is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), like)
        _write_in(dir_fd, name, path, data, st if like is not None else None, mode, point, durable)
    finally:
        os.close(dir_fd)


def _write_in(
    dir_fd: int,
    name: str,
    path: str,
    data: bytes,
    like: os.stat_result | None,
    mode: int | None,
    point: str,
    durable: bool,
) -> None:
    clean_stale_temps(path, dir_fd)
    tmp = f".{name}{TMP_MARK}{os.getpid()}"
    try:
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=dir_fd,
        )
    except OSError as exc:
        if exc.filename is None or exc.filename == tmp:
            exc.filename = path
        raise
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if like is not None:
                # owner first: a chown clears the set-id bits the chmod then sets
                if os.geteuid() == 0:
                    os.fchown(fd, like.st_uid, like.st_gid)
                os.fchmod(fd, like.st_mode & 0o7777)
            elif mode is not None:
                os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
            ours = os.fstat(fd)
        finally:
            os.close(fd)
        failpoint(f"{point}.before_rename", path)
        _still_ours(dir_fd, tmp, ours, path)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as exc:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        if (
            isinstance(exc, OSError)
            and not isinstance(exc, UnsafeTarget)
            and exc.filename in (None, tmp, name)
        ):
            # write() and fsync() name no file; "no space left on device" alone names no disk
            exc.filename = path
        raise
    failpoint(f"{point}.after_rename", path)
    if durable:
        os.fsync(dir_fd)


def _still_ours(dir_fd: int, tmp: str, ours: os.stat_result, path: str) -> None:
    """The temp name still holds the file written here: in a directory another user may write (the
    operator's --allow-insecure-venv) it could have been swapped for a link, which the rename would
    put in the target's place."""
    try:
        now: os.stat_result | None = os.stat(tmp, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        now = None
    # the type, owner and link count too: a file system hands a freed inode number straight to the
    # next file
    if (
        now is None
        or not stat.S_ISREG(now.st_mode)
        or now.st_nlink != 1
        or (now.st_dev, now.st_ino, now.st_uid) != (ours.st_dev, ours.st_ino, ours.st_uid)
    ):
        raise _refusal(
            path,
            os.path.join(os.path.dirname(path), tmp),
            "(the file written for it) was replaced before it was put in place",
            now,
            "make its directory writable by root and the login user only, then run again",
        )


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
    atomic_write(
        path,
        (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode(),
        mode=0o600,
        point=point,
        durable=durable,
    )


def os_error_message(exc: OSError, what: str) -> str:
    reason = {
        errno.ENOSPC: "no space left on device",
        errno.EROFS: "read-only file system",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
        errno.EDQUOT: "disk quota exceeded",
    }.get(exc.errno or 0, exc.strerror or str(exc))
    if exc.errno in (errno.ENOSPC, errno.EDQUOT) and exc.filename:
        where = os.path.dirname(str(exc.filename)) or "."
        return (
            f"{what}: {reason} writing {exc.filename}; "
            f"free space on that filesystem (df -h {where})"
        )
    target = f" ({exc.filename})" if exc.filename else ""
    return f"{what}: {reason}{target}"
