"""A real terminal for tests: a bash shell in a tmux session of a given size, on a tmux server of
its own.

What the operator sees is tmux's screen (`capture-pane`, wrapped lines joined as a terminal's copy
joins them), and what the operator pastes is typed into the shell as keys: a test reads a command
off the screen and types it back, exactly as printed. Needs tmux (Debian's package); `available()`
says whether it is there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

RC_MARK = "__rc="
# the checkout under test: its code, whatever `fab` is installed
REPO = Path(__file__).resolve().parent.parent


def available() -> bool:
    return shutil.which("tmux") is not None


class Terminal:
    """`with Terminal(cwd, env) as term: rc, screen = term.run("fab -H lab01 jobs")`."""

    def __init__(
        self, cwd: Path, env: dict[str, str] | None = None, width: int = 80, height: int = 40
    ) -> None:
        self.cwd = cwd
        self.width, self.height = width, height
        self.dir = Path(tempfile.mkdtemp(prefix="fleetops-term-"))
        self.socket = self.dir / "tmux.sock"
        self.session = f"t{uuid.uuid4().hex[:8]}"
        conf = self.dir / "tmux.conf"
        conf.write_text("set -g history-limit 100000\nset -g status off\n")
        bindir = str(Path(sys.executable).parent)  # this checkout's `fab`
        base = {
            k: v
            for k, v in os.environ.items()
            if k not in ("COLUMNS", "LINES", "TMUX", "FLEETOPS_NO_LIVE")
        }
        self.env = {
            **base,
            "PATH": f"{bindir}:{base.get('PATH', '')}",
            "PYTHONPATH": str(REPO),
            "TERM": "screen",
            "PS1": "$ ",
            **(env or {}),
        }

    def _tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["tmux", "-S", str(self.socket), "-f", str(self.dir / "tmux.conf"), *args],
            capture_output=True,
            text=True,
            check=check,
            env=self.env,
        )

    def __enter__(self) -> Terminal:
        self._tmux(
            "new-session",
            "-d",
            "-s",
            self.session,
            "-x",
            str(self.width),
            "-y",
            str(self.height),
            "-c",
            str(self.cwd),
            "bash --norc --noprofile",
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self._tmux("kill-server", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def screen(self) -> str:
        """Everything the terminal shows and holds above (its history), wrapped lines joined."""
        return self._tmux("capture-pane", "-p", "-J", "-S", "-", "-t", self.session).stdout

    def visible(self) -> str:
        """What is on the screen now, line by line as drawn (not joined)."""
        return self._tmux("capture-pane", "-p", "-t", self.session).stdout

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", self.session, *keys)

    def type(self, text: str) -> None:
        self._tmux("send-keys", "-t", self.session, "-l", text)

    def clear(self) -> None:
        self.type("clear")
        self.keys("Enter")
        time.sleep(0.3)
        self._tmux("clear-history", "-t", self.session)

    def run(self, command: str, timeout: float = 300) -> tuple[int, str]:
        """Type `command` as an operator pastes it, then Enter; wait for it to end. (exit status,
        what the terminal shows from the command line on)."""
        self.clear()
        # the command as printed; the shell then says its status
        self.type(f"{command}; echo {RC_MARK}$?")
        self.keys("Enter")
        return self.wait_rc(timeout)

    def wait_rc(self, timeout: float = 300) -> tuple[int, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.screen().splitlines()
            for n, line in enumerate(lines):
                if line.startswith(RC_MARK):
                    start = next(
                        (i + 1 for i, x in enumerate(lines) if x.endswith(f"; echo {RC_MARK}$?")), 0
                    )
                    return int(line[len(RC_MARK) :]), "\n".join(lines[start:n]) + "\n"
            time.sleep(0.2)
        raise AssertionError(
            f"the command did not end within {timeout:.0f}s; the terminal shows:\n{self.screen()}"
        )
