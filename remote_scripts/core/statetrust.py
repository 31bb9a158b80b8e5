"""Trusting the state dir (StrictModes): what fleetops reads back or locks there is refused unless
it is ours (or root's), writable by no one else and not a symlink; a corrupt state file is named or
moved aside; dead uploads' temp files are cleaned from bin/. Every request checks this before its op
runs. Stdlib only."""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import time

from .nodeio import NodeError

# typing.TYPE_CHECKING without importing typing: the agent's start-up imports only what it runs
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


# Like OpenSSH's StrictModes for ~/.ssh: every path fleetops uses in its state dir must be owned by
# the connecting user (or root), writable by no one else, and not a symlink; otherwise the node
# refuses, naming the path, its mode and owner, and what to do. The agent's own code was already
# checked by the bootstrap (bundle.BOOTSTRAP: state dir, bin/, the agent's bytes against the sha256
# the client expects).
STATE_NAMES = ("bin", "lock", "lock.json", "backups", "jobs", "cache", "drain.json")
STATE_DIRS = ("bin", "backups", "jobs", "cache")
QUARANTINABLE = ("lock.json",)
JOB_STATE_FILES = ("job.json", "exit.json", "request.json", "secret-env.json")  # jobs.py's names
JOB_LOG = "output.log"


# the bootstrap's: a chmod there breaks it for every user
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
SHARED_FIX = (
    "it is a directory every user shares: never chmod it; use a private directory instead (for "
    "the state dir: `state_dir:` in the inventory, e.g. ~/.fleetops, or a 0700 directory of your "
    "own inside this one)"
)


def _untrusted(path: str, why: str, st: os.stat_result | None, fix: str) -> NodeError:
    mode = (
        f"mode {stat.filemode(st.st_mode)} ({st.st_mode & 0o7777:04o}), owner uid {st.st_uid}"
        if st
        else ""
    )
    return NodeError(
        f"refusing to use the state dir: {path} {why}{f' [{mode}]' if mode else ''}; {fix}",
        kind="untrusted_state",
        path=path,
        mode=f"{st.st_mode & 0o7777:04o}" if st else None,
        uid=st.st_uid if st else None,
    )


def trusted_stat(path: str, want_dir: bool | None = None) -> os.stat_result | None:
    """lstat `path` and refuse it unless it is ours (or root's), writable by no one else, not a
    symlink. None when it does not exist."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise _untrusted(
            path,
            f"is a symlink (to {target}); fleetops never follows symlinks in its state dir",
            st,
            f"remove it (rm {path}) and run again; fleetops recreates what it needs",
        )
    judge(path, st, want_dir)
    return st


def judge(path: str, st: os.stat_result, want_dir: bool | None = None) -> None:
    """Refuse what `st` (an lstat, or the fstat of a descriptor opened with O_NOFOLLOW) says about
    `path` unless it is ours (or root's) and writable by no one else (and a directory or a regular
    file, as asked)."""
    uid = os.geteuid()
    if st.st_uid not in (uid, 0):
        raise _untrusted(
            path,
            f"is owned by uid {st.st_uid}, not by the connecting user (uid {uid}) or root",
            st,
            f"check who changed it, then chown {uid} {path} (or remove it) and run again",
        )
    if st.st_mode & 0o022:
        shared = path.rstrip("/") in SHARED_DIRS or st.st_mode & 0o1002 == 0o1002
        raise _untrusted(
            path,
            "is writable by group or others",
            st,
            SHARED_FIX if shared else f"check who changed it, then chmod go-w {path} and run again",
        )
    if want_dir is True and not stat.S_ISDIR(st.st_mode):
        raise _untrusted(
            path, "is not a directory", st, f"move it aside (mv {path} {path}.moved) and run again"
        )
    if want_dir is False and not stat.S_ISREG(st.st_mode):
        raise _untrusted(
            path,
            "is not a regular file",
            st,
            f"move it aside (mv {path} {path}.moved) and run again",
        )


def open_state_file(path: str, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """A descriptor of a state file fleetops reads back (or locks), never through a symlink, refused
    unless it is a regular file that is ours (or root's) and writable by no one else.
    FileNotFoundError when it does not exist (and flags do not create it)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            trusted_stat(path)  # raises, naming the symlink and its target
        raise
    try:
        judge(path, os.fstat(fd), want_dir=False)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_state_dir(state_dir: str) -> None:
    """Before any op: the state dir and every path fleetops uses in it (bin/, lock, lock.json,
    backups/ and jobs/ with what they hold) pass trusted_stat()."""
    trusted_stat(state_dir, want_dir=True)
    for name in STATE_NAMES:
        path = os.path.join(state_dir, name)
        # only names the lock holder: a broken one is moved aside, not fatal forever
        if name in QUARANTINABLE:
            try:
                found = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(found.st_mode):
                quarantine(
                    path,
                    f"a symlink to {os.readlink(path)}"
                    if stat.S_ISLNK(found.st_mode)
                    else "not a regular file",
                )
                continue
            trusted_stat(path, want_dir=False)
            read_json(path, on_corrupt="quarantine")
            continue
        st = trusted_stat(path, want_dir=name in STATE_DIRS)
        if st is None or name not in ("backups", "jobs"):
            continue
        for entry in sorted(os.listdir(path)):
            sub = os.path.join(path, entry)
            sub_st = trusted_stat(sub)
            # jobs/<id>/: the files fleetops reads
            if sub_st is not None and stat.S_ISDIR(sub_st.st_mode):
                for leaf in JOB_STATE_FILES:  # (the rest is the job's own: it runs there, its cwd)
                    trusted_stat(os.path.join(sub, leaf))
                _owned_not_link(os.path.join(sub, JOB_LOG))  # its mode is the job's umask's


def _owned_not_link(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or st.st_uid not in (os.geteuid(), 0):
        trusted_stat(path)


# Uploads (wire/ssh.py) write <name>.<8 hex>.tmp in bin/ and rename it; one killed midway leaves it.
# Its writer (an sftp-server) names no pid, so a temp file older than this is a dead writer's: an
# upload takes seconds.
STALE_UPLOAD_S = 600
_HEX = frozenset("0123456789abcdef")


def is_upload_tmp(name: str) -> bool:
    """fleetops-agent-<hex>.pyz.<8 hex>.tmp: an upload's temp file."""
    if not (name.startswith("fleetops-agent-") and name.endswith(".tmp")):
        return False
    digest, dot_pyz, tag = name[len("fleetops-agent-") : -len(".tmp")].partition(".pyz.")
    return bool(
        dot_pyz and digest and len(tag) == 8 and _HEX.issuperset(digest) and _HEX.issuperset(tag)
    )


def clean_stale_uploads(state_dir: str, older_than: float = STALE_UPLOAD_S) -> list[str]:
    """Remove dead uploads' temp files from bin/ (plain files only, never through a symlink)."""
    bin_dir = os.path.join(state_dir, "bin")
    now = time.time()

    def stale(name: str) -> bool:
        if not is_upload_tmp(name):
            return False
        try:
            st = os.lstat(os.path.join(bin_dir, name))
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and now - st.st_mtime > older_than

    return remove_entries(bin_dir, stale)


def remove_entries(directory: str, wanted: Callable[[str], bool]) -> list[str]:
    """Unlink the entries of `directory` whose names `wanted` picks: the paths removed. A directory
    that cannot be listed, or an entry that cannot be removed, is left as it is (cleaning up is
    never fatal)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for name in names:
        if wanted(name):
            path = os.path.join(directory, name)
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed


# Reading state back: a corrupt file is refused by name, or moved aside where only the lock's holder
# note is lost. corrupt state files moved aside during this op; agent.main reports them
QUARANTINED: list[dict] = []


def quarantine(path: str, why: str) -> str:
    """Move a corrupt state file (or a symlink in its place: the link itself, never its target)
    aside."""
    aside = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"
    os.rename(path, aside)
    QUARANTINED.append({"path": path, "moved_to": aside, "why": why})
    print(
        f"fleetops: quarantined corrupt state file {path} ({why}); moved to {aside}",
        file=sys.stderr,
    )
    return aside


def read_json(path: str, on_corrupt: str = "raise") -> dict | None:
    """A state JSON file, never through a symlink, refused (untrusted_state) when another user owns
    it or may write it. A corrupt one (not JSON, a symlink, not a regular file): on_corrupt="raise"
    refuses naming it; "quarantine" moves it aside (reported) and returns None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        why = f"a symlink to {os.readlink(path)}"
    else:
        try:
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    why = "not a regular file"
                else:
                    # another user's, or writable by one: refused (not corrupt: planted)
                    judge(path, st)
                    value = json.loads(f.read().decode("utf-8"))
                    return value if isinstance(value, dict) else None
        except (ValueError, UnicodeDecodeError) as exc:
            why = f"not JSON: {exc}"
    if on_corrupt == "quarantine":
        quarantine(path, why)
        return None
    raise NodeError(
        f"corrupt state file {path} ({why}); move it aside (mv {path} {path}.bad) and run again",
        kind="corrupt_state",
        path=path,
    )
