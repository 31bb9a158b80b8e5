"""What the lab tests read of this machine's processes (/proc, Linux): each process's argv and the
ssh processes of a control directory (defined in conftest, whose end of the suite checks them
too), a watch for a secret in any argv, and a control directory of a test's own whose masters are
closed and checked gone after it."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator

import pytest
from conftest import cmdlines, ssh_masters

from fleetops.wire import masters


def control_dir(monkeypatch: pytest.MonkeyPatch, prefix: str, **env: str) -> Iterator[str]:
    """For a fixture: a control directory of the test's own (short, under /tmp: a socket's path
    must fit), in FLEETOPS_CONTROL_DIR with `env` beside it; after the test its masters are closed,
    and any left running fails it."""
    folder = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    monkeypatch.setenv("FLEETOPS_CONTROL_DIR", folder)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        yield folder
    finally:
        masters.close_all(folder, masters.masters(folder))
        left = ssh_masters(folder)
        shutil.rmtree(folder, ignore_errors=True)
        assert not left, f"ssh masters left running: {left}"


class ArgvWatch(threading.Thread):
    """Reads every process's argv from /proc over and over until stopped: the argvs holding
    `secret`, and whether a master login with `key` was among those seen."""

    def __init__(self, secret: bytes, key: bytes) -> None:
        super().__init__(daemon=True)
        self.secret, self.key = secret, key
        self.stop = threading.Event()
        self.holding: list[list[bytes]] = []
        self.master_seen = False
        self.rounds = 0

    def run(self) -> None:
        while not self.stop.is_set():
            for _, argv in cmdlines():
                if any(self.secret in word for word in argv):
                    self.holding.append(argv)
                if b"ControlMaster=yes" in argv and self.key in argv:
                    self.master_seen = True
            self.rounds += 1
