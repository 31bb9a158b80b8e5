"""Playbook authoring, pure (text in, text out): a diff made from a pristine and an edited file
(`capture`), a playbook's hunks tried against a newer pristine file (`rebase`), and the playbook
YAML those write.

Hunk placement here is the client's own, independent of the node's engine
(remote_scripts/patch/hunks.py, which never fuzzes): like patch(1) it looks for a hunk's old block
at its header's line plus the offset of the hunks before it, then one line after, one before, ...;
and, where that fails, with up to `max_fuzz` context lines dropped at each end (patch(1)'s fuzz). A
rebased hunk that needed fuzz is *shown*, never hidden: the context the new upstream file has
instead is part of the report. The candidate diffs are then made afresh from the new pristine file
and the result, so the playbook they go into applies at fuzz 0.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..agent.patch.hunks import bare, split_lines
from .unidiff import Hunk

CLEAN, OFFSET, FUZZ, CONFLICT, UPSTREAM = "clean", "offset", "fuzz", "conflict", "already upstream"
APPLIED_STATES = (CLEAN, OFFSET, FUZZ, UPSTREAM)


def unified_diff(pristine: str, edited: str, rel: str, context: int = 3) -> str:
    """The diff a playbook ships: `a/<rel>` → `b/<rel>`, rel being the file's path inside
    site-packages."""
    a, b = split_lines(pristine), split_lines(edited)
    out = []
    for line in difflib.unified_diff(a, b, f"a/{rel}", f"b/{rel}", n=context):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


# ---------------------------------------------------------------- rebase
@dataclass
class HunkOutcome:
    index: int  # 0-based
    header: str
    state: str  # CLEAN / OFFSET / FUZZ / CONFLICT / UPSTREAM
    line: int | None = None  # 1-based line of the hunk's first changed line in the new file
    offset: int = 0
    fuzz: int = 0
    # what an operator must read: fuzzed context, upstream text
    shown: list[str] = field(default_factory=list)

    @property
    def applied(self) -> bool:
        return self.state in APPLIED_STATES

    def describe(self) -> str:
        if self.state == CLEAN:
            return f"applies cleanly at line {self.line}"
        if self.state == OFFSET:
            return f"applies with offset {self.offset:+d} lines (at line {self.line})"
        if self.state == FUZZ:
            return (
                f"applies with fuzz {self.fuzz} (context lines ignored), offset {self.offset:+d} "
                f"lines (at line {self.line}): check the context shown"
            )
        if self.state == UPSTREAM:
            return (
                f"already upstream: the new file has the hunk's result at line {self.line}; dropped"
            )
        return "conflict: the old lines are not in the new file (the new upstream text is shown)"


@dataclass
class FileRebase:
    hunks: list[HunkOutcome]
    text: str | None  # the new pristine file with every hunk applied; None when any conflicts

    @property
    def ok(self) -> bool:
        return self.text is not None


def _context(h: Hunk) -> tuple[int, int]:
    return h.context


def _find(lines: list[str], block: list[str], guess: int, lo: int) -> int | None:
    """patch(1)'s search order: guess, guess+1, guess-1, ...; never before `lo`."""
    n, m = len(lines), len(block)
    if m == 0:
        return max(min(guess, n), lo)
    hi = n - m
    guess = max(min(guess, hi), lo)
    for d in range(0, max(hi - lo, 0) + 1 + abs(guess)):
        for at in (guess + d,) if d == 0 else (guess + d, guess - d):
            if lo <= at <= hi and all(lines[at + k] == block[k] for k in range(m)):
                return at
        if guess + d > hi and guess - d < lo:
            break
    return None


def rebase_file(new_pristine: str, hunks: list[Hunk], max_fuzz: int = 2) -> FileRebase:
    """Each hunk against the new pristine text, in order, with the offset of the hunks before it."""
    raw = split_lines(new_pristine)
    lines = [bare(x) for x in raw]
    newline = "\r\n" if raw and raw[0].endswith("\r\n") else "\n"
    outcomes: list[HunkOutcome] = []
    # (start, end) in the new file's lines → replacement
    edits: list[tuple[int, int, list[str]]] = []
    offset = 0
    # lines before this one are taken by earlier hunks
    frozen = 0
    for i, h in enumerate(hunks):
        pre, suf = _context(h)
        header_at = h.old_start - (1 if h.old else 0)
        placed = _place(lines, h, header_at + offset, frozen, max_fuzz)
        if placed is None:
            at_new = _upstream_at(lines, h, offset, frozen)
            if at_new is None:
                shown = _conflict_view(lines, h, header_at + offset)
                outcomes.append(HunkOutcome(i, h.header, CONFLICT, shown=shown))
                continue
            offset = at_new - (h.new_start - 1)
            frozen = at_new + len(h.new) - suf
            outcomes.append(
                HunkOutcome(i, h.header, UPSTREAM, line=at_new + pre + 1, offset=offset)
            )
            continue
        start, fuzz, top, bottom = placed
        offset = start - header_at
        shown = _fuzzed_context(lines, h.old, start, top, bottom)
        change_from, change_to = start + pre, start + len(h.old) - suf
        replacement = [x + newline for x in h.new[pre : len(h.new) - suf]]
        edits.append((change_from, change_to, replacement))
        frozen = change_to
        state = FUZZ if fuzz else (OFFSET if offset else CLEAN)
        outcomes.append(
            HunkOutcome(
                i, h.header, state, line=change_from + 1, offset=offset, fuzz=fuzz, shown=shown
            )
        )
    if any(not o.applied for o in outcomes):
        return FileRebase(outcomes, None)
    return FileRebase(outcomes, _splice(raw, edits, newline))


def _place(
    lines: list[str], h: Hunk, expected: int, frozen: int, max_fuzz: int
) -> tuple[int, int, int, int] | None:
    """Where the hunk's old lines stand, dropping up to `max_fuzz` context lines at each end:
    (start, fuzz, context lines dropped at the top, at the bottom)."""
    pre, suf = _context(h)
    for fuzz in range(0, max_fuzz + 1):
        top, bottom = min(fuzz, pre), min(fuzz, suf)
        if fuzz and top == 0 and bottom == 0:
            return None  # no context left to drop
        block = h.old[top : len(h.old) - bottom]
        at = _find(lines, block, expected + top, frozen)
        if at is not None:
            return at - top, fuzz, top, bottom
    return None


def _upstream_at(lines: list[str], h: Hunk, offset: int, frozen: int) -> int | None:
    """Where the hunk's new lines already stand: upstream made the change itself."""
    if not h.new:
        return None
    return _find(lines, h.new, h.new_start - 1 + offset, frozen)


def _fuzzed_context(
    lines: list[str], old: list[str], start: int, top: int, bottom: int
) -> list[str]:
    """The context lines fuzz dropped that differ in the new file, each beside what it found."""
    shown: list[str] = []
    for k in list(range(top)) + list(range(len(old) - bottom, len(old))):
        found = lines[start + k] if 0 <= start + k < len(lines) else "<end of file>"
        if found != old[k]:
            shown.append(f"line {start + k + 1}: diff's context {old[k]!r}")
            shown.append(f"{' ' * len(str(start + k + 1))}       new upstream   {found!r}")
    return shown


def _splice(raw: list[str], edits: list[tuple[int, int, list[str]]], newline: str) -> str:
    """The new file with each edit's lines replaced; a replaced last line without a newline keeps
    going without one."""
    out: list[str] = []
    cursor = 0
    for start, end, replacement in edits:
        out.extend(raw[cursor:start])
        removed = raw[start:end]
        if replacement and removed and not removed[-1].endswith("\n"):
            replacement[-1] = replacement[-1][: -len(newline)]
        out.extend(replacement)
        cursor = end
    out.extend(raw[cursor:])
    return "".join(out)


def _likeliest(lines: list[str], block: list[str], expected: int) -> tuple[int, int]:
    """The line where the file holds most of `block` (the nearest to `expected` of equals), and how
    many of its lines are equal there."""
    n = len(block)
    best, score = max(0, min(expected, max(len(lines) - 1, 0))), -1
    for p in range(max(1, len(lines) - n + 1)):
        s = sum(1 for k in range(min(n, len(lines) - p)) if lines[p + k] == block[k])
        if s > score or (s == score and abs(p - expected) < abs(best - expected)):
            best, score = p, s
    return best, score


def _conflict_view(lines: list[str], h: Hunk, expected: int) -> list[str]:
    """The hunk's old lines, and the new upstream lines where the file looks most like them."""
    block = h.old
    n = len(block)
    best, score = _likeliest(lines, block, expected)
    shown = ["the diff expects (old lines):"]
    shown += [f"  - {x}" if tag == "-" else f"    {x}" for tag, x in h.lines if tag in " -"]
    lo, hi = max(best - 1, 0), min(best + n + 1, len(lines))
    shown.append(f"new upstream, lines {lo + 1}-{hi} ({score} of {n} lines equal):")
    shown += [
        (
            f"  {k + 1:>5} "
            f"{'=' if k - best in range(n) and lines[k] == block[k - best] else '|'} {lines[k]}"
        )
        for k in range(lo, hi)
    ]
    shown.append("the diff wanted there (new lines):")
    shown += [f"  + {x}" if tag == "+" else f"    {x}" for tag, x in h.lines if tag in " +"]
    return shown


# ---------------------------------------------------------------- playbook text
TOP_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):")


def _scalar(value: str) -> str:
    return (
        value
        if re.fullmatch(r"[A-Za-z0-9_.][A-Za-z0-9_./=*<>!~,-]*", value) and not value.endswith(":")
        else json.dumps(value)
    )


def scalar(value: str) -> str:
    """`value` as a YAML scalar: plain where that reads back as the same text, else
    double-quoted."""
    return _scalar(value)


def render_requires(requires: list[str]) -> str:
    return "requires:\n" + "".join(f"  - {_scalar(r)}\n" for r in requires)


def render_patches(entries: list[dict[str, str]]) -> str:
    out = ["patches:\n"]
    for entry in entries:
        first = True
        for key, value in entry.items():
            out.append(f"{'  - ' if first else '    '}{key}: {_scalar(value)}\n")
            first = False
    return "".join(out)


def replace_top_block(text: str, key: str, block: str, after: str | None = None) -> str:
    """`text` with the top-level `key:` block replaced by `block` (comments elsewhere kept). A
    missing key is added after the block of `after` (or at the end)."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, x in enumerate(lines) if TOP_KEY.match(x)]

    def span(name: str) -> tuple[int, int] | None:
        for n, i in enumerate(starts):
            if TOP_KEY.match(lines[i]).group(1) == name:  # type: ignore[union-attr]
                end = starts[n + 1] if n + 1 < len(starts) else len(lines)
                while end > i + 1 and (
                    not lines[end - 1].strip() or lines[end - 1].startswith("#")
                ):
                    end -= 1  # comments just above the next key belong to it
                return i, end
        return None

    where = span(key)
    if where is None:
        anchor = span(after) if after else None
        at = anchor[1] if anchor else len(lines)
        if at == len(lines) and lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        return "".join(lines[:at] + [block] + lines[at:])
    return "".join(lines[: where[0]] + [block] + lines[where[1] :])


def replace_scalar(text: str, key: str, value: str) -> str:
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        m = TOP_KEY.match(line)
        if m and m.group(1) == key:
            lines[i] = f"{key}: {_scalar(value)}\n"
            return "".join(lines)
    return f"{key}: {_scalar(value)}\n" + text


def pin_requires(
    existing: list[str], versions: Mapping[str, str | None], names: list[str]
) -> list[str]:
    """Each of `names` pinned to the node's version, in the shape its existing pin has (pin_for);
    others kept."""

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "_", name).lower()

    wanted = {norm(n): n for n in names if versions.get(n)}
    out: list[str] = []
    for req in existing:
        name = re.split(r"[\s=<>!~]", req.strip(), maxsplit=1)[0]
        key = norm(name)
        if key in wanted:
            out.append(pin_for(req, name, str(versions[wanted.pop(key)])))
        else:
            out.append(req)
    out.extend(f"{n}=={versions[n]}" for n in wanted.values())
    return out


_RELEASE = re.compile(r"(\d+(?:\.\d+)*)")


def pin_for(old: str | None, name: str, version: str) -> str:
    """`name` pinned to `version` in the shape the playbook's author chose for its old pin, so a
    playbook that accepted a release series keeps accepting one (the point releases its checks prove
    on each node): `==0.16.*` becomes `==0.17.*`, `>=0.16.0,<0.17` becomes `>=0.17.0,<0.18`,
    `~=0.16.0` becomes `~=0.17.0`; an exact pin, or none, stays exact (`==0.17.0`)."""
    release = _RELEASE.match(version)
    spec = (
        re.sub(r"\s+", "", (old or "")[len(name) :]) if old and old.strip().startswith(name) else ""
    )
    if release is None or not spec:
        return f"{name}=={version}"
    parts = release.group(1).split(".")
    m = re.fullmatch(r"==(\d+(?:\.\d+)*)\.\*", spec)
    if m:
        width = len(m.group(1).split("."))
        return (
            f"{name}=={'.'.join(parts[:width])}.*" if len(parts) >= width else f"{name}=={version}"
        )
    m = re.fullmatch(r"~=(\d+(?:\.\d+)+)", spec)
    if m:
        width = len(m.group(1).split("."))
        return f"{name}~={'.'.join(parts[:width])}" if len(parts) >= width else f"{name}=={version}"
    m = re.fullmatch(r">=\d+(?:\.\d+)*,<(\d+(?:\.\d+)*)", spec)
    if m:
        width = len(m.group(1).split("."))
        if len(parts) >= width:
            upper = [*parts[: width - 1], str(int(parts[width - 1]) + 1)]
            return f"{name}>={release.group(1)},<{'.'.join(upper)}"
    return f"{name}=={version}"


def exact_pins(requires: list[str]) -> list[str]:
    """The pins of `requires` that name one exact release (`vllm==0.17.0`): each refuses every point
    release."""
    return [
        r
        for r in requires
        if re.fullmatch(r"\s*[A-Za-z0-9][A-Za-z0-9._-]*\s*===?\s*[0-9][0-9.]*\s*", r)
    ]


def series_pin(req: str) -> str | None:
    """The range an exact pin could be instead, accepting the release's point releases
    (`vllm==0.17.0` -> `vllm>=0.17.0,<0.18`); None when it names fewer than two release numbers."""
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*(\d+)\.(\d+)((?:\.\d+)*)\s*", req)
    if not m:
        return None
    name, major, minor, rest = m.groups()
    return f"{name}>={major}.{minor}{rest or '.0'},<{major}.{int(minor) + 1}"


def new_playbook_text(
    name: str,
    description: str,
    header: list[str],
    requires: list[str],
    patches: list[dict[str, str]],
    modules: list[str],
) -> str:
    """A fresh playbook: requires, patches, and one compile check per module (verify has something
    to run; add grep/callsites/probe checks that prove the fix)."""
    checks = "".join(
        f"  - name: {m.rsplit('.', 1)[-1]}-compiles\n    kind: compile\n    module: {m}\n"
        for m in modules
    )
    return (
        "".join(f"# {x}\n" for x in header)
        + f"name: {_scalar(name)}\n"
        + f"description: {json.dumps(description)}\n"
        + render_requires(requires)
        + render_patches(patches)
        + "verify:\n"
        + checks
    )


# ---------------------------------------------------------------- text written for the old versions
def stale_versions(old_requires: list[str], versions: Mapping[str, str | None]) -> list[str]:
    """The release numbers the old pins name (`vllm==0.16.*` -> "0.16") whose package the node now
    has at another version: a comment or description naming them describes the old versions."""
    out = []
    for req in old_requires:
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([0-9][0-9.]*?)(?:\.\*)?\s*$", req)
        if not m or not versions.get(m.group(1)) or versions[m.group(1)] == m.group(2):
            continue
        if not str(versions[m.group(1)]).startswith(m.group(2) + "."):
            out.append(m.group(2))
    return list(dict.fromkeys(out))


def stale_lines(text: str, releases: list[str], first_line: int = 1) -> list[str]:
    """ "line N: ..." for each line of a playbook's text that names one of `releases` as a version
    (not inside a path or a name such as speculators-0.3.0-vllm-0.16/)."""
    if not releases:
        return []
    rx = re.compile(
        r"(?<![\w./])(?<![A-Za-z]-)(?:"
        + "|".join(re.escape(r) for r in releases)
        + r")(?![\w/]|\.\d)"
    )
    return [
        f"line {n}: {line.strip()}"
        for n, line in enumerate(text.splitlines(), first_line)
        if rx.search(line)
    ]
