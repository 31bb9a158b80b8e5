"""Where a value of an operator's file came from, and the error that names it: ConfigError
(`file:line:column: message`), and the mappings and lists the YAML loader builds, which know the
line and column of each key and item."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def one_line_text(text: str) -> str:
    """Messages go to a terminal line and to log lines: never a newline in the middle."""
    return " ".join(str(text).split())


class ConfigError(Exception):
    """A problem in a file the operator wrote; always names the file and, when known, line and
    column, as `file:line:column: message` on one line (the form editors and terminals jump to)."""

    def __init__(
        self, path: str | Path, line: int | None, message: str, column: int | None = None
    ) -> None:
        self.path = str(path)
        self.line = line
        self.column = column
        self.message = one_line_text(message)
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.path
        if self.line:
            where += f":{self.line}"
            if self.column:
                where += f":{self.column}"
        return f"{where}: {self.message}"


def did_you_mean(word: Any, choices: Iterable[str]) -> str:
    """'; did you mean 'x'?' when one of choices is close to word, else ''."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class Mapping(dict[str, Any]):
    """A YAML mapping that knows its own line and column and those of each key."""

    path: str = "?"
    line: int | None = None
    column: int | None = None
    key_lines: dict[Any, int | None]
    key_cols: dict[Any, int]

    def line_of(self, key: Any) -> int | None:
        return getattr(self, "key_lines", {}).get(key, self.line)

    def column_of(self, key: Any) -> int | None:
        # A key whose line is known but column is not (a merged mapping) gets no column, never a
        # wrong one.
        cols = getattr(self, "key_cols", {})
        return (
            cols[key]
            if key in cols
            else (None if key in getattr(self, "key_lines", {}) else self.column)
        )

    def error(self, key: Any, message: str) -> ConfigError:
        return ConfigError(self.path, self.line_of(key), message, self.column_of(key))


class Sequence(list[Any]):
    path: str = "?"
    line: int | None = None
    column: int | None = None
    item_lines: list[int]
    item_cols: list[int]

    def line_of(self, index: int) -> int | None:
        return self.item_lines[index] if index < len(self.item_lines) else self.line

    def column_of(self, index: int) -> int | None:
        cols = getattr(self, "item_cols", [])
        return cols[index] if index < len(cols) else self.column
