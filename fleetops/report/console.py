"""Turn results into what the operator reads: per-host lines as they happen, a recap, or one JSON document.

Everything a node or a job said reaches the terminal through redaction.shown() (secrets masked, terminal
controls made visible) before any layout: draw() cleans a result's lines and table, so folding, `--odd` and
rich's cell cutting only ever see masked, inert text; escape() (every string put into rich markup) cleans
again, which costs nothing on clean text. `--json` writes the raw text, which JSON escapes."""

from __future__ import annotations

import os
import sys
import threading
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ..plans.hostrange import fold as fold_names
from ..plans.hostrange import natural_key
from ..plans.tables import bar
from ..redaction import RedactingStream, dumps, shown
from ..results import Result, Status, reader_gone, recap
from . import fold
from .fold import COMMAND, LABEL, Group, Identity, Line, Segment
from .tailview import TailView

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table
    from rich.text import Text

STYLE = {Status.OK: "green", Status.CHANGED: "yellow", Status.FAILED: "bold red",
         Status.UNREACHABLE: "bold magenta", Status.SKIPPED: "cyan"}
VERDICT_STYLE = {"CRITICAL": "bold red", "UNKNOWN": "bold magenta", "WARN": "yellow", "OK": "green"}  # diagnose
SEP: list[Segment] = [(" ", ""), ("|", "dim"), (" ", "")]
LIVE_TABLE_MAX = 10  # more hosts than this: the live view shows counts and the slowest hosts, not a row each
SLOWEST = 5
_RICH: SimpleNamespace | None = None
_RICH_LOCK = threading.RLock()  # the console property holds it while rich() loads


def rich() -> SimpleNamespace:
    """The parts of rich the report draws with, imported at the first draw, not with the module:
    importing rich is ~30 ms of a run's start-up, and a run imports this module before it connects anywhere;
    run.execute has the main thread load it while the first connections are in their handshakes."""
    global _RICH
    if _RICH is None:
        with _RICH_LOCK:
            if _RICH is None:
                from rich.console import Console, Group
                from rich.markup import escape
                from rich.table import Table
                from rich.text import Text

                class PipedConsole(Console):
                    def on_broken_pipe(self) -> None:
                        # rich's hook for a closed pipe (`| head`); its own exits 1, a failed run's status
                        self.quiet = True
                        raise SystemExit(reader_gone(self.file))

                _RICH = SimpleNamespace(Console=PipedConsole, Group=Group, escape=escape, Table=Table, Text=Text)
    return _RICH


def escape(text: str) -> str:
    """Data → rich markup that prints it as written: secrets masked, controls visible, markup escaped."""
    return rich().escape(shown(text))


def markup(line: Line, label: str) -> str:
    """Segments → rich markup, the label slot filled in (a command segment drawn bold)."""
    return "".join(f"[{'bold' if style == COMMAND else style}]{escape(label if text == LABEL else text)}[/]"
                   if style else escape(label if text == LABEL else text) for text, style in line)


LIVE_MARGIN = 3  # columns the live view leaves free at the right


class _Fresh:
    """Built at each draw, not at each refresh: rich redraws its last refreshed renderable under every printed
    line, so a snapshot taken before the host's task started would show it `queued` after its first log line.
    Drawn LIVE_MARGIN columns narrower than the terminal: rich erases the view by counting its lines, and a line
    as wide as the terminal becomes two when the terminal echoes something after it (`^C`), which left the
    view's top behind, glued to the next output."""

    def __init__(self, build: Any) -> None:
        self.build = build

    def __rich_console__(self, console: Console, options: Any) -> Any:
        yield from console.render(self.build(), options.update_width(max(20, options.max_width - LIVE_MARGIN)))


class Reporter:
    def __init__(self, json_mode: bool = False, verbose: bool = False, console: Console | None = None) -> None:
        self.json_mode = json_mode
        self.verbose = verbose
        self._console = console
        self.lock = threading.Lock()
        self.fold = False  # hosts that answered the same printed once, at the end (run.execute decides)
        self.odd = False  # --odd: each minority group as a diff against the majority
        self.who: dict[str, Identity] = {}  # each host's own name and address, for folding
        self.started: float | None = None
        self.tail = TailView()  # `tail`'s per-host progress bars (in the live view on a terminal)
        self.rows: dict[str, dict] = {}  # the live view's rows, one per host (live_start)
        self.live: Any = None  # rich's Live while the live view is on screen
        self._live_wanted = False  # live_start asked for it and it has not started yet
        self._interrupt_said = False
        self._waiting: dict[str, str] = {}  # host -> what it waits for, as last printed (a pipe: once per change)

    @property
    def console(self) -> Console:
        if self._console is None:
            with _RICH_LOCK:
                if self._console is None:
                    self._console = _console(sys.stdout)
        return self._console

    def prepare(self) -> None:
        """Load what drawing needs (rich, the console) now, and start the live view live_start asked for: the
        main thread calls this while the first connections are in their handshakes (rollout.py)."""
        if not self.json_mode:
            with self.lock:
                self.console  # noqa: B018 - loads rich now, live view or not (a piped run prints results too)
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
        from rich.live import Live

        self.live = Live(_Fresh(self._live_table), console=self.console, refresh_per_second=4, transient=True)
        self.live.start()

    def _live_table(self) -> RenderableType:
        bars = self.tail.renderable()
        hosts = self._live_counts() if len(self.rows) > LIVE_TABLE_MAX else self._live_hosts()
        return rich().Group(hosts, bars) if bars is not None else hosts

    def _live_hosts(self) -> RenderableType:
        table = rich().Table(title="fleet", title_justify="left", show_edge=False)
        for column in ("host", "current task", "state", "elapsed", "tasks done"):
            table.add_column(column, overflow="fold")  # narrow: a job id folds onto the next line, never cut
        now = time.monotonic()
        for host, row in self.rows.items():
            elapsed = f"{now - row['started']:.1f}s" if row["started"] else "-"
            style = {"running": "cyan", "failed": "bold red", "unreachable": "bold magenta"}.get(row["state"], "")
            table.add_row(escape(host), escape(row["task"]),
                          f"[{style}]{row['state']}[/]" if style else row["state"], elapsed, str(row["done"]))
        return table

    def _live_counts(self) -> RenderableType:
        """The live view at scale: how many hosts are in each state, the slowest running ones, who failed."""
        now = time.monotonic()
        rows = list(self.rows.items())
        counts: dict[str, int] = {}
        for _, row in rows:
            counts[row["state"]] = counts.get(row["state"], 0) + 1
        order = ["queued", "running", *(s.value for s in Status)]
        styles = {"running": "cyan", **{s.value: STYLE[s] for s in Status}}
        since = f"  [dim]{now - self.started:.1f} s[/]" if self.started is not None else ""
        parts = [f"[{styles.get(state, '')}]{counts[state]} {state}[/]" if styles.get(state) else
                 f"{counts[state]} {state}" for state in order if counts.get(state)]
        lines = [_text(f"[bold]fleet:[/] {len(rows)} hosts  " + "  ".join(parts) + since)]
        running = sorted(((now - row["task_since"], host, row["task"]) for host, row in rows
                          if row["state"] == "running" and row.get("task_since")), reverse=True)[:SLOWEST]
        if running:
            lines.append(_text("[dim]slowest:[/] " + ", ".join(
                f"{escape(host)} {escape(task)} {age:.1f}s" for age, host, task in running)))
        bad = [host for host, row in rows if row["state"] in ("failed", "unreachable")]
        if bad:
            lines.append(_text(f"[bold red]failed so far:[/] {escape(fold_names(bad))}"))
        return rich().Group(*lines)

    def task_started(self, host: str, task: str) -> None:
        row = self.rows.get(host)
        if row is not None:
            now = time.monotonic()
            row.update(task=task, started=row["started"] or now, task_since=now)
            if row["state"] not in ("failed", "unreachable"):
                row["state"] = "running"

    def live_stop(self) -> None:
        live = self.live
        if live is not None:
            live.stop()
            self.live = None

    def interrupted(self) -> None:
        """The first Ctrl-C, said once, by the main thread through the console: the live view stays whole
        (a write straight to the terminal left it behind, glued to the message)."""
        with self.lock:
            if self._interrupt_said:
                return
            self._interrupt_said = True
        _console(sys.stderr).print("[bold]Ctrl-C:[/] starting nothing new, interrupting running steps "
                                   "(Ctrl-C again to exit now)")

    def error(self, message: str) -> None:
        # One line whatever the terminal's width: operators grep for it and paste it into tickets.
        _console(sys.stderr).print(f"[bold red]error:[/] {escape(message)}")

    def note(self, message: str) -> None:
        if not self.json_mode:
            with self.lock:
                self.console.print(escape(message))

    def job_started(self, host: str, task: str, job_id: str, where: str) -> None:
        """A job was launched: folded output holds every result back until the end, so its id (what tail, status
        and stop name) is printed now; unfolded, the result's own line, printed now, says it."""
        if self.fold and not self.json_mode:
            with self.lock:
                self.console.print(f"[bold]{escape(host)}[/] [dim]|[/] {escape(task)} [dim]|[/] started job "
                                   f"{escape(job_id)}; {escape(where)}")

    def job_attached(self, host: str, job_id: str, state: str) -> None:
        """`tail` is streaming the host's job: its live row says so (never `queued`) and its bar appears."""
        self.tail.attach(host, shown(job_id), shown(state))
        row = self.rows.get(host)
        if row is not None and row["state"] not in ("failed", "unreachable"):
            row.update(state="running", task=f"tail {job_id}", started=row["started"] or time.monotonic())

    def waiting(self, host: str, task: str, what: str, left_s: float) -> None:
        """A host polling until something changes (`gpu --wait`): on a terminal its one live row says what it
        waits for and how long is left; piped, a line when that changes, not one a poll."""
        row = self.rows.get(host)
        if self.live is not None and row is not None:
            row["task"] = f"{task} waiting {left_s:.0f}s more: {shown(what)}"
            return
        if self.json_mode or self._waiting.get(host) == what:
            return
        first = host not in self._waiting
        self._waiting[host] = what
        self.note(f"{host} | {task} | waiting{f' up to {left_s:.0f}s' if first else ''}: {what}"
                  + ("" if first else f" ({left_s:.0f}s left)"))

    def job_ended(self, host: str, state: str) -> None:
        self.tail.end(host, shown(state))

    def job_line(self, host: str, line: str, failure: bool, progress: dict | None) -> None:
        """One line of a job's log, prefixed with its host; failures stand out the moment they appear. Progress
        goes to the host's bar: redrawn in place in the live view on a terminal, else one plain line carrying
        the bar for each progress report."""
        self.tail.line(host, line, failure, progress)
        if self.json_mode:
            return
        with self.lock:
            if failure:
                self.console.print(f"[bold]{escape(host)}[/] [bold red]| {escape(line)}[/]")
            elif progress and "total" in progress and self.live is not None:
                return  # the host's bar in the live view shows it, redrawn in place
            elif progress and "total" in progress:
                self.console.print(f"[bold]{escape(host)}[/] [dim]|[/] [cyan]{escape(bar(progress))}[/] "
                                   f"[dim]{escape(line)}[/]")
            else:
                self.console.print(f"[bold]{escape(host)}[/] [dim]|[/] {escape(line)}")

    def result(self, r: Result) -> None:
        row = self.rows.get(r.host)
        if row is not None:
            worst = row["state"] in ("failed", "unreachable")  # a later skipped step keeps the failure shown
            row.update(state=row["state"] if worst else r.status.value, done=row["done"] + 1)
        if self.json_mode or self.fold:  # folded output is drawn once every host has answered (finish)
            return
        lines, table = self.draw(r)
        with self.lock:
            if table:
                self.console.print(render_table(table))
            for line in lines:
                self.console.print(markup(line, r.host))

    def draw(self, r: Result) -> tuple[list[Line], dict | None]:
        """A result as lines of (text, style) segments, the host's name left as the LABEL slot; and the table
        it prints first, if any. Both cleaned (redaction.shown): what folding and layout get is what may show."""
        lines, table = self._draw(r)
        if table:
            title = table.get("title")
            table = {**table, "title": shown(str(title)) if title else title,
                     "rows": [[shown(str(v)) for v in row] for row in table["rows"]]}
        return [[(text if text == LABEL else shown(text), style) for text, style in line] for line in lines], table

    def _draw(self, r: Result) -> tuple[list[Line], dict | None]:
        """Short unless verbose: a result's ok items are counted, not listed (a host whose checks all pass is
        its one line), and the call's own evidence is shown when the call is what failed. What failed, with its
        evidence, and what to run next are always there."""
        host: Segment = (LABEL, "bold")
        lines: list[Line] = [[host, *SEP, (r.task, ""), *SEP, (r.status.value, STYLE[r.status]), *SEP, (r.msg, "")]]
        if r.data.get("output"):  # an ad-hoc command's output, each line prefixed with its host
            for stream, mark in (("stdout", ("|", "dim")), ("stderr", ("!", "red"))):
                lines.extend([host, (" ", ""), mark, (" ", ""), (x, "")]
                             for x in str(r.data.get(stream) or "").splitlines())
        table = r.data.get("table")
        scopes_shown: set[str] = set()
        hidden = 0
        for item in r.items:
            if table and item.status is Status.OK:
                continue  # the table shows it
            if item.status is Status.OK and not self.verbose:
                hidden += 1
                continue
            verdict = item.details.get("verdict")  # a diagnose finding says its verdict word
            word = f"{verdict:<8}" if verdict else f"{item.status.value:<7}"
            lines.append([("    ", ""), (word, VERDICT_STYLE.get(verdict, STYLE[item.status])),
                          (f" {item.label}: {item.msg}", "")])
            details = item.details
            if details.get("proves") in scopes_shown:  # say once per kind what such a check proves
                details = {k: v for k, v in details.items() if k not in ("proves", "cannot")}
            scopes_shown.add(item.details.get("proves", ""))
            lines.extend([("            ", ""), (x, "dim")] for x in _item_detail_lines(details, self.verbose))
            if item.details.get("next") and (item.status is not Status.OK or self.verbose):
                lines.extend(next_lines(item.details["next"], "            "))
        if hidden and r.status is not Status.OK:  # an ok result's own line says it all
            done = "passed" if r.task == "verify" else "ok"
            lines.append([("    ", ""), (f"{hidden} {done}, not shown: -v shows them", "dim")])
        ev = r.evidence
        if r.failed and ev is not None and (self.verbose or ev.exit_code not in (0, None) or ev.stderr_tail
                                            or not any(i.status is Status.FAILED for i in r.items)):
            lines.append([("    ", ""), ("command:", "dim"), (f" {ev.command}  ", ""), ("exit:", "dim"),
                          (f" {ev.exit_code}  ", ""), ("took:", "dim"), (f" {ev.seconds}s", "")])
            if ev.stderr_tail:
                lines.append([("    ", ""), ("stderr (last lines):", "dim")])
                lines.extend([(f"      {x}", "")] for x in ev.stderr_tail)
        lines.extend(_node_notes(r))
        if r.data.get("chosen_playbook"):  # from a playbook set, by the host's versions (tasks/registry.py)
            lines.append([("    ", ""), ("playbook:", "dim"), (f" {r.data['chosen_playbook']}", "")])
        if r.data.get("next"):  # what to do next: once per result, so once per folded group; always last
            lines.extend(next_lines(r.data["next"], "    "))
        return lines, table

    def _print_folded(self, results: list[Result]) -> list[Group]:
        groups = fold.group(fold.draw_all(results, self.draw, self.who))
        for g in groups:
            if g.drawn.table:
                table = g.drawn.table if len(g.hosts) == 1 else {**g.drawn.table, "rows": g.drawn.folded_rows,
                                                                  "title": _group_title(g)}
                self.console.print(render_table(table))
            for line in g.lines():
                self.console.print(markup(line, g.header))
        return groups

    def _print_odd_ones_out(self, groups: list[Group]) -> None:
        self.console.print()
        self.console.print("[bold]odd ones out[/] [dim](each minority group against its task's majority)[/]")
        for _task, _minority, diff in fold.odd_ones_out(groups):
            for text in diff:
                style = ("bold" if text.startswith(("---", "+++")) else "red" if text.startswith("-")
                         else "green" if text.startswith("+") else "cyan" if text.startswith("@@") else "")
                self.console.print(f"[{style}]{escape(text)}[/]" if style else escape(text))

    def finish(self, results: list[Result], code: int, extra: dict[str, Any] | None = None,
               sections: list[dict] | None = None, rerun: str | None = None, rerun_label: str | None = None) -> None:
        """The closing part: folded groups (when folding), odd ones out (--odd), the fleet tables, the recap,
        the failed hosts, the one-line summary and, when something failed, the command that re-runs just
        those hosts (`rerun`, made by run.py)."""
        if self.json_mode:
            doc = {"exit_status": code, "recap": recap(results),
                   "failed_hosts": sorted({r.host for r in results if r.failed}),
                   "results": [r.to_json() for r in results], **(extra or {})}
            sys.stdout.write(dumps(doc, indent=1, default=str) + "\n")  # secrets masked as values
            sys.stdout.flush()
            return
        table = rich().Table(title="RECAP", title_justify="left", show_edge=False, pad_edge=False)
        table.add_column("hosts" if self.fold else "host", style="bold")
        for s in Status:
            table.add_column(s.value, justify="right")
        counts = recap(results)
        rows = fold.recap_groups(counts) if self.fold else sorted(counts.items(), key=lambda kv: natural_key(kv[0]))
        for host, row in rows:
            table.add_row(escape(host), *[f"[{STYLE[s]}]{row[s.value]}[/]" if row[s.value] else "0" for s in Status])
        with self.lock:
            groups = self._print_folded(results) if self.fold else None
            if self.odd:
                self._print_odd_ones_out(groups or fold.group(fold.draw_all(results, self.draw, self.who)))
            for section in sections or []:
                self.console.print()
                self.console.print(render_table(section))
            if len(counts) > 1:  # one host: its own lines already say what a recap row would
                self.console.print()
                self.console.print(table)
            failed = sorted({r.host for r in results if r.failed}, key=natural_key)
            if failed:
                names = fold_names(failed) if self.fold else ", ".join(failed)
                self.console.print(f"[bold red]failed hosts:[/] {escape(names)}  [dim](exit status {code})[/]")
            seconds = time.monotonic() - self.started if self.started is not None else None
            self.console.print(escape(fold.summary_line(results, seconds)))
            if rerun:
                self.console.print(f"[bold]{escape(rerun_label or 're-run the failed hosts')}:[/] {escape(rerun)}")


def _group_title(g: Group) -> str | None:
    """A folded group's table is titled for the group, not for whichever host's answer stands for it."""
    title, who = g.drawn.table.get("title") if g.drawn.table else None, g.drawn.result.host
    return f"{g.header}{title[len(who):]}" if title and title.startswith(who) else title


# emoji=False, here and in _text: rich would turn a node's `:warning:` into an emoji (escape() covers markup, not
# emoji codes)
def _console(stream: Any) -> Console:
    return rich().Console(file=RedactingStream(stream), highlight=False, soft_wrap=True, emoji=False)


def _text(markup_text: str) -> Text:
    return rich().Text.from_markup(markup_text, emoji=False)


def next_lines(nxt: Any, indent: str) -> list[Line]:
    """`next: why`, then each command alone on its line (what a triple-click copies, whole at any width: the
    terminal wraps it, nothing cuts it). A plain string is one command."""
    if isinstance(nxt, str):
        why, commands = "", [nxt]
    else:
        why, commands = str(nxt.get("why") or ""), [str(c) for c in nxt.get("commands") or ()]
    out: list[Line] = [[(indent, ""), ("next:", "bold"), *([(f" {why}", "")] if why else [])]]
    out.extend([(indent + "  ", ""), (command, COMMAND)] for command in commands)
    return out


def _node_notes(r: Result) -> list[Line]:
    """What the node did or let pass on the way, whatever the task: files quarantined or tidied, warnings."""
    lines: list[Line] = []
    for moved in r.data.get("quarantined") or ():  # what the node tidied on the way, whatever the task
        text = (f" quarantined corrupt state file {moved.get('path')} ({moved.get('why')}); moved to "
                f"{moved.get('moved_to')}")
        lines.append([("    ", ""), ("node:", "yellow"), (text, "")])
    for path in r.data.get("removed_temp_files") or ():
        lines.append([("    ", ""), ("node:", "yellow"), (f" removed a dead upload's temp file {path}", "")])
    for text in r.data.get("node_warnings") or ():  # what the operator let pass (--allow-insecure-venv)
        lines.append([("    ", ""), ("node warning:", "yellow"), (f" {text}", "")])
    return lines


def render_table(spec: dict) -> RenderableType:
    """A table of plain cells that never cuts a word (an id, a path, a pid): columns wrap between words, the
    widest first; when even that does not fit the terminal, each row is printed as a block instead, its first
    cell on a line of its own and then `column: value` pairs (report/ decides at draw time, for its width)."""
    return _FitTable(spec)


class _FitTable:
    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.columns = [str(c) for c in spec["columns"]]
        self.rows = [[shown(str(v)) for v in row] for row in spec["rows"]]
        self.highlight = set(spec.get("highlight_rows", []))

    def __rich_console__(self, console: Console, options: Any) -> Any:
        from rich.cells import cell_len

        def longest(cells: list[str], words: bool) -> int:
            parts = [p for c in cells for ln in c.split("\n") for p in (ln.split() if words else [ln])]
            return max((cell_len(p) for p in parts), default=1) or 1

        cells = [[name, *(row[i] if i < len(row) else "" for row in self.rows)] for i, name in
                 enumerate(self.columns)]
        least = [longest(c, True) for c in cells]
        most = [longest(c, False) for c in cells]
        chrome = 3 * len(self.columns) + 1  # rich's default box: an edge each side, a rule and padding per column
        room = options.max_width - chrome
        if sum(most) <= room:
            yield self._table(None)
        elif sum(least) <= room:
            yield self._table(_share(least, most, room))
        else:
            yield from self._blocks(options.max_width)

    def _table(self, widths: list[int] | None) -> Table:
        title = self.spec.get("title")
        table = rich().Table(title=escape(str(title)) if title else None, title_justify="left")
        for n, column in enumerate(self.columns):
            table.add_column(column, width=widths[n] if widths else None, overflow="fold")
        for n, row in enumerate(self.rows):
            table.add_row(*[escape(v) for v in row], style="bold yellow" if n in self.highlight else None)
        return table

    def _blocks(self, width: int) -> Any:
        from rich.cells import cell_len

        title = self.spec.get("title")
        if title:
            yield _text(f"[italic]{escape(str(title))}[/]")
        for n, row in enumerate(self.rows):
            style = "bold yellow" if n in self.highlight else "bold"
            yield _text(f"[{style}]{escape(row[0])}[/]" if row else "")
            line: list[tuple[str, str]] = []  # (plain, markup) of the pairs on the line being filled
            for name, value in zip(self.columns[1:], row[1:]):
                values = value.split("\n")
                pair = (f"{name}: {values[0]}", f"[dim]{escape(name)}:[/] {escape(values[0])}")
                used = 4 + sum(cell_len(p) + 2 for p, _ in line)
                if line and used + cell_len(pair[0]) > width:
                    yield _text("    " + "  ".join(m for _, m in line))
                    line = []
                line.append(pair)
                for more in values[1:]:  # a cell of several lines (a GPU's processes): one under the other
                    yield _text("    " + "  ".join(m for _, m in line))
                    line = [(f"  {more}", f"  {escape(more)}")]
            if line:
                yield _text("    " + "  ".join(m for _, m in line))


def _share(least: list[int], most: list[int], room: int) -> list[int]:
    """Column widths between each one's longest word and its longest line, summing to at most `room`: the
    space left over after every longest word goes to the columns that would wrap most, in turn."""
    widths = list(least)
    spare = room - sum(widths)
    while spare > 0:
        wants = [m - w for m, w in zip(most, widths)]
        n = max(range(len(widths)), key=lambda i: wants[i])
        if wants[n] <= 0:
            break
        give = min(spare, wants[n], max(1, spare // len(widths)))
        widths[n] += give
        spare -= give
    return widths


EVIDENCE_SHOWN = 5  # per check in the human view; what is left is counted, never dropped silently


def _item_detail_lines(details: dict[str, Any], verbose: bool) -> list[str]:
    out: list[str] = []
    for drift in details.get("drift", []):
        if drift.get("hunk") is None:
            out.append(drift.get("message", ""))
            continue
        out.append(f"hunk {drift['hunk']} {drift['header']}: {drift['state']} near line {drift['near_line']}")
        diff = drift.get("first_difference")
        if diff:
            out.append(f"  line {diff['line']}: expected {diff['expected']!r}")
            out.append(f"  {' ' * len(str(diff['line']))}       found    {diff['found']!r}")
    if details.get("diff_text") and details.get("show_diff"):
        out.extend(details["diff_text"].rstrip("\n").splitlines())
    evidence = details.get("evidence", [])
    for ev in evidence[:EVIDENCE_SHOWN]:
        if isinstance(ev, dict):
            if {"file", "line", "callee", "error"} <= set(ev):
                out.append(f"{ev['file'].rsplit('/', 1)[-1]}:{ev['line']}: {ev['callee']}: {ev['error']}")
            elif "line" in ev and "text" in ev:
                out.append(f"line {ev['line']}: {ev['text']}")
            else:
                out.append(", ".join(f"{k}={v}" for k, v in ev.items()))
        else:
            out.extend(str(ev).splitlines()[-3:])
    total = max(len(evidence), details.get("matches") or 0)  # a grep counts lines past those it answers with
    if total > EVIDENCE_SHOWN:
        kept = "all" if total == len(evidence) else f"the first {len(evidence)}"
        out.append(f"and {total - EVIDENCE_SHOWN} more (--json for {kept})")
    if details.get("stderr_tail"):
        out.append("stderr (last lines):")
        out.extend("  " + x for x in details["stderr_tail"][-10:])
    if details.get("proves"):
        out.append(f"proves: {details['proves']}; cannot prove: {details['cannot']}")
    for note in details.get("notes", []):
        out.append(note)
    return out
