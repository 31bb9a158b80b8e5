"""The closing part of a run: folded groups (when folding), odd ones out (--odd), the fleet tables,
the RECAP table, the failed hosts, the one-line summary and the re-run command; or, with --json, one
JSON document."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..plans.hostrange import fold as fold_names
from ..plans.hostrange import natural_key
from ..redaction import dumps
from ..results import Result, Status, recap
from . import fold
from .fittable import render_table
from .fold import COMMAND, Group, Identity, Line
from .lines import STYLE
from .richload import escape, print_line, rich

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

Draw = Callable[[Result], tuple[list[Line], dict | None]]


def write_json(results: list[Result], code: int, extra: dict[str, Any] | None) -> None:
    doc = {
        "exit_status": code,
        "recap": recap(results),
        "failed_hosts": sorted({r.host for r in results if r.failed}),
        "results": [r.to_json() for r in results],
        **(extra or {}),
    }
    sys.stdout.write(dumps(doc, indent=1, default=str) + "\n")  # secrets masked as values
    sys.stdout.flush()


def recap_table(counts: dict[str, dict[str, int]], folded: bool) -> Table:
    table = rich().Table(title="RECAP", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("hosts" if folded else "host", style="bold")
    for s in Status:
        table.add_column(s.value, justify="right")
    rows = (
        fold.recap_groups(counts)
        if folded
        else sorted(counts.items(), key=lambda kv: natural_key(kv[0]))
    )
    for host, row in rows:
        table.add_row(
            escape(host),
            *[f"[{STYLE[s]}]{row[s.value]}[/]" if row[s.value] else "0" for s in Status],
        )
    return table


def print_closing(
    console: Console,
    results: list[Result],
    code: int,
    *,
    folded: bool,
    odd: bool,
    draw: Draw,
    who: dict[str, Identity],
    sections: list[dict] | None,
    started: float | None,
    rerun: str | None,
    rerun_label: str | None,
) -> None:
    """Everything after the per-host lines, in order; `rerun` (made by run.py) when something
    failed."""
    counts = recap(results)
    groups = print_folded(console, results, draw, who) if folded else None
    if odd:
        print_odd_ones_out(console, groups or fold.group(fold.draw_all(results, draw, who)))
    for section in sections or []:
        console.print()
        console.print(render_table(section))
    if len(counts) > 1:  # one host: its own lines already say what a recap row would
        console.print()
        # built only here: a one-host run draws no table and so never imports rich.table
        console.print(recap_table(counts, folded))
    failed = sorted({r.host for r in results if r.failed}, key=natural_key)
    if failed:
        names = fold_names(failed) if folded else ", ".join(failed)
        console.print(f"[bold red]failed hosts:[/] {escape(names)}  [dim](exit status {code})[/]")
    seconds = time.monotonic() - started if started is not None else None
    console.print(escape(fold.summary_line(results, seconds)))
    if rerun:
        print_line(
            console,
            [(f"{rerun_label or 're-run the failed hosts'}:", "bold"), (" ", ""), (rerun, COMMAND)],
            "",
        )


def print_folded(
    console: Console, results: list[Result], draw: Draw, who: dict[str, Identity]
) -> list[Group]:
    groups = fold.group(fold.draw_all(results, draw, who))
    for g in groups:
        if g.drawn.table:
            table = (
                g.drawn.table
                if len(g.hosts) == 1
                else {**g.drawn.table, "rows": g.drawn.folded_rows, "title": _group_title(g)}
            )
            console.print(render_table(table))
        for line in g.lines():
            print_line(console, line, g.header)
    return groups


def print_odd_ones_out(console: Console, groups: list[Group]) -> None:
    console.print()
    console.print("[bold]odd ones out[/] [dim](each minority group against its task's majority)[/]")
    for _task, _minority, diff in fold.odd_ones_out(groups):
        for text in diff:
            style = (
                "bold"
                if text.startswith(("---", "+++"))
                else "red"
                if text.startswith("-")
                else "green"
                if text.startswith("+")
                else "cyan"
                if text.startswith("@@")
                else ""
            )
            console.print(f"[{style}]{escape(text)}[/]" if style else escape(text))


def _group_title(g: Group) -> str | None:
    """A folded group's table is titled for the group, not for whichever host's answer stands for
    it."""
    title, who = g.drawn.table.get("title") if g.drawn.table else None, g.drawn.result.host
    return f"{g.header}{title[len(who) :]}" if title and title.startswith(who) else title
