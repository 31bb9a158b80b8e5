"""render_table(): a table of plain cells drawn for the terminal's width, never cutting a word:
columns wrap between words, else each row becomes a block of `column: value` pairs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..redaction import shown
from .richload import escape, rich, text

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table


def render_table(spec: dict) -> RenderableType:
    """A table of plain cells that never cuts a word (an id, a path, a pid): columns wrap between
    words, the widest first; when even that does not fit the terminal, each row is printed as a
    block instead, its first cell on a line of its own and then `column: value` pairs (report/
    decides at draw time, for its width)."""
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
            parts = [
                p for c in cells for ln in c.split("\n") for p in (ln.split() if words else [ln])
            ]
            return max((cell_len(p) for p in parts), default=1) or 1

        cells = [
            [name, *(row[i] if i < len(row) else "" for row in self.rows)]
            for i, name in enumerate(self.columns)
        ]
        least = [longest(c, True) for c in cells]
        most = [longest(c, False) for c in cells]
        # rich's default box: an edge each side, a rule and padding per column
        chrome = 3 * len(self.columns) + 1
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
            table.add_row(
                *[escape(v) for v in row], style="bold yellow" if n in self.highlight else None
            )
        return table

    def _blocks(self, width: int) -> Any:
        from rich.cells import cell_len

        title = self.spec.get("title")
        if title:
            yield text(f"[italic]{escape(str(title))}[/]")
        for n, row in enumerate(self.rows):
            style = "bold yellow" if n in self.highlight else "bold"
            yield text(f"[{style}]{escape(row[0])}[/]" if row else "")
            # (plain, markup) of the pairs on the line being filled
            line: list[tuple[str, str]] = []
            for name, value in zip(self.columns[1:], row[1:]):
                values = value.split("\n")
                pair = (f"{name}: {values[0]}", f"[dim]{escape(name)}:[/] {escape(values[0])}")
                used = 4 + sum(cell_len(p) + 2 for p, _ in line)
                if line and used + cell_len(pair[0]) > width:
                    yield text("    " + "  ".join(m for _, m in line))
                    line = []
                line.append(pair)
                # a cell of several lines (a GPU's processes): one under the other
                for more in values[1:]:
                    yield text("    " + "  ".join(m for _, m in line))
                    line = [(f"  {more}", f"  {escape(more)}")]
            if line:
                yield text("    " + "  ".join(m for _, m in line))


def _share(least: list[int], most: list[int], room: int) -> list[int]:
    """Column widths between each one's longest word and its longest line, summing to at most
    `room`: the space left over after every longest word goes to the columns that would wrap most,
    in turn."""
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
