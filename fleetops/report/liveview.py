"""The live view's frame, on a terminal only: a row per host (current task, state, elapsed, tasks
done), or at scale the count of hosts in each state, the slowest running ones and who failed;
`tail`'s bars under it. The Reporter holds the rows and starts and stops the view; this module draws
a frame from them."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from ..plans.hostrange import fold as fold_names
from ..results import Status
from .lines import STYLE
from .richload import escape, rich, text

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live

    from .tailview import TailView

# more hosts than this: the live view shows counts and the slowest hosts, not a row each
LIVE_TABLE_MAX = 10
SLOWEST = 5
LIVE_MARGIN = 3  # columns the live view leaves free at the right


class _Fresh:
    """Built at each draw, not at each refresh: rich redraws its last refreshed renderable under
    every printed line, so a snapshot taken before the host's task started would show it `queued`
    after its first log line. Drawn LIVE_MARGIN columns narrower than the terminal: rich erases the
    view by counting its lines, and a line as wide as the terminal becomes two when the terminal
    echoes something after it (`^C`), which left the view's top behind, glued to the next output."""

    def __init__(self, build: Any) -> None:
        self.build = build

    def __rich_console__(self, console: Console, options: Any) -> Any:
        yield from console.render(
            self.build(), options.update_width(max(20, options.max_width - LIVE_MARGIN))
        )


def new_live(build: Any, console: Console) -> Live:
    """rich's Live (not started) drawing build()'s frame; rich.live is imported only when a view is
    shown. It redraws under each printed line, and 4 times a second when the Reporter's Ticker says
    so (never on a thread of its own)."""
    from rich.live import Live

    return Live(_Fresh(build), console=console, auto_refresh=False, transient=True)


class Ticker:
    """Redraws the live view 4 times a second, holding the lock every print holds. rich's own
    refresh thread does not: a print computes how far up to erase, then draws; a refresh landing
    between the two (a starved CPU makes that window wide) left the top of a frame on the screen, or
    erased a printed line above it."""

    def __init__(self, live: Live, lock: Any, per_second: float = 4) -> None:
        self.live, self.lock, self.period = live, lock, 1 / per_second
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fleetops-live", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(self.period):
            with self.lock:
                if not self.done.is_set():
                    self.live.refresh()

    def stop(self) -> None:
        """No redraw after this returns (call it without the lock: the ticker may be waiting for
        it)."""
        self.done.set()
        if self.thread is not threading.current_thread():
            self.thread.join()


def frame(rows: dict[str, dict], started: float | None, tail: TailView) -> RenderableType:
    bars = tail.renderable()
    hosts = state_counts(rows, started) if len(rows) > LIVE_TABLE_MAX else host_table(rows)
    return rich().Group(hosts, bars) if bars is not None else hosts


def host_table(rows: dict[str, dict]) -> RenderableType:
    table = rich().Table(title="fleet", title_justify="left", show_edge=False)
    for column in ("host", "current task", "state", "elapsed", "tasks done"):
        # narrow: a job id folds onto the next line, never cut
        table.add_column(column, overflow="fold")
    now = time.monotonic()
    for host, row in rows.items():
        elapsed = f"{now - row['started']:.1f}s" if row["started"] else "-"
        style = {"running": "cyan", "failed": "bold red", "unreachable": "bold magenta"}.get(
            row["state"], ""
        )
        table.add_row(
            escape(host),
            escape(row["task"]),
            f"[{style}]{row['state']}[/]" if style else row["state"],
            elapsed,
            str(row["done"]),
        )
    return table


def state_counts(rows_by_host: dict[str, dict], started: float | None) -> RenderableType:
    """The live view at scale: how many hosts are in each state, the slowest running ones, who
    failed."""
    now = time.monotonic()
    rows = list(rows_by_host.items())
    counts: dict[str, int] = {}
    for _, row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    order = ["queued", "running", *(s.value for s in Status)]
    styles = {"running": "cyan", **{s.value: STYLE[s] for s in Status}}
    since = f"  [dim]{now - started:.1f} s[/]" if started is not None else ""
    parts = [
        f"[{styles.get(state, '')}]{counts[state]} {state}[/]"
        if styles.get(state)
        else f"{counts[state]} {state}"
        for state in order
        if counts.get(state)
    ]
    lines = [text(f"[bold]fleet:[/] {len(rows)} hosts  " + "  ".join(parts) + since)]
    slowest = _slowest(rows, now)
    if slowest:
        lines.append(text(f"[dim]slowest:[/] {slowest}"))
    bad = [host for host, row in rows if row["state"] in ("failed", "unreachable")]
    if bad:
        lines.append(text(f"[bold red]failed so far:[/] {escape(fold_names(bad))}"))
    return rich().Group(*lines)


def _slowest(rows: list[tuple[str, dict]], now: float) -> str:
    """The SLOWEST hosts still running a task, the longest first, with the task and its age."""
    running = sorted(
        (
            (now - row["task_since"], host, row["task"])
            for host, row in rows
            if row["state"] == "running" and row.get("task_since")
        ),
        reverse=True,
    )[:SLOWEST]
    return ", ".join(f"{escape(host)} {escape(task)} {age:.1f}s" for age, host, task in running)
