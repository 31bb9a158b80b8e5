"""Grep patterns that are plain text and whitespace, matched with string methods instead of `re`.

Importing `re` (with the enum, functools and collections it pulls in) is ~7 ms of CPU at every agent start on
the lab's node, about as much as a steady-state `verify --kinds grep,compile` spends on its own work.
Most grep checks look for code text with some whitespace around it: `^\\s*enable_prefix_caching=False,`,
`kv_cache_specs\\s*=`, `self\\.executor\\.sample_tokens\\(`. Those are matched here, exactly as `re.search`
would: text (a character that is not special to `re`, or a backslash and a character that is neither an ASCII
letter nor a digit), `\\s*` and `\\s+` (whitespace as `re` means it: str.isspace), and a leading `^`. Any other
pattern is compiled by `re`, so every pattern means what it means to `re` (tests/test_agent_lean_units.py
checks both on the same inputs). Callers use only the truth of `.search(line)`: a TextPattern answers a bool,
not a Match.

Why greedy whitespace needs no backtracking here: a run of whitespace is only accepted where the text after it
starts with a character that is not whitespace (or it ends the pattern), so the run must be taken whole.
"""

from __future__ import annotations

from .protocol import ASCII_ALNUM

_SPECIAL = frozenset(".^$*+?{}[]\\|()")


class TextPattern:
    """`re.search` for a pattern of text and whitespace runs: parts are ("text", s) or ("space", at_least)."""

    def __init__(self, pattern: str, anchored: bool, parts: list[tuple[str, object]]) -> None:
        self.pattern, self.anchored, self.parts = pattern, anchored, parts
        self.first = parts[0][1] if parts[0][0] == "text" else ""
        # Text every match contains: most lines lack it, and `in` rejects them without a Python-level step
        self.needle = max((value for kind, value in parts if kind == "text"), key=len, default="")

    def __repr__(self) -> str:
        return f"TextPattern({self.pattern!r})"

    def search(self, line: str) -> bool:
        if self.needle not in line:  # type: ignore[operator]
            return False
        if self.anchored:
            return self._match_at(line, 0)
        at = line.find(self.first)  # an unanchored pattern starts with text: jump to where it occurs
        while at >= 0:
            if self._match_at(line, at):
                return True
            at = line.find(self.first, at + 1)
        return False

    def _match_at(self, line: str, at: int) -> bool:
        for kind, value in self.parts:
            if kind == "text":
                if not line.startswith(value, at):  # type: ignore[arg-type]
                    return False
                at += len(value)  # type: ignore[arg-type]
            else:
                end = at
                while end < len(line) and line[end].isspace():
                    end += 1
                if end - at < value:  # type: ignore[operator]
                    return False
                at = end
        return True


def text_pattern(pattern: str) -> TextPattern | None:
    """The pattern as text and whitespace runs, or None when it uses anything else of `re`."""
    anchored = pattern.startswith("^")
    i = 1 if anchored else 0
    parts: list[tuple[str, object]] = []
    text: list[str] = []
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and pattern[i + 1:i + 2] == "s" and pattern[i + 2:i + 3] in ("*", "+"):
            if text:
                parts.append(("text", "".join(text)))
                text = []
            at_least = 1 if pattern[i + 2] == "+" else 0
            if parts and parts[-1][0] == "space":
                parts[-1] = ("space", parts[-1][1] + at_least)  # type: ignore[operator]
            else:
                parts.append(("space", at_least))
            i += 3
        elif c == "\\":
            escaped = pattern[i + 1:i + 2]
            if not escaped or escaped in ASCII_ALNUM:  # \d, \w, \1, \A ...: re's own
                return None
            text.append(escaped)
            i += 2
        elif c in _SPECIAL:
            return None
        else:
            text.append(c)
            i += 1
    if text:
        parts.append(("text", "".join(text)))
    if not anchored and parts and parts[0] == ("space", 0):
        parts = parts[1:]  # a search may start anywhere: a leading \s* matches the empty run
    if not parts or (not anchored and parts[0][0] != "text"):
        return None  # empty, or an unanchored \s+ first: left to re
    for before, after in zip(parts, parts[1:]):
        if before[0] == "space" and after[0] == "text" and str(after[1])[:1].isspace():
            return None  # whitespace text right after a run: the run would have to give some back
    return TextPattern(pattern, anchored, parts)


def compile_pattern(pattern: str):  # a TextPattern or an re.Pattern
    """What a grep check searches each line with: string methods where the pattern allows, else `re`. Only the
    truth of `.search(line)` is the same for both (a bool, or a Match / None)."""
    found = text_pattern(pattern)
    if found is not None:
        return found
    import re

    return re.compile(pattern)
