"""The node lock: one operator at a time per node, and a note naming the holder for whoever is
refused. Stdlib only."""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from .atomicio import ensure_dir, write_json_atomic
from .failpoints import failpoint
from .nodeio import NodeError, now_iso
from .statetrust import read_json, trusted_stat


class NodeLock:
    """One operator at a time per node. flock makes a dead holder's lock free by itself; the JSON
    beside it names the holder so the refused operator knows whom to ask."""

    def __init__(self, state_dir: str, operator: str, op: str) -> None:
        self.path = os.path.join(state_dir, "lock")
        self.info_path = os.path.join(state_dir, "lock.json")
        self.operator, self.op = operator, op
        self.fd: int | None = None
        self.took_over: dict | None = None

    def __enter__(self) -> NodeLock:
        ensure_dir(os.path.dirname(self.path))
        try:  # never through a symlink: `lock` -> /somewhere must not create /somewhere
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                trusted_stat(self.path)  # raises, naming the symlink and its target
            raise
        try:
            st = os.fstat(fd)
            if (
                not stat.S_ISREG(st.st_mode)
                or st.st_uid not in (os.geteuid(), 0)
                or st.st_mode & 0o022
            ):
                trusted_stat(self.path, want_dir=False)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = read_json(self.info_path, on_corrupt="quarantine") or {}
            raise NodeError(
                f"node is locked by {holder.get('operator', '?')} ({holder.get('op', '?')}, pid "
                f"{holder.get('pid', '?')}) since "
                f"{holder.get('since', '?')}; try again when it finishes",
                kind="locked",
                holder=holder,
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        previous = read_json(self.info_path, on_corrupt="quarantine")
        # we hold the flock, so its holder is gone (its pid may name another process by now)
        if previous:
            # it died mid-operation: a holder removes lock.json before it lets go
            self.took_over = previous
        try:  # not durable: it names the holder for a refused operator; the flock is the lock
            write_json_atomic(
                self.info_path,
                {"operator": self.operator, "op": self.op, "pid": os.getpid(), "since": now_iso()},
                point="lock.info",
                durable=False,
            )
            failpoint("lock.acquired")
        except BaseException:  # an interrupt here: `with` calls no __exit__ for a failed __enter__
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            os.unlink(self.info_path)
        except OSError:
            pass
        if self.fd is not None:
            os.close(self.fd)  # releases the flock
