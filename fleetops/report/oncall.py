"""What the on-call tasks draw. `fetch`: one rich progress bar per large file on a terminal, shared
by every host of the run (hosts download in parallel), drawn under the fleet's live view (rich nests
them); plain lines at 25/50/75% when the output is piped; nothing with --json. `ssh-config`: the
inventory as OpenSSH config."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..plans.inventory import UnknownHost, find_inventory, load_inventory
from ..plans.sshconfig_out import render
from ..plans.yamlsrc import ConfigError
from ..redaction import shown
from .console import Reporter
from .richload import escape

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

BAR_MIN_BYTES = 8 * 1024 * 1024  # smaller files come and go too fast for a bar
PLAIN_STEPS = 4  # plain output: a line at 25%, 50%, 75%


class TransferBoard:
    """One per console. `start` returns a callback taking the bytes done so far; `finish` ends that
    file."""

    def __init__(self, console: Console, quiet: bool) -> None:
        self.console = console
        self.quiet = quiet
        self.lock = threading.Lock()
        self.progress: Progress | None = None
        self.active = 0

    def start(self, label: str, total: int, already: int) -> Transfer:
        # a node's file name: drawn by rich's progress bar, not through escape()
        label = shown(label)
        bar = not self.quiet and self.console.is_terminal and total - already >= BAR_MIN_BYTES
        task = None
        if bar:
            with self.lock:
                if self.progress is None:
                    # rich.progress (with rich.live and the spinners) only when a bar is drawn, not
                    # whenever `fetch` runs (client start-up)
                    from rich.progress import (
                        BarColumn,
                        DownloadColumn,
                        Progress,
                        TextColumn,
                        TimeRemainingColumn,
                        TransferSpeedColumn,
                    )

                    # markup=False: the label is a host and a remote path, shown as it is (no
                    # markup, no emoji)
                    self.progress = Progress(
                        TextColumn("{task.description}", markup=False),
                        BarColumn(),
                        DownloadColumn(),
                        TransferSpeedColumn(),
                        TimeRemainingColumn(),
                        console=self.console,
                        transient=True,
                    )
                    self.progress.start()
                self.active += 1
                task = self.progress.add_task(label, total=total, completed=already)
        return Transfer(self, label, total, already, task)

    def _done(self, transfer: Transfer) -> None:
        with self.lock:
            if transfer.task is not None and self.progress is not None:
                self.progress.remove_task(transfer.task)
                self.active -= 1
                if not self.active:
                    self.progress.stop()
                    self.progress = None


class Transfer:
    def __init__(
        self, board: TransferBoard, label: str, total: int, already: int, task: TaskID | None
    ) -> None:
        self.board, self.label, self.total, self.already, self.task = (
            board,
            label,
            total,
            already,
            task,
        )
        self.next_step = already * PLAIN_STEPS // total + 1 if total else PLAIN_STEPS
        self.started = time.monotonic()

    def __call__(self, written: int) -> None:
        done = self.already + written
        board = self.board
        if self.task is not None and board.progress is not None:
            board.progress.update(self.task, completed=done)  # type: ignore[arg-type]
            return
        if board.quiet or self.total < BAR_MIN_BYTES:
            return
        while self.next_step < PLAIN_STEPS and done * PLAIN_STEPS >= self.total * self.next_step:
            with board.lock:
                board.console.print(
                    escape(
                        f"{self.label}: {100 * self.next_step // PLAIN_STEPS}% ({done} of "
                        f"{self.total} bytes)"
                    )
                )
            self.next_step += 1

    def finish(self) -> None:
        self.board._done(self)


_BOARDS: dict[int, TransferBoard] = {}
_BOARDS_LOCK = threading.Lock()


def board_for(console: Console, quiet: bool) -> TransferBoard:
    """The run's board (one per console, so parallel hosts share one progress display)."""
    with _BOARDS_LOCK:
        board = _BOARDS.get(id(console))
        if board is None or board.console is not console:
            board = _BOARDS[id(console)] = TransferBoard(console, quiet)
        return board


def show_ssh_config(
    root: Path | str | None, inventory: str | None, default: str, hosts: str | None
) -> int:
    """Print the OpenSSH config block for the inventory (or the hosts named: names, globs, @group,
    commas). Returns the exit status: 0, or 2 with one error line for a bad inventory or host
    word."""
    project = Path(root) if root else Path.cwd()
    try:
        where = find_inventory(project, inventory or None, default)
        inv = load_inventory(where)
        chosen = inv.expand([hosts]) if hosts else None
        try:
            origin = str(where.relative_to(Path.cwd()))
        except ValueError:
            origin = str(where)
        text = render(inv, chosen, origin)
    except (ConfigError, UnknownHost) as exc:
        Reporter().error(f"ssh-config: {exc}")
        return 2
    if not inv.hosts:
        Reporter().error(f"ssh-config: no hosts in {where}; run `fab lab.up` or add hosts/*.yaml")
        return 2
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `fab ssh-config | head`: the reader is gone; nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
