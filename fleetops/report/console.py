"""Turn results into what the operator reads: per-host lines as they happen, a recap, or one JSON document."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..redaction import RedactingStream, dumps
from ..results import Result, Status, recap
from .rows import bar

STYLE = {Status.OK: "green", Status.CHANGED: "yellow", Status.FAILED: "bold red",
         Status.UNREACHABLE: "bold magenta", Status.SKIPPED: "cyan"}


class Reporter:
    def __init__(self, json_mode: bool = False, verbose: bool = False, console: Console | None = None) -> None:
        self.json_mode = json_mode
        self.verbose = verbose
        self.console = console or Console(file=RedactingStream(sys.stdout), highlight=False, soft_wrap=True)
        self.lock = threading.Lock()

    # -- the live view: one row per host (current task, state, elapsed), only on a terminal
    def live_start(self, hosts: list[str]) -> None:
        self.rows = {h: {"task": "-", "state": "queued", "started": None, "done": 0} for h in hosts}
        self.live = None
        if self.json_mode or not self.console.is_terminal or os.environ.get("FLEETOPS_NO_LIVE"):
            return
        from rich.live import Live

        self.live = Live(console=self.console, get_renderable=self._live_table, refresh_per_second=4,
                         transient=True)
        self.live.start()

    def _live_table(self) -> Table:
        table = Table(title="fleet", title_justify="left", show_edge=False)
        for column in ("host", "current task", "state", "elapsed", "tasks done"):
            table.add_column(column)
        now = time.monotonic()
        for host, row in self.rows.items():
            elapsed = f"{now - row['started']:.1f}s" if row["started"] else "-"
            style = {"running": "cyan", "failed": "bold red", "unreachable": "bold magenta"}.get(row["state"], "")
            table.add_row(host, row["task"], f"[{style}]{row['state']}[/]" if style else row["state"], elapsed,
                          str(row["done"]))
        return table

    def task_started(self, host: str, task: str) -> None:
        row = getattr(self, "rows", {}).get(host)
        if row is not None:
            row.update(task=task, state="running", started=row["started"] or time.monotonic())

    def live_stop(self) -> None:
        live = getattr(self, "live", None)
        if live is not None:
            live.stop()
            self.live = None

    def error(self, message: str) -> None:
        # One line whatever the terminal's width: operators grep for it and paste it into tickets.
        Console(file=RedactingStream(sys.stderr), highlight=False, soft_wrap=True).print(
            f"[bold red]error:[/] {escape(message)}")

    def note(self, message: str) -> None:
        if not self.json_mode:
            with self.lock:
                self.console.print(escape(message))

    def job_line(self, host: str, line: str, failure: bool, progress: dict | None) -> None:
        """One line of a job's log, prefixed with its host; failures stand out the moment they appear."""
        if self.json_mode:
            return
        with self.lock:
            if failure:
                self.console.print(f"[bold]{escape(host)}[/] [bold red]| {escape(line)}[/]")
            elif progress and "total" in progress:
                self.console.print(f"[bold]{escape(host)}[/] [dim]|[/] [cyan]{escape(bar(progress))}[/] "
                                   f"[dim]{escape(line)}[/]")
            else:
                self.console.print(f"[bold]{escape(host)}[/] [dim]|[/] {escape(line)}")

    def result(self, r: Result) -> None:
        row = getattr(self, "rows", {}).get(r.host)
        if row is not None:
            row.update(state=r.status.value, done=row["done"] + 1)
        if self.json_mode:
            return
        lines = [f"[bold]{escape(r.host)}[/] [dim]|[/] {escape(r.task)} [dim]|[/] "
                 f"[{STYLE[r.status]}]{r.status.value}[/] [dim]|[/] {escape(r.msg)}"]
        if r.data.get("output"):  # an ad-hoc command's output, each line prefixed with its host
            for stream, mark in (("stdout", "[dim]|[/]"), ("stderr", "[red]![/]")):
                if r.data.get(f"{stream}_dropped_bytes"):
                    lines.append(f"[bold]{escape(r.host)}[/] {mark} [dim]({r.data[f'{stream}_dropped_bytes']} "
                                 f"earlier bytes of {stream} not shown)[/]")
                lines.extend(f"[bold]{escape(r.host)}[/] {mark} {escape(x)}"
                             for x in str(r.data.get(stream) or "").splitlines())
        table = r.data.get("table")
        scopes_shown: set[str] = set()
        for item in r.items:
            if table and item.status is Status.OK:
                continue  # the table shows it
            style = STYLE[item.status]
            lines.append(f"    [{style}]{item.status.value:<7}[/] {escape(item.label)}: {escape(item.msg)}")
            details = item.details
            if details.get("proves") in scopes_shown:  # say once per kind what such a check proves
                details = {k: v for k, v in details.items() if k not in ("proves", "cannot")}
            scopes_shown.add(item.details.get("proves", ""))
            detail = _item_detail_lines(details, self.verbose)
            lines.extend(f"            [dim]{escape(x)}[/]" for x in detail)
        if r.failed and r.evidence is not None:
            ev = r.evidence
            lines.append(f"    [dim]command:[/] {escape(ev.command)}  [dim]exit:[/] {ev.exit_code}  "
                         f"[dim]took:[/] {ev.seconds}s")
            if ev.stderr_tail:
                lines.append("    [dim]stderr (last lines):[/]")
                lines.extend(f"      {escape(x)}" for x in ev.stderr_tail)
        with self.lock:
            if table:
                self.console.print(render_table(table))
            for line in lines:
                self.console.print(line)

    def finish(self, results: list[Result], code: int, extra: dict[str, Any] | None = None,
               sections: list[dict] | None = None) -> None:
        if self.json_mode:
            doc = {"exit_status": code, "recap": recap(results),
                   "failed_hosts": sorted({r.host for r in results if r.failed}),
                   "results": [r.to_json() for r in results], **(extra or {})}
            sys.stdout.write(dumps(doc, indent=1, default=str) + "\n")  # secrets masked as values
            sys.stdout.flush()
            return
        table = Table(title="RECAP", title_justify="left", show_edge=False, pad_edge=False)
        table.add_column("host", style="bold")
        for s in Status:
            table.add_column(s.value, justify="right")
        for host, row in recap(results).items():
            table.add_row(host, *[f"[{STYLE[s]}]{row[s.value]}[/]" if row[s.value] else "0" for s in Status])
        with self.lock:
            for section in sections or []:
                self.console.print()
                self.console.print(render_table(section))
            self.console.print()
            self.console.print(table)
            failed = sorted({r.host for r in results if r.failed})
            if failed:
                self.console.print(f"[bold red]failed hosts:[/] {', '.join(failed)}  [dim](exit status {code})[/]")


def render_table(spec: dict) -> Table:
    table = Table(title=spec.get("title"), title_justify="left")
    for column in spec["columns"]:
        table.add_column(column)
    highlight_rows = set(spec.get("highlight_rows", []))
    for n, row in enumerate(spec["rows"]):
        style = "bold yellow" if n in highlight_rows else None
        table.add_row(*[escape(str(v)) for v in row], style=style)
    return table


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
    for ev in details.get("evidence", [])[:5]:
        if isinstance(ev, dict):
            if {"file", "line", "callee", "error"} <= set(ev):
                out.append(f"{ev['file'].rsplit('/', 1)[-1]}:{ev['line']}: {ev['callee']}: {ev['error']}")
            elif "line" in ev and "text" in ev:
                out.append(f"line {ev['line']}: {ev['text']}")
            else:
                out.append(", ".join(f"{k}={v}" for k, v in ev.items()))
        else:
            out.extend(str(ev).splitlines()[-3:])
    if details.get("stderr_tail"):
        out.append("stderr (last lines):")
        out.extend("  " + x for x in details["stderr_tail"][-10:])
    if details.get("proves"):
        out.append(f"proves: {details['proves']}; cannot prove: {details['cannot']}")
    for note in details.get("notes", []):
        out.append(note)
    return out
