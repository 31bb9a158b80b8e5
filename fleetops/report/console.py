"""Turn results into what the operator reads: per-host lines as they happen, a recap, or one JSON
document.

The Reporter is what the run holds: it takes each event (a task started, a job's line, a result) and
prints it or updates the live view. Its parts, one job each: richload (rich loaded at the first
draw; escape, markup), lines (a result as styled lines), fittable (render_table), liveview (the live
view's frame), closing (the recap, the summary, the JSON document).

Everything a node or a job said reaches the terminal through redaction.shown() (secrets masked,
terminal controls made visible) before any layout: draw() cleans a result's lines and table, so
folding, `--odd` and rich's cell cutting only ever see masked, inert text; escape() (every string
put into rich markup) cleans again, which costs nothing on clean text. `--json` writes the raw text,
which JSON escapes."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from ..plans.tables import bar
from ..redaction import shown
from ..results import Result
from ..results.events import Event, JobAttached, JobEnded, JobLine, Waiting
from . import closing, liveview
from .events import event_text
from .fittable import render_table
from .fold import Identity, Line
from .lines import EVIDENCE_SHOWN, SEP, STYLE, VERDICT_STYLE, next_lines
from .lines import draw as draw_lines
from .liveview import LIVE_MARGIN, LIVE_TABLE_MAX, SLOWEST
from .richload import RICH_LOCK, escape, markup, print_line, rich, stream_console
from .tailview import TailView

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

__all__ = [
    "EVIDENCE_SHOWN",
    "LIVE_MARGIN",
    "LIVE_TABLE_MAX",
    "SEP",
    "SLOWEST",
    "STYLE",
    "VERDICT_STYLE",
    "Reporter",
    "escape",
    "markup",
    "next_lines",
    "render_table",
    "rich",
]


class Reporter:
    def __init__(
        self, json_mode: bool = False, verbose: bool = False, console: Console | None = None
    ) -> None:
        self.json_mode = json_mode
        self.verbose = verbose
        self._console = console
        # Every print and every redraw of the live view holds it (liveview.Ticker says why);
        # reentrant: an error said while a result is printed
        self.lock = threading.RLock()
        # hosts that answered the same printed once, at the end (run.execute decides)
        self.fold = False
        self.odd = False  # --odd: each minority group as a diff against the majority
        self.who: dict[str, Identity] = {}  # each host's own name and address, for folding
        self.started: float | None = None
        self.tail = TailView()  # `tail`'s per-host progress bars (in the live view on a terminal)
        self.rows: dict[str, dict] = {}  # the live view's rows, one per host (live_start)
        self.live: Any = None  # rich's Live while the live view is on screen
        self._ticker: liveview.Ticker | None = None  # redraws it
        self._live_wanted = False  # live_start asked for it and it has not started yet
        self._interrupt_said = False
        # the fab/fleet program's run; a library caller's (api.py) keeps its own handler
        self.owns_ctrl_c = True
        # host -> what it waits for, as last printed (a pipe: once per change)
        self._waiting: dict[str, str] = {}

    @property
    def console(self) -> Console:
        if self._console is None:
            with RICH_LOCK:
                if self._console is None:
                    self._console = stream_console(sys.stdout)
        return self._console

    def prepare(self) -> None:
        """Load what drawing needs (rich, the console) now, and start the live view live_start asked
        for: the main thread calls this while the first connections are in their handshakes
        (rollout.py)."""
        if not self.json_mode:
            with self.lock:
                # - loads rich now, live view or not (a piped run prints results too)
                self.console  # noqa: B018
                self._start_live()

    # -- the live view: one row per host (current task, state, elapsed), only on a terminal
    def live_start(self, hosts: list[str]) -> None:
        self.rows = {h: {"task": "-", "state": "queued", "started": None, "done": 0} for h in hosts}
        self.live = None
        self.started = time.monotonic()
        self._live_wanted = not (self.json_mode or os.environ.get("FLEETOPS_NO_LIVE"))
        if self._console is not None:  # else prepare() starts it, once rich is loaded
            self._start_live()

    def _start_live(self) -> None:
        if not self._live_wanted or self.live is not None or not self.console.is_terminal:
            return
        self._live_wanted = False
        with self.lock:
            self.live = liveview.new_live(self._live_table, self.console)
            self.live.start()
            self._ticker = liveview.Ticker(self.live, self.lock)

    def _live_table(self) -> RenderableType:
        return liveview.frame(self.rows, self.started, self.tail)

    def _live_counts(self) -> RenderableType:
        """The live view at scale: how many hosts are in each state, the slowest running ones, who
        failed."""
        return liveview.state_counts(self.rows, self.started)

    def task_started(self, host: str, task: str) -> None:
        row = self.rows.get(host)
        if row is not None:
            now = time.monotonic()
            row.update(task=task, started=row["started"] or now, task_since=now)
            if row["state"] not in ("failed", "unreachable"):
                row["state"] = "running"

    def live_stop(self) -> None:
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.stop()
        with self.lock:
            live = self.live
            if live is not None:
                live.stop()
                self.live = None

    def interrupted(self) -> None:
        """The first Ctrl-C, said once, by the main thread through the console: the live view stays
        whole (a write straight to the terminal left it behind, glued to the message)."""
        with self.lock:
            if self._interrupt_said:
                return
            self._interrupt_said = True
            if not self.owns_ctrl_c and self.json_mode:
                # a quiet library run prints nothing: its results say which steps were interrupted
                return
            again = " (Ctrl-C again to exit now)" if self.owns_ctrl_c else ""
            stream_console(sys.stderr).print(
                f"[bold]Ctrl-C:[/] starting nothing new, interrupting running steps{again}"
            )

    def error(self, message: str) -> None:
        # One line when piped (operators grep for it and paste it into tickets); on a terminal
        # wrapped between words, so a fingerprint or a path is never cut in two by the terminal.
        with self.lock:
            print_line(
                stream_console(sys.stderr), [("error:", "bold red"), (" ", ""), (message, "")], ""
            )

    def note(self, message: str) -> None:
        if not self.json_mode:
            with self.lock:
                print_line(self.console, [(message, "")], "")

    def emit(self, event: Event) -> None:
        """A task's progress (results/events.py): a note-kind event prints its line (event_text);
        the others draw a job's row, bar or log line, or a wait."""
        match event:
            case JobLine(label, line, failure, progress):
                self.job_line(label, line, failure, progress)
            case JobAttached(label, job_id, state):
                self.job_attached(label, job_id, state)
            case JobEnded(label, state):
                self.job_ended(label, state)
            case Waiting(host, task, what, left_s):
                self.waiting(host, task, what, left_s)
            case _:
                text = event_text(event)
                if text is not None:
                    self.note(text)

    def job_started(self, host: str, task: str, job_id: str, where: str) -> None:
        """A job was launched: folded output holds every result back until the end, so its id (what
        tail, status and stop name) is printed now; unfolded, the result's own line, printed now,
        says it."""
        if self.fold and not self.json_mode:
            with self.lock:
                print_line(
                    self.console,
                    [
                        (host, "bold"),
                        (" ", ""),
                        ("|", "dim"),
                        (f" {task} ", ""),
                        ("|", "dim"),
                        (f" started job {job_id}; {where}", ""),
                    ],
                    "",
                )

    def job_attached(self, host: str, job_id: str, state: str) -> None:
        """`tail` is streaming the host's job: its live row says so (never `queued`) and its bar
        appears."""
        self.tail.attach(host, shown(job_id), shown(state))
        row = self.rows.get(host)
        if row is not None and row["state"] not in ("failed", "unreachable"):
            row.update(
                state="running", task=f"tail {job_id}", started=row["started"] or time.monotonic()
            )

    def waiting(self, host: str, task: str, what: str, left_s: float) -> None:
        """A host polling until something changes (`gpu --wait`): on a terminal its one live row
        says what it waits for and how long is left; piped, a line when that changes, not one a
        poll."""
        row = self.rows.get(host)
        if self.live is not None and row is not None:
            row["task"] = f"{task} waiting {left_s:.0f}s more: {shown(what)}"
            return
        if self.json_mode or self._waiting.get(host) == what:
            return
        first = host not in self._waiting
        self._waiting[host] = what
        self.note(
            f"{host} | {task} | waiting{f' up to {left_s:.0f}s' if first else ''}: {what}"
            + ("" if first else f" ({left_s:.0f}s left)")
        )

    def job_ended(self, host: str, state: str) -> None:
        self.tail.end(host, shown(state))

    def job_line(self, host: str, line: str, failure: bool, progress: dict | None) -> None:
        """One line of a job's log, prefixed with its host; failures stand out the moment they
        appear. Progress goes to the host's bar: redrawn in place in the live view on a terminal,
        else one plain line carrying the bar for each progress report."""
        self.tail.line(host, line, failure, progress)
        if self.json_mode:
            return
        with self.lock:
            if failure:
                print_line(self.console, [(host, "bold"), (" ", ""), (f"| {line}", "bold red")], "")
            elif progress and "total" in progress and self.live is not None:
                return  # the host's bar in the live view shows it, redrawn in place
            elif progress and "total" in progress:
                self.console.print(
                    f"[bold]{escape(host)}[/] [dim]|[/] [cyan]{escape(bar(progress))}[/] "
                    f"[dim]{escape(line)}[/]"
                )
            else:
                print_line(
                    self.console, [(host, "bold"), (" ", ""), ("|", "dim"), (f" {line}", "")], ""
                )

    def result(self, r: Result) -> None:
        row = self.rows.get(r.host)
        if row is not None:
            # a later skipped step keeps the failure shown
            worst = row["state"] in ("failed", "unreachable")
            row.update(state=row["state"] if worst else r.status.value, done=row["done"] + 1)
            if row["task"].startswith(f"{r.task} waiting "):
                row["task"] = r.task  # the wait is over: its countdown stays on no failed row
        # folded output is drawn once every host has answered (finish)
        if self.json_mode or self.fold:
            return
        lines, table = self.draw(r)
        with self.lock:
            if table:
                self.console.print(render_table(table))
            for line in lines:
                print_line(self.console, line, r.host)

    def draw(self, r: Result) -> tuple[list[Line], dict | None]:
        """A result as lines of (text, style) segments, the host's name left as the LABEL slot; and
        the table it prints first, if any. Both cleaned (redaction.shown): what folding and layout
        get is what may show."""
        return draw_lines(r, self.verbose)

    def finish(
        self,
        results: list[Result],
        code: int,
        extra: dict[str, Any] | None = None,
        sections: list[dict] | None = None,
        rerun: str | None = None,
        rerun_label: str | None = None,
    ) -> None:
        """The closing part: folded groups (when folding), odd ones out (--odd), the fleet tables,
        the recap, the failed hosts, the one-line summary and, when something failed, the command
        that re-runs just those hosts (`rerun`, made by run.py)."""
        if self.json_mode:
            closing.write_json(results, code, extra)
            return
        with self.lock:
            closing.print_closing(
                self.console,
                results,
                code,
                folded=self.fold,
                odd=self.odd,
                draw=self.draw,
                who=self.who,
                sections=sections,
                started=self.started,
                rerun=rerun,
                rerun_label=rerun_label,
            )
