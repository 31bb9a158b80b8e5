"""`fab history`: this project's audit log as a table that fits the terminal, or as one JSON
document."""

from __future__ import annotations

import datetime as dt
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .. import audit
from ..redaction import dumps
from ..redaction import shown as cleaned
from .console import Reporter

NONE = "-"
MSG_MIN = 24  # narrower than this, a message says nothing; optional columns give way first
ELLIPSIS = "…"


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    cell: Callable[[dict[str, Any]], str]
    keep: int  # 0: always shown; then the order in which optional columns are added while they fit
    right: bool = False


def _text(key: str) -> Callable[[dict[str, Any]], str]:
    def cell(rec: dict[str, Any]) -> str:
        value = rec.get(key)
        return NONE if value is None or value == "" else str(value)

    return cell


def when(rec: dict[str, Any], now: dt.datetime | None = None) -> str:
    """The entry's time in the operator's local zone, as `ls -l` shows it: "Nov 30 14:05" this year,
    the date alone for older entries. The log keeps UTC with seconds (history --json)."""
    raw = rec.get("time")
    try:
        stamp = dt.datetime.fromisoformat(str(raw)).astimezone()
    except (TypeError, ValueError):
        return str(raw)[:16] if raw else NONE
    now = now or dt.datetime.now().astimezone()
    return stamp.strftime("%b %d %H:%M") if stamp.year == now.year else stamp.strftime("%Y-%m-%d")


def _changed(rec: dict[str, Any]) -> str:
    value = rec.get("changed")
    return NONE if value is None else ("yes" if value else "no")


def _exit(rec: dict[str, Any]) -> str:
    value = rec.get("exit_status")
    return NONE if value is None else str(value)


def _seconds(rec: dict[str, Any]) -> str:
    value = rec.get("duration_s")
    if value is None:
        return NONE
    try:
        return f"{float(value):.1f}s"
    except (TypeError, ValueError):
        return NONE


def _inventory(rec: dict[str, Any]) -> str:
    """The inventory file, relative to the project when it lies inside it (hosts/lab.yaml)."""
    value = rec.get("inventory")
    if not value:
        return NONE
    path = Path(str(value))
    project = rec.get("project")
    if project:
        # the project is logged resolved; the file as Fabric found it
        for candidate in (path, path.resolve()):
            if candidate.is_relative_to(project):
                return str(candidate.relative_to(project))
    return _home(str(path))


def _msg(rec: dict[str, Any]) -> str:
    # one line: a multi-line message would break the row
    text = " ".join(str(rec.get("msg") or "").split())
    return text or NONE


def _home(path: str) -> str:
    home = str(Path.home())
    return (
        "~" + path[len(home) :]
        if home != "/" and (path == home or path.startswith(home + "/"))
        else path
    )


# Shown in this order; `keep` says which go first when the terminal is narrow.
COLUMNS = [
    Column("time", "time", when, 0),
    Column("operator", "operator", _text("operator"), 2),
    Column("host", "host", _text("host"), 0),
    Column("task", "task", _text("task"), 0),
    Column("playbook", "playbook", _text("playbook"), 4),
    Column("result", "result", _text("result"), 0),
    Column("changed", "changed", _changed, 5),
    Column("exit_status", "exit", _exit, 0, right=True),
    Column("duration_s", "took", _seconds, 1, right=True),
    Column("address", "address", _text("address"), 3),
    Column("inventory", "inventory", _inventory, 6),
    Column("msg", "msg", _msg, 0),
]


def fit(rows: list[list[str]], width: int, need: int = 0) -> tuple[list[int], int]:
    """Which columns to show at `width` and how wide the message may be: every fixed column at its
    full width (a cut host or time is useless), optional ones added while the message keeps MSG_MIN,
    or `need` (its longest word: a job id is never cut) when that is more."""
    natural = [max([len(c.header)] + [len(r[i]) for r in rows]) for i, c in enumerate(COLUMNS)]
    msg = len(COLUMNS) - 1
    shown = [i for i, c in enumerate(COLUMNS) if c.keep == 0]

    # rich's default box: a rule before each column and one after, padding 1+1
    def room(cols: list[int]) -> int:
        return width - sum(natural[i] for i in cols if i != msg) - (3 * len(cols) + 1)

    for i in sorted((i for i, c in enumerate(COLUMNS) if c.keep), key=lambda i: COLUMNS[i].keep):
        if room(shown + [i]) >= max(min(MSG_MIN, natural[msg]), need):
            shown.append(i)
    shown.sort()
    return shown, max(room(shown), len(COLUMNS[msg].header))


def truncate(text: str, width: int) -> str:
    """`text` in `width` characters, cut between words (half a word, or half a job id, reads as
    another one), with an ellipsis saying that more is in `history --json`; a text of one word only
    is cut where it must."""
    if len(text) <= width:
        return text
    cut = text[: max(width - 1, 0)]
    space = cut.rfind(" ")
    if space > 0 and text[len(cut)] != " ":
        cut = cut[:space]
    return cut.rstrip(" ,;:") + ELLIPSIS


# a message longer than this many lines of its column is cut between words (all of it: --json)
MSG_LINES = 3


def table(records: list[dict[str, Any]], width: int) -> Table | Group:
    """The entries as a table whose message column wraps between words; when the terminal is too
    narrow for the longest word of a message beside the fixed columns, each entry as a block
    instead: its columns on one line and its message under them, so a job id is whole on the screen,
    never cut by an ellipsis or the terminal."""
    # Cleaned before the columns are fitted and the message cut: an entry holds what a node said
    # (entries written before the log cleaned them too), and a secret cut in half would no longer be
    # masked.
    rows = [[cleaned(c.cell(r)) for c in COLUMNS] for r in records]
    msg = len(COLUMNS) - 1
    longest = max((len(word) for r in rows for word in r[msg].split()), default=1)
    shown, msg_width = fit(rows, width, longest)
    if msg_width < longest:
        return _blocks(rows, width)
    out = Table()
    for i in shown:
        col = COLUMNS[i]
        wraps = col.key == "msg"
        out.add_column(
            col.header,
            justify="right" if col.right else "left",
            no_wrap=not wraps,
            overflow="fold" if wraps else "ellipsis",
            width=msg_width if wraps else None,
        )
    for row in rows:
        # Text, not markup: a message such as "token is [secret]" must print as written
        out.add_row(
            *[Text(truncate(row[i], MSG_LINES * msg_width) if i == msg else row[i]) for i in shown]
        )
    return out


def _blocks(rows: list[list[str]], width: int) -> Group:
    """Each entry as a block: its columns on a line, aligned with the other entries', then its
    message wrapped between words under them (indented)."""
    msg = len(COLUMNS) - 1

    def cell(i: int, row: list[str]) -> str:
        return f"exit {row[i]}" if COLUMNS[i].key == "exit_status" else row[i]

    natural = {i: max(len(cell(i, r)) for r in rows) for i in range(msg)}
    shown = [i for i, c in enumerate(COLUMNS[:msg]) if c.keep == 0]
    for i in sorted(
        (i for i, c in enumerate(COLUMNS[:msg]) if c.keep), key=lambda i: COLUMNS[i].keep
    ):
        said = any(r[i] != NONE for r in rows)  # a column no entry has says nothing in a block
        if said and sum(natural[j] + 2 for j in shown + [i]) - 2 <= width:
            shown.append(i)
    shown.sort()
    parts: list[Any] = []
    for row in rows:
        head = "  ".join(
            cell(i, row).rjust(natural[i]) if COLUMNS[i].right else cell(i, row).ljust(natural[i])
            for i in shown
        )
        parts.append(Text(head.rstrip(), style="bold", no_wrap=True, overflow="fold"))
        body = truncate(row[msg], MSG_LINES * max(width - 4, 20))
        parts.append(_Indented(body))
    return Group(*parts)


class _Indented:
    """A message wrapped between words at draw time, for the console's width, each line indented."""

    def __init__(self, body: str) -> None:
        self.body = body

    def __rich_console__(self, console: Any, options: Any) -> Any:
        for line in Text(self.body).wrap(console, max(options.max_width - 4, 20), overflow="fold"):
            line.rstrip()
            yield Text("    ") + line


def show_history(
    host: str | None, last: int | None, as_json: bool, root: Path | str | None = None
) -> None:
    """`root`: the project (Fabric's collection directory); found from the working directory when
    None."""
    project = Path(root) if root else None
    records = audit.read(host, last, project)
    if as_json:
        sys.stdout.write(dumps(records, indent=1) + "\n")  # masked as values (older entries too)
        return
    console = Reporter().console
    where = _home(str(audit.log_path(project)))
    scope = f" for host {host}" if host else ""
    if not records:
        console.print(f"audit log {where}: no entries{scope}", markup=False)
        old = audit.legacy_log()
        if not os.environ.get("FLEETOPS_AUDIT_LOG") and old.exists():
            console.print(
                "runs from before the log was per project "
                f"are in {_home(str(old))} (every checkout's "
                "runs in one file; `FLEETOPS_AUDIT_LOG=that-file fab history` shows them)",
                markup=False,
            )
        return
    total = len(audit.read(host, None, project)) if last else len(records)
    shown = (
        f"the last {len(records)} of {total} entries"
        if total > len(records)
        else f"{len(records)} entries"
    )
    console.print(f"audit log {where}: {shown}{scope}", markup=False)
    console.print(table(records, console.width), soft_wrap=False)  # the message wraps between words
