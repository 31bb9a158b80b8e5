"""What `tail` shows beside the log lines: one progress bar per followed host (samples done/total,
tok/s, ETA).

On a terminal the bars live in the run's live view and are redrawn in place (rich's Live); piped,
nothing is redrawn and each progress report of the job comes out as one plain line carrying the bar
(console.py's job_line), so a log file or CI output reads top to bottom."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..plans.tables import bar
from ..plans.timefmt import clock

if TYPE_CHECKING:
    from rich.console import RenderableType


@dataclass
class HostProgress:
    job_id: str | None = None
    state: str = "attaching"
    done: float = 0.0
    total: float | None = None
    tok_s: float | None = None
    eta: float | None = None
    failures: int = 0
    last_line: str = ""
    updated: float = field(default_factory=time.monotonic)


class TailView:
    """Per-host progress of the jobs being followed, for the live view (terminal) and plain lines
    (piped)."""

    def __init__(self) -> None:
        self.hosts: dict[str, HostProgress] = {}
        self.lock = threading.Lock()

    def attach(self, host: str, job_id: str | None, state: str) -> None:
        with self.lock:
            row = self.hosts.setdefault(host, HostProgress())
            row.job_id, row.state = job_id, state

    def line(self, host: str, text: str, failure: bool, progress: dict | None) -> None:
        with self.lock:
            row = self.hosts.setdefault(host, HostProgress())
            row.last_line = text
            row.updated = time.monotonic()
            if failure:
                row.failures += 1
            if progress:
                row.done = progress.get("done", row.done)
                row.total = progress.get("total", row.total)
                row.tok_s = progress.get("tok_s", row.tok_s)
                row.eta = progress.get("eta", row.eta)

    def end(self, host: str, state: str) -> None:
        with self.lock:
            row = self.hosts.setdefault(host, HostProgress())
            row.state = state
            if state == "succeeded":
                row.eta = 0.0

    def plain(self, host: str) -> str:
        """The host's progress as one line of text (what a pipe gets)."""
        row = self.hosts.get(host)
        if row is None or row.total is None:
            return ""
        return bar(
            {
                "done": row.done,
                "total": row.total,
                **({"tok_s": row.tok_s} if row.tok_s is not None else {}),
                **({"eta": row.eta} if row.eta is not None else {}),
            }
        )

    def renderable(self) -> RenderableType | None:
        """A table of one progress bar per host (for the live view), or None when no host reports
        progress."""
        with self.lock:
            rows = list(self.hosts.items())
        if not rows:
            return None
        # the live view only: a run without a terminal never loads rich for it
        from rich.markup import escape
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        # No job id here: the fleet table beside it says `tail <id>` whole, and this one must fit 80
        # columns.
        table = Table(title="jobs", title_justify="left", show_edge=False)
        for column in ("host", "state", "progress", "samples", "tok/s", "ETA", "failures"):
            table.add_column(column)
        for host, row in rows:
            style = {
                "running": "cyan",
                "succeeded": "green",
                "failed": "bold red",
                "killed": "bold red",
                "lost": "bold magenta",
            }.get(row.state, "")
            progress: RenderableType = (
                ProgressBar(total=row.total or 100.0, completed=row.done, width=20)
                if row.total
                else "-"
            )
            table.add_row(
                escape(host),
                f"[{style}]{escape(row.state)}[/]" if style else escape(row.state),
                progress,
                f"{int(row.done)}/{int(row.total)}" if row.total else "-",
                f"{row.tok_s:.0f}" if row.tok_s is not None else "-",
                clock(row.eta),
                f"[bold red]{row.failures}[/]" if row.failures else "0",
            )
        return table
