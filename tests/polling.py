"""Waiting on evidence instead of fixed sleeps: the tests share 2 loaded CPU cores, so a step may
take seconds. Every wait has a generous deadline and says what it was waiting for when it runs
out."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
DEADLINE_S = 60.0


def wait_for(
    probe: Callable[[], T], what: str, timeout: float = DEADLINE_S, every: float = 0.05
) -> T:
    """Call probe until it returns something true; that value, or an AssertionError naming
    `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"gave up after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


class Follower:
    """A `fab` command run in the background whose stdout is read line by line as it comes, so a
    test can wait for a line (evidence that the command reached some point) before it acts."""

    def __init__(self, cwd: Path, args: list[str], env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.errors: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fabric", *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        self._reader = threading.Thread(
            target=self._read, args=(self.proc.stdout, self.lines), daemon=True
        )
        self._reader.start()
        # stderr drained too, so a chatty command never blocks on a full pipe
        self._err_reader = threading.Thread(
            target=self._read, args=(self.proc.stderr, self.errors), daemon=True
        )
        self._err_reader.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        # A test that failed half-way: end the command now instead of waiting for it to finish on
        # its own.
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_line(self, pattern: str, what: str, timeout: float = DEADLINE_S) -> str:
        rx = re.compile(pattern)

        def seen() -> str | None:
            hit = next((ln for ln in list(self.lines) if rx.search(ln)), None)
            if hit is None and self.proc.poll() is not None and not self._reader.is_alive():
                raise AssertionError(
                    f"fab exited {self.proc.returncode} before {what}:\n{self.text()[-3000:]}"
                )
            return hit

        try:
            return wait_for(seen, f"{what} (a line matching {pattern!r})", timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; output so far:\n{self.text()[-3000:]}") from None

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
        """Wait for the command to end: its exit status, whole stdout and stderr."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"fab did not end within {timeout:.0f}s:\n{self.text()[-3000:]}"
            ) from None
        self._reader.join(timeout=30)
        self._err_reader.join(timeout=30)
        return self.proc.returncode, self.text(), "\n".join(self.errors)


def proc_state(pid: int) -> str:
    """The process's state letter from /proc (R, S, Z...), or 'gone'."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def live_members(pgid: int) -> list[int]:
    """Every live (not zombie) process whose process group or session is pgid, read from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X") and pgid in (int(fields[2]), int(fields[3])):
            found.append(int(entry))
    return found
