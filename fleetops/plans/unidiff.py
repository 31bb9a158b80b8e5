"""Parse unified diffs (the patch files playbooks ship) into hunks. Pure: text in, data out."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .yamlsrc import ConfigError

HUNK_HEADER = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)")


@dataclass
class Hunk:
    old_start: int
    new_start: int
    lines: list[tuple[str, str]]  # (" " | "-" | "+", text without newline)
    header: str
    line: int  # where the hunk starts in the diff file

    @property
    def old(self) -> list[str]:
        return [text for tag, text in self.lines if tag in " -"]

    @property
    def new(self) -> list[str]:
        return [text for tag, text in self.lines if tag in " +"]

    @property
    def context(self) -> tuple[int, int]:
        """Unchanged lines before the first change and after the last: patch(1) anchors a hunk whose
        two differ to the top or the end of the file, so the node needs them."""
        tags = [tag for tag, _ in self.lines]
        pre = next(i for i, tag in enumerate(tags) if tag != " ")
        suf = next(i for i, tag in enumerate(reversed(tags)) if tag != " ")
        return pre, suf

    def to_request(self, index: int) -> dict[str, Any]:
        return {
            "index": index,
            "header": self.header,
            "old_start": self.old_start,
            "new_start": self.new_start,
            "context": list(self.context),
            "old": self.old,
            "new": self.new,
        }


@dataclass
class FileDiff:
    old_path: str
    new_path: str
    hunks: list[Hunk] = field(default_factory=list)


def parse(text: str, path: str) -> list[FileDiff]:
    files: list[FileDiff] = []
    # Only "\n" ends a line (as for diff(1), patch(1) and the node's view of the file):
    # str.splitlines would also split at the form feeds and other separators real sources contain. A
    # CRLF diff's "\r" goes too.
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- "):
            if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
                raise ConfigError(path, i + 1, "'---' line not followed by '+++'")
            files.append(FileDiff(_strip_path(line[4:]), _strip_path(lines[i + 1][4:])))
            i += 2
            continue
        if line.startswith("@@"):
            if not files:
                raise ConfigError(path, i + 1, "hunk before any '---'/'+++' file header")
            hunk, i = _parse_hunk(lines, i, path)
            files[-1].hunks.append(hunk)
            continue
        i += 1  # git's "diff --git", "index ..." and free text between files are allowed
    _check_every_file_has_hunks(files, path)
    return files


def _check_every_file_has_hunks(files: list[FileDiff], path: str) -> None:
    if not any(f.hunks for f in files):
        raise ConfigError(path, None, "no hunks found: not a unified diff")
    for f in files:
        if not f.hunks:
            raise ConfigError(path, None, f"file {f.new_path!r} has no hunks")


def _hunk_body(
    lines: list[str], i: int, old_count: int, new_count: int, path: str
) -> tuple[list[tuple[str, str]], int]:
    """A hunk's (tag, text) lines from line i on, until its header's counts of old and new lines
    are reached; and the index after them."""
    body: list[tuple[str, str]] = []
    seen_old = seen_new = 0
    while i < len(lines) and (seen_old < old_count or seen_new < new_count):
        line = lines[i]
        if line.startswith("\\"):  # "\ No newline at end of file"
            i += 1
            continue
        tag = line[:1] if line else " "
        if tag not in " -+":
            raise ConfigError(path, i + 1, f"unexpected line in hunk: {line!r}")
        body.append((tag, line[1:]))
        seen_old += tag in " -"
        seen_new += tag in " +"
        i += 1
    return body, i


def _strip_path(raw: str) -> str:
    return raw.split("\t", 1)[0].strip()


def _parse_hunk(lines: list[str], i: int, path: str) -> tuple[Hunk, int]:
    m = HUNK_HEADER.match(lines[i])
    if not m:
        raise ConfigError(path, i + 1, f"malformed hunk header {lines[i]!r}")
    old_start, old_count = int(m.group(1)), int(m.group(2) or 1)
    new_start, new_count = int(m.group(3)), int(m.group(4) or 1)
    header_line = i + 1
    body, i = _hunk_body(lines, i + 1, old_count, new_count, path)
    while i < len(lines) and lines[i].startswith("\\"):
        i += 1
    seen_old = sum(1 for tag, _ in body if tag in " -")
    seen_new = sum(1 for tag, _ in body if tag in " +")
    if seen_old != old_count or seen_new != new_count:
        raise ConfigError(
            path,
            header_line,
            f"hunk counts do not match its header {lines[header_line - 1]!r} "
            f"(found -{seen_old} +{seen_new})",
        )
    if not any(tag != " " for tag, _ in body):
        raise ConfigError(path, header_line, "hunk changes nothing")
    return Hunk(old_start, new_start, body, lines[header_line - 1], header_line), i
