"""jobs/launch.lock (stdlib only): the running check and the launch of one job are one step per
node, so two `extract` at the same moment launch one job and refuse the other; patch and rollback
hold it while they look for a running job and write (health/guard.py), so no job starts between that
look and the write. Its own module so that patch's guard does not load the launcher (subprocess,
ctypes) on every agent start."""

from __future__ import annotations

import fcntl
import os
import time

from ..core.atomicio import ensure_dir
from ..core.nodeio import NodeError
from ..core.statetrust import open_state_file
from .records import jobs_dir

LAUNCH_LOCK = "launch.lock"
LAUNCH_LOCK_WAIT_S = 60.0


class LaunchLock:
    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(jobs_dir(state_dir), LAUNCH_LOCK)
        self.fd = -1

    def __enter__(self) -> LaunchLock:
        ensure_dir(os.path.dirname(self.path))
        self.fd = open_state_file(self.path, os.O_RDWR | os.O_CREAT)
        deadline = time.monotonic() + LAUNCH_LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    raise NodeError(
                        f"another launch held {self.path} for "
                        f"{LAUNCH_LOCK_WAIT_S:.0f} s; run again",
                        kind="locked",
                    ) from None
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # releases the flock
