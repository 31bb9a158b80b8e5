"""rich, loaded at the first draw, and the ways data becomes rich markup: escape() (secrets masked,
controls made visible, markup escaped), markup() (a drawn line's segments), stream_console() and
text() (emoji codes printed as written)."""

from __future__ import annotations

import os
import sys
import threading
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ..redaction import RedactingStream, shown
from ..results import reader_gone
from .fold import COMMAND, LABEL, Line

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text


class _Rich(SimpleNamespace):
    """rich's parts; Table (rich.table, ~5 ms) imported when a table is first drawn: a run whose
    results are lines, piped, draws none."""

    def __getattr__(self, name: str) -> Any:
        if name != "Table":
            raise AttributeError(name)
        from rich.table import Table

        self.Table = Table
        return Table


_RICH: SimpleNamespace | None = None
RICH_LOCK = threading.RLock()  # the Reporter's console property holds it while rich() loads


def rich() -> SimpleNamespace:
    """The parts of rich the report draws with, imported at the first draw, not with the module:
    importing rich is ~30 ms of a run's start-up, and a run imports this module before it connects
    anywhere; run.execute has the main thread load it while the first connections are in their
    handshakes."""
    global _RICH
    if _RICH is None:
        with RICH_LOCK:
            if _RICH is None:
                from rich.console import Console, Group
                from rich.markup import escape
                from rich.text import Text

                class PipedConsole(Console):
                    def on_broken_pipe(self) -> None:
                        # rich's hook for a closed pipe (`| head`); its own exits 1, a failed run's
                        # status
                        self.quiet = True
                        raise SystemExit(reader_gone(self.file))

                _RICH = _Rich(Console=PipedConsole, Group=Group, escape=escape, Text=Text)
    return _RICH


def escape(text: str) -> str:
    """Data → rich markup that prints it as written: secrets masked, controls visible, markup
    escaped."""
    return rich().escape(shown(text))


def program() -> str:
    """The program the operator ran, as the commands printed for them to run next are spelt:
    `fleet`, or Fabric's `fab` (`python -m fabric` too)."""
    return "fleet" if sys.argv and os.path.basename(sys.argv[0]) == "fleet" else "fab"


def as_run(command: str) -> str:
    """A command to run next, in the program the operator ran (tasks write them as `fab ...`)."""
    return f"{program()} {command[4:]}" if command.startswith("fab ") else command


def markup(line: Line, label: str) -> str:
    """Segments → rich markup, the label slot filled in (a command segment drawn bold, in the
    program the operator ran)."""
    return "".join(
        f"[{'bold' if style == COMMAND else style}]"
        f"{escape(label if text == LABEL else as_run(text) if style == COMMAND else text)}[/]"
        if style
        else escape(label if text == LABEL else text)
        for text, style in line
    )


def print_line(console: Console, line: Line, label: str) -> None:
    """A drawn line on the console. Piped, one line as drawn (what grep and logs read). On a
    terminal, what fits is printed as is; a longer line of prose is wrapped by rich between words,
    its continuations indented as its first line, never cut mid-word by the terminal; and a command
    is never broken by rich: alone on a line of its own (the terminal wraps it there, and a copy of
    that line gives the command, whole)."""
    whole = text(markup(line, label))
    if not console.is_terminal or whole.cell_len <= console.width:
        console.print(whole)
        return
    at = next((n for n, (_, style) in enumerate(line) if style == COMMAND), len(line))
    prose, commands = line[:at], line[at:]
    first = prose[0][0] if prose else (commands[0][0] if commands else "")
    indent = 0 if first == LABEL else len(first) - len(first.lstrip(" "))
    if prose:
        body = text(markup(prose, label))[indent:]
        body.rstrip()
        for part in body.wrap(console, max(20, console.width - indent), overflow="fold"):
            part.rstrip()
            console.print(rich().Text(" " * indent) + part)
    if commands:
        command = text(markup(commands, label))
        lead = len(command.plain) - len(command.plain.lstrip(" "))
        console.print(rich().Text(" " * (indent + 2 if prose else indent)) + command[lead:])


# emoji=False, here and in text(): rich would turn a node's `:warning:` into an emoji (escape()
# covers markup, not emoji codes)
def stream_console(stream: Any) -> Console:
    return rich().Console(
        file=RedactingStream(stream), highlight=False, soft_wrap=True, emoji=False
    )


def text(markup_text: str) -> Text:
    return rich().Text.from_markup(markup_text, emoji=False)
