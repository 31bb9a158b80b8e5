"""Where a patch's hunks sit in a file, and the file with them applied or reversed. Pure: no I/O,
stdlib only.

A hunk (a dict from fleetops.unidiff.Hunk.to_request) has an old block and a new block, each made of
the changed lines between `context[0]` lines of leading and `context[1]` lines of trailing context.

Placement is GNU patch(1)'s (locate_hunk in patch 2.7's src/patch.c) at fuzz 0, so that fleetops
never applies a hunk anywhere patch(1) -F0 would not:
- a hunk is first looked for at its header's line plus the offset the hunks before it were found at,
  then one line after, one line before, two after, ... and never before the last line an earlier
  hunk changed;
- a hunk with less leading than trailing context (it starts at line 1) may only match at the top of
  the file, one with less trailing than leading context (it ends at the last line) only at the end.
  This is also what tells "the first line deleted" from "not deleted yet": [a, b, c] and [b, c]
  differ only by where they sit.
We never fuzz (drop context lines to make a hunk fit): code that changed around a hunk is drift to
report.

The file is *pristine* when every old block can be placed that way, *patched* when every new block
can (the placement patch -R would use). When both can (code repeated elsewhere in the file), the
reading whose hunks sit nearer their expected places wins; see classify for a tie. When neither can,
each hunk is judged on its own at its expected place (old block there: pristine, new block there:
patched, the nearer one otherwise), which is what reports a partially patched file as such.
"""

from __future__ import annotations

from bisect import bisect_left

# typing.TYPE_CHECKING without importing typing: the agent's start-up imports only what it runs
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# (old index, new index, leading context, trailing context), 0-based
Shape = tuple[int, int, int, int]


def split_lines(text: str) -> list[str]:
    """Lines with their endings. Only "\\n" ends a line, as for diff(1) and patch(1): str.splitlines
    would also split at form feeds and other separators that real source files contain."""
    if not text:
        return []
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def bare(line: str) -> str:
    """A line without its line ending (LF or CRLF): hunks compare lines whatever the file's
    endings."""
    if line.endswith("\n"):
        line = line[:-1]
    return line[:-1] if line.endswith("\r") else line


def _context(h: dict) -> tuple[int, int]:
    if "context" in h:
        pre, suf = h["context"]
        return int(pre), int(suf)
    # Hunks made by hand (no tags): the longest common head and tail, as a diff tool would have
    # written them.
    old, new = h["old"], h["new"]
    limit = min(len(old), len(new))
    pre = 0
    while pre < limit and old[pre] == new[pre]:
        pre += 1
    suf = 0
    while suf < limit - pre and old[-1 - suf] == new[-1 - suf]:
        suf += 1
    return pre, suf


def _shapes(hunks: list[dict]) -> list[Shape]:
    out = []
    delta = 0  # lines added minus lines removed by the hunks before, for requests without new_start
    for h in hunks:
        # An empty block's header line is the line *after which* it goes (patch(1): "append, not
        # insert").
        old_at = h["old_start"] - (1 if h["old"] else 0)
        if h.get("new_start") is not None:
            new_at = h["new_start"] - (1 if h["new"] else 0)
        else:
            new_at = old_at + delta
        delta += len(h["new"]) - len(h["old"])
        out.append((old_at, new_at, *_context(h)))
    return out


class _Text:
    """The file's lines without endings, and where each distinct line occurs (to try only real
    candidates)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = [x[:-1] if x[-1:] == "\n" else x for x in lines]
        if any(x[-1:] == "\r" for x in self.lines):
            self.lines = [x[:-1] if x[-1:] == "\r" else x for x in self.lines]  # CRLF files
        self.where: dict[str, list[int]] = {}
        for i, line in enumerate(self.lines):
            self.where.setdefault(line, []).append(i)

    def matches(self, block: list[str], at: int) -> bool:
        return (
            at >= 0
            and at + len(block) <= len(self.lines)
            and all(self.lines[at + k] == block[k] for k in range(len(block)))
        )

    def locate(
        self, block: list[str], header_at: int, guess: int, pre: int, suf: int, frozen: int
    ) -> int | None:
        """patch(1)'s locate_hunk at fuzz 0, 0-based: where `block` goes, or None. `header_at`: the
        line its header names; `guess`: that plus the offset earlier hunks were found at; `frozen`:
        lines before it were already consumed by earlier hunks."""
        n, m = len(self.lines), len(block)
        if m == 0:
            # an empty block (insertion into an empty range) fits anywhere: patch(1) alike
            return guess
        ctx = max(pre, suf)
        lo = max(frozen - ctx, 0)  # patch(1)'s min_where: never before what earlier hunks changed
        if pre < ctx and header_at <= 0:
            # Short leading context at line 1: the hunk can only match at the top of the file.
            at = 0 if frozen <= pre and self.matches(block, 0) else None
        elif suf < ctx:
            # Short trailing context: the hunk can only match at the end of the file.
            at = n - m if n - m >= lo and self.matches(block, n - m) else None
        else:
            at = self._nearest(block, guess, lo, n - m)
        if at is not None and at + pre < frozen:
            return None  # patch(1): "misordered hunks! output would be garbled", the hunk fails
        return at

    def _nearest(self, block: list[str], guess: int, lo: int, hi: int) -> int | None:
        # patch(1)'s order: offset 0, +1, -1, +2, -2, ...; forward offsets up to the last place the
        # block fits, backward ones down to `lo`. Only lines equal to the block's first line can
        # start it: walk those.
        starts = self.where.get(block[0], [])
        right = bisect_left(starts, guess)
        left = bisect_left(starts, min(guess, hi + 1)) - 1
        while True:
            r = starts[right] if right < len(starts) and starts[right] <= hi else None
            le = starts[left] if left >= 0 and starts[left] >= lo else None
            if r is None and le is None:
                return None
            if r is not None and (le is None or r - guess <= guess - le):
                if self.matches(block, r):
                    return r
                right += 1
            elif le is not None:
                if self.matches(block, le):
                    return le
                left -= 1


def _place(
    text: _Text, hunks: list[dict], shapes: list[Shape], side: str
) -> tuple[list[int | None], int]:
    """Every hunk's `side` block ("old": patch(1), "new": patch -R) placed in order; and the lines
    moved."""
    positions: list[int | None] = []
    delta = frozen = moved = 0
    for h, (old_at, new_at, pre, suf) in zip(hunks, shapes):
        block = h[side]
        header_at = old_at if side == "old" else new_at
        guess = header_at + delta
        if not block:
            guess = min(max(guess, frozen), len(text.lines))
        at = text.locate(block, header_at, guess, pre, suf, frozen)
        positions.append(at)
        if at is None:
            # like patch(1): the next hunk is still looked for, with the offset found so far
            continue
        moved += abs(at - guess)
        delta = at - header_at
        frozen = at + len(block) - suf
    return positions, moved


def _each_hunk(text: _Text, hunks: list[dict], shapes: list[Shape]) -> list[dict]:
    """Neither form fits as a whole: judge each hunk at its expected place, the nearer block
    winning."""
    out = []
    delta = frozen = 0
    for h, (old_at, new_at, pre, suf) in zip(hunks, shapes):
        at_old = (
            text.locate(h["old"], old_at, old_at + delta, pre, suf, frozen) if h["old"] else None
        )
        at_new = (
            text.locate(h["new"], new_at, new_at + delta, pre, suf, frozen) if h["new"] else None
        )
        d_old = abs(at_old - old_at - delta) if at_old is not None else None
        d_new = abs(at_new - new_at - delta) if at_new is not None else None
        if d_old is not None and (
            d_new is None or d_old < d_new or (d_old == d_new and len(h["old"]) >= len(h["new"]))
        ):
            state, at, block, header_at = "pristine", at_old, h["old"], old_at
        elif d_new is not None:
            state, at, block, header_at = "patched", at_new, h["new"], new_at
        else:
            state, at, block, header_at = "missing", None, [], old_at
        if at is not None:
            delta = at - header_at
            frozen = at + len(block) - suf
        out.append(
            {
                "state": state,
                "at_old": at if state == "pristine" else None,
                "at_new": at if state == "patched" else None,
            }
        )
    return out


def classify(lines: list[str], hunks: list[dict]) -> dict:
    """Per hunk: its state and where its block is. The whole file: pristine / patched / drifted."""
    text = _Text(lines)
    shapes = _shapes(hunks)
    fwd, fwd_moved = _place(text, hunks, shapes, "old")
    rev, rev_moved = _place(text, hunks, shapes, "new")
    fwd_ok = all(p is not None for p in fwd)
    rev_ok = all(p is not None for p in rev)
    overall = _whole_reading(hunks, fwd_ok, rev_ok, fwd_moved, rev_moved)
    per: list[dict[str, Any]]
    if overall is not None:
        per = _uniform(overall, fwd, rev)
    else:
        per = _each_hunk(text, hunks, shapes)
    states = _with_expected(hunks, shapes, per)
    if overall is None:
        overall = _verdict_of(states)
    # `both`: the other reading fitted too; the node's record of what it wrote can settle that.
    # `reverse_at`: where patch -R would place each new block when every one fits (to reverse a file
    # the record says is patched although the pristine reading won the tie).
    return {
        "overall": overall,
        "hunks": states,
        "both": fwd_ok and rev_ok,
        "reverse_at": rev if rev_ok else None,
    }


def _whole_reading(
    hunks: list[dict], fwd_ok: bool, rev_ok: bool, fwd_moved: int, rev_moved: int
) -> str | None:
    """The reading that places every hunk ("pristine" or "patched"); None when neither does."""
    if not rev_ok:
        return "pristine" if fwd_ok else None
    if not fwd_ok:
        return "patched"
    # Both readings fit (repeated code elsewhere in the file): the one whose hunks sit nearer their
    # expected places wins. On a tie both forms sit at the very same place (a line added to or
    # deleted from a run of equal lines, beyond what the context shows), and patch(1) would apply:
    # so does the verdict, and the node's record of the file it wrote is what tells a second run it
    # is done. Empty old blocks (a file created from nothing) fit anywhere and prove nothing.
    if fwd_moved != rev_moved:
        return "pristine" if fwd_moved < rev_moved else "patched"
    return "pristine" if any(h["old"] for h in hunks) else "patched"


def _uniform(overall: str, fwd: list[int | None], rev: list[int | None]) -> list[dict[str, Any]]:
    """Every hunk in the one state the whole reading found, at the place that reading gave it."""
    pristine = overall == "pristine"
    return [
        {"state": overall, "at_old": a if pristine else None, "at_new": None if pristine else b}
        for a, b in zip(fwd, rev)
    ]


def _with_expected(hunks: list[dict], shapes: list[Shape], per: list[dict]) -> list[dict]:
    """Each hunk's state with its index, header and expected line (its header's line plus the
    offset the hunk before it was found at)."""
    states = []
    offset = 0
    for h, shape, s in zip(hunks, shapes, per):
        expected = shape[0] + offset
        states.append({"index": h["index"], "header": h["header"], "expected": expected, **s})
        if s["at_old"] is not None:
            offset = s["at_old"] - shape[0]
        elif s["at_new"] is not None:
            offset = s["at_new"] - shape[1]
    return states


def _verdict_of(states: list[dict]) -> str:
    """The whole file, from hunks judged one by one: one shared state, else drifted."""
    kinds = {s["state"] for s in states}
    if len(kinds) == 1 and kinds <= {"pristine", "patched"}:
        return kinds.pop()
    return "drifted"


def closest_window(lines: list[str], block: list[str], expected: int) -> int:
    """Where the file looks most like `block`, to show an operator what drifted."""
    return _closest(lines, block, expected)[0]


def _closest(lines: list[str], block: list[str], expected: int) -> tuple[int, int]:
    """(where the file looks most like `block`, how many of its lines match there)."""
    stripped = [bare(x) for x in lines]
    n = len(block)
    best, best_score = max(0, min(expected, len(lines) - 1)), -1
    for p in range(max(1, len(lines) - n + 1)):
        score = sum(1 for k in range(min(n, len(lines) - p)) if stripped[p + k] == block[k])
        if score > best_score or (score == best_score and abs(p - expected) < abs(best - expected)):
            best, best_score = p, score
    return best, best_score


def drift_report(lines: list[str], hunks: list[dict], cls: dict) -> list[dict]:
    """Per hunk that is neither in its old nor its new form: where, and its first line that differs,
    against the form the file is nearer to (a hand edit inside a patched hunk is told against the
    patched lines, so the report names the edited line, whichever way the file is being moved)."""
    out = [
        _drift_item(lines, h, s)
        for h, s in zip(hunks, cls["hunks"])
        if s["state"] not in ("pristine", "patched")
    ]
    applied = [s["index"] + 1 for s in cls["hunks"] if s["state"] == "patched"]
    pending = [s["index"] + 1 for s in cls["hunks"] if s["state"] == "pristine"]
    if not out and applied and pending:
        out.append(
            {
                "hunk": None,
                "state": "partial",
                "message": f"partially patched: hunks {applied} applied, hunks {pending} not",
            }
        )
    return out


def _drift_item(lines: list[str], h: dict, s: dict) -> dict:
    """One drifted hunk: the block it is nearer to, what the file has there, and the first line
    that differs (or, when none does, why the block there was not placed)."""
    p, block = _nearer_form(lines, h, s["expected"])
    found = [bare(x) for x in lines[p : p + len(block)]]
    item = {
        "hunk": s["index"] + 1,
        "header": h["header"],
        "state": s["state"],
        "near_line": p + 1,
        "expected": block,
        "found": found,
    }
    mismatch = first_difference(block, found)
    if mismatch is None:
        item["message"] = _why_not_there(h, s, p)
        return item
    item["first_difference"] = {
        "line": p + mismatch + 1,
        "expected": block[mismatch],
        "found": found[mismatch] if mismatch < len(found) else "<end of file>",
    }
    return item


def _nearer_form(lines: list[str], h: dict, expected: int) -> tuple[int, list[str]]:
    """Where the file looks most like the hunk's old or new block, and that block (the old one on
    a tie)."""
    p, score = _closest(lines, h["old"], expected)
    if h["new"]:
        q, other = _closest(lines, h["new"], expected)
        if other > score:
            return q, h["new"]
    return p, h["old"]


def first_difference(block: list[str], found: list[str]) -> int | None:
    """The index of the first line of `block` that `found` lacks or has otherwise; None: all
    there."""
    for k, line in enumerate(block):
        if k >= len(found) or found[k] != line:
            return k
    return None


def _why_not_there(h: dict, s: dict, p: int) -> str:
    """The old block is in the file, yet the hunk was not placed: say which of patch(1)'s rules said
    no."""
    pre, suf = _context(h)
    where = f"hunk {s['index'] + 1}'s old block is at line {p + 1}"
    if pre != suf and (suf < pre or h["old_start"] <= 1):
        edge = "top" if pre < suf else "end"
        return (
            f"{where}, but with {pre} leading and {suf} trailing context lines patch(1) only "
            f"applies it at the {edge} of the file; give "
            f"it {max(pre, suf)} context lines on both sides"
        )
    return (
        f"{where}, but before (or inside) what an earlier hunk changes; the hunks are out of order"
    )


def apply_hunks(lines: list[str], hunks: list[dict], cls: dict, reverse: bool = False) -> str:
    """The file with every hunk applied (or reversed) where `classify` placed it. Context lines are
    kept as the file has them; changed lines get the file's line ending."""
    key = "at_new" if reverse else "at_old"
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    out: list[str] = []
    cursor = 0
    for h, (_, _, pre, suf), s in zip(hunks, _shapes(hunks), cls["hunks"]):
        src, dst = (h["new"], h["old"]) if reverse else (h["old"], h["new"])
        at = s.get(key)
        if at is None:
            raise ValueError(
                f"hunk {h['index'] + 1} is not placed for {'rollback' if reverse else 'patching'} "
                f"(state {s['state']})"
            )
        start, end = at + pre, at + len(src) - suf
        if start < cursor:
            raise ValueError(f"hunk {h['index'] + 1} overlaps the hunk before it")
        out.extend(lines[cursor:start])
        added = [x + newline for x in dst[pre : len(dst) - suf]]
        _end_lines(out, added, lines[start:end], newline)
        out.extend(added)
        cursor = end
    out.extend(lines[cursor:])
    return "".join(out)


def _end_lines(out: list[str], added: list[str], removed: list[str], newline: str) -> None:
    """patch(1)'s handling of a file whose last line has no newline, for the lines a hunk adds."""
    if not added:
        return
    if removed and not removed[-1].endswith("\n"):
        # the file's last line had no newline: neither has its successor
        added[-1] = added[-1][: -len(newline)]
    elif out and not out[-1].endswith("\n"):
        # appending after a last line without newline: patch(1) ends that line first
        out[-1] += newline
