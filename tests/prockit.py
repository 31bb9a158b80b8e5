"""What the lab tests read of this machine's processes (/proc, Linux): each process's argv, the ssh
processes of a control directory, and a control directory of a test's own whose masters are closed
and checked gone after it."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator

import pytest
from conftest import ssh_masters

from fleetops.wire import masters


def cmdlines() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, argv) of every process this user may read now; one gone meanwhile is skipped."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        yield int(entry), words


def ssh_processes(folder: str) -> list[int]:
    """Every ssh process whose command line names this control directory: masters, sessions on them
    (an `ssh` started for one), and a login not yet done (ssh_masters sees only masters that
    listen)."""
    return [
        pid
        for pid, words in cmdlines()
        if os.path.basename(words[0]) == b"ssh" and any(folder.encode() in w for w in words)
    ]


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
