"""Host ranges, the compact notation ClusterShell and pdsh use: `gpu[01-32]`, `lab[01-03,07]`.

`fold()` writes a list of names that way (the headers of folded output, the recap, the re-run line) and
`expand()` reads it back (`-H 'gpu[01-32]'`, `--limit 'gpu[01-08]'`), so what fleetops prints can be pasted
back as it is. A bracket is a range only when it holds a `-` between digits or a `,`; `gpu[12]` stays the
fnmatch glob it always was (gpu1 or gpu2). Pure functions, no inventory.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# prefix [ranges ] suffix; ranges: digits, or digits-digits, comma separated
_RANGE = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<body>[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*)\]"
                    r"(?P<suffix>[^\[\]]*)$")
_TAIL_NUMBER = re.compile(r"^(?P<prefix>.*?)(?P<num>[0-9]+)(?P<suffix>[^0-9]*)$")
MAX_EXPANSION = 100_000  # a typo such as gpu[1-99999999] is refused, not expanded


class RangeError(ValueError):
    pass


def is_range(word: str) -> bool:
    """`gpu[01-32]` or `lab[01,07]`: range notation (a `-` or `,` inside the brackets), not a glob."""
    match = _RANGE.match(word)
    return bool(match) and ("-" in match["body"] or "," in match["body"])


def expand(word: str) -> list[str]:
    """`lab[01-03,07]` → lab01 lab02 lab03 lab07 (zero padding as written: `[1-10]` gives lab1..lab10,
    `[01-10]` gives lab01..lab10). A word without range notation is returned as it is.
    Raises RangeError for a reversed or oversized range."""
    match = _RANGE.match(word)
    if not match or not is_range(word):
        return [word]
    out: list[str] = []
    for part in match["body"].split(","):
        low, _, high = part.partition("-")
        high = high or low
        if int(high) < int(low):
            raise RangeError(f"host range {word!r}: {part} goes downwards; write [{high}-{low}]")
        width = len(low) if low.startswith("0") and len(low) > 1 else 0
        if len(out) + int(high) - int(low) + 1 > MAX_EXPANSION:
            raise RangeError(f"host range {word!r} names more than {MAX_EXPANSION} hosts")
        out.extend(f"{match['prefix']}{n:0{width}d}{match['suffix']}" for n in range(int(low), int(high) + 1))
    return list(dict.fromkeys(out))


def split_words(text: str) -> list[str]:
    """Split a -H / --limit value on the commas that are not inside brackets: `lab[01-03,07],gpu01`
    → [`lab[01-03,07]`, `gpu01`]."""
    words, depth, current = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            words.append("".join(current))
            current = []
        else:
            current.append(ch)
    words.append("".join(current))
    return [w.strip() for w in words if w.strip()]


def natural_key(name: str) -> tuple:
    """lab2 before lab10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"([0-9]+)", name))


def fold(names: Iterable[str]) -> str:
    """Names → the shortest range notation, comma separated: lab01 lab02 lab03 lab07 → `lab[01-03,07]`;
    names without a number, or alone with their prefix, stay as they are. Sorted naturally; each once."""
    found: dict[tuple[str, str], list[str]] = {}
    plain: list[str] = []
    for name in dict.fromkeys(names):
        match = _TAIL_NUMBER.match(name)
        if not match or "[" in name or "]" in name:
            plain.append(name)
            continue
        found.setdefault((match["prefix"], match["suffix"]), []).append(match["num"])
    # lab08 and lab10 belong together: a number without a leading zero fits any padding up to its length.
    groups: dict[tuple[str, str, int], list[int]] = {}
    for (prefix, suffix), nums in found.items():
        widths = sorted({len(n) for n in nums if n.startswith("0") and len(n) > 1})
        for n in nums:
            padded = n.startswith("0") and len(n) > 1
            width = len(n) if padded else max([w for w in widths if w <= len(n)], default=0)
            groups.setdefault((prefix, suffix, width), []).append(int(n))
    parts: list[tuple[tuple, str]] = []
    for (prefix, suffix, width), numbers in groups.items():
        numbers = sorted(set(numbers))
        if len(numbers) == 1:
            text = f"{prefix}{numbers[0]:0{width}d}{suffix}"
            parts.append((natural_key(text), text))
            continue
        runs: list[str] = []
        start = prev = numbers[0]
        for n in [*numbers[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            runs.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
            if n is not None:
                start = prev = n
        text = f"{prefix}[{','.join(runs)}]{suffix}"
        parts.append((natural_key(f"{prefix}{numbers[0]:0{width}d}{suffix}"), text))
    parts.extend((natural_key(p), p) for p in plain)
    return ",".join(text for _, text in sorted(parts))


def header(names: Iterable[str]) -> str:
    """The header of a folded group: `lab[01-03,07] (4)`; one host is just its name."""
    names = list(dict.fromkeys(names))
    return names[0] if len(names) == 1 else f"{fold(names)} ({len(names)})"
