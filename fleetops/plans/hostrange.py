"""Host ranges, the compact notation ClusterShell and pdsh use: `gpu[01-32]`, `lab[01-03,07]`,
`node[3-16/2]`, `r[1-2]n[1-4]`.

`fold()` writes a list of names that way (the headers of folded output, the recap, the re-run line)
and `expand()` reads it back (`-H 'gpu[01-32]'`, `--limit 'gpu[01-08]'`), so what fleetops prints
can be pasted back as it is. A word is read as ClusterShell's NodeSet reads it
(tests/test_hostrange_nodeset_units.py compares the two): several brackets give every combination,
`/N` steps, digits written beside a bracket belong to its numbers, a padded bound needs a bound of
the same width, and whatever NodeSet refuses is refused (RangeError), never read as a filename
wildcard that would select other hosts. Two readings are fleetops' own: a bracket of digits alone
(`gpu[12]`) stays the fnmatch glob it always was (gpu1 or gpu2), and negative numbers name no host.
Pure functions, no inventory.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

_BRACKET = re.compile(r"\[([^\[\]]*)\]")
_RANGE_BODY = re.compile(r"[0-9,/\s-]*")
# `n[1-3`: a range whose bracket was not closed
_LEFT_OPEN = re.compile(r"\[[0-9,/\s-]*[-,/][0-9,/\s-]*$")
_TAIL_NUMBER = re.compile(r"^(?P<prefix>.*?)(?P<num>[0-9]+)(?P<suffix>[^0-9]*)$")
_DIGITS = "0123456789"
MAX_EXPANSION = 100_000  # a typo such as gpu[1-99999999] is refused, not expanded
NOTATION = "write ranges as gpu[01-16], node[3-16/2] or r[1-2]n[1-4]"


class RangeError(ValueError):
    pass


def is_range(word: str) -> bool:
    """`gpu[01-32]`, `lab[01,07]`, `node[3-16/2]`, `n[]`: a bracket of numbers with `-`, `,` or `/`
    (or nothing) makes the word range notation, to expand or refuse; `gpu[12]` and `lab[a-c]` are
    globs."""
    for body in _BRACKET.findall(word):
        if _RANGE_BODY.fullmatch(body) and (not body.strip() or any(c in body for c in "-,/")):
            return True
    return bool(_LEFT_OPEN.search(word))


def expand(word: str) -> list[str]:
    """`lab[01-03,07]` → lab01 lab02 lab03 lab07 (zero padding as written: `[1-10]` gives
    lab1..lab10, `[01-10]` gives lab01..lab10); `r[1-2]n[1-2]` → r1n1 r1n2 r2n1 r2n2. A word without
    range notation is returned as it is. Raises RangeError, one line naming the word, for what
    NodeSet refuses (an empty number, a bound of another width than a padded one, a step without a
    range, a bracket left open...), for negative numbers, and for more than MAX_EXPANSION names."""
    if not is_range(word):
        return [word]
    texts, bodies = _split(word)
    numbers: list[list[str]] = []
    total = 1
    for i, body in enumerate(bodies):
        # NodeSet's order: digits after the bracket join its numbers first, then the digits before
        # it.
        after = texts[i + 1].lstrip(_DIGITS)
        trailing = texts[i + 1][: len(texts[i + 1]) - len(after)]
        if trailing:
            body = _with_trailing(word, body, trailing)
        if i + 1 < len(bodies) and not after:
            raise RangeError(
                f"host range {word!r}: a bracket follows another with no letter between them; "
                f"{NOTATION}"
            )
        texts[i + 1] = after
        before = texts[i].rstrip(_DIGITS)
        leading = texts[i][len(before) :]
        if leading:
            body = ",".join(
                "-".join(leading + bound for bound in run.split("-"))
                for run in _contiguous(_numbers(word, body))
            )
        texts[i] = before
        found = list(dict.fromkeys(_numbers(word, body)))
        total *= len(found)
        if total > MAX_EXPANSION:
            raise RangeError(f"host range {word!r} names more than {MAX_EXPANSION} hosts")
        numbers.append(found)
    out = [
        "".join(itertools.chain.from_iterable(zip(texts, (*combo, ""))))
        for combo in itertools.product(*numbers)
    ]
    return list(dict.fromkeys(out))


def _split(word: str) -> tuple[list[str], list[str]]:
    """`r[1-2]n[3]x` → texts [r, n, x], bodies [1-2, 3]; RangeError for a bracket left open, closed
    twice or opened inside another."""
    texts, bodies, rest = [], [], word
    while "[" in rest:
        before, rest = rest.split("[", 1)
        body, closed, after = rest.partition("]")
        if "]" in before or not closed or "[" in body:
            raise RangeError(
                f"host range {word!r}: a bracket is not closed where it should be; {NOTATION}"
            )
        texts.append(before)
        bodies.append(body)
        rest = after
    if "]" in rest:
        raise RangeError(
            f"host range {word!r}: a bracket is closed that was not opened; {NOTATION}"
        )
    texts.append(rest)
    return texts, bodies


def _with_trailing(word: str, body: str, digits: str) -> str:
    """`n[1-2]0`: digits after the bracket end each number, so a range of them steps by 10 (n10,
    n20)."""
    if "/" in body:
        raise RangeError(f"host range {word!r}: digits after a range with a step; {NOTATION}")
    shift = "/1" + "0" * len(digits)
    return ",".join(
        "-".join(bound + digits for bound in element.split("-")) + (shift if "-" in element else "")
        for element in body.split(",")
    )


def _numbers(word: str, body: str) -> list[str]:
    """One bracket's numbers as written (`08-10/2` → 08 10), in the order written."""
    out: list[str] = []
    for element in body.split(","):
        low, high, step = _bounds(word, element.strip())
        if len(out) + (int(high) - int(low)) // step + 1 > MAX_EXPANSION:
            raise RangeError(f"host range {word!r} names more than {MAX_EXPANSION} hosts")
        width = len(low) if len(low) > 1 and low.startswith("0") else 0
        out.extend(f"{n:0{width}d}" for n in range(int(low), int(high) + 1, step))
    return out


def _bounds(word: str, element: str) -> tuple[str, str, int]:
    """One element of a bracket (`08-10/2`, `7`), checked: its low and high bounds as written and
    its step."""
    if not element:
        raise RangeError(
            f"host range {word!r}: an empty number between brackets or commas; {NOTATION}"
        )
    base, slash, step_text = element.partition("/")
    if base.strip().startswith("-") or base.count("-") > 1:
        raise RangeError(
            f"host range {word!r}: {element!r} is a negative number, which names no host; "
            f"{NOTATION}"
        )
    low, dash, high = (part.strip() for part in base.partition("-"))
    high = high if dash else low
    step_text = step_text.strip()
    numbers = (low, high, step_text) if slash else (low, high)
    if not all(part.isascii() and part.isdigit() for part in numbers):
        raise RangeError(
            f"host range {word!r}: {element!r} is not a number or a range of numbers; {NOTATION}"
        )
    step = int(step_text) if slash else 1
    if step != 1 and not dash:
        raise RangeError(
            f"host range {word!r}: {element!r} has a step but no range; write [1-16/2]"
        )
    if step < 1:
        raise RangeError(f"host range {word!r}: {element!r} has a step below 1")
    _check_widths_and_order(word, element, low, high)
    return low, high, step


def _check_widths_and_order(word: str, element: str, low: str, high: str) -> None:
    """Both bounds padded alike, and the low one first."""
    # NodeSet's rule: a high bound of zeros only (`[0-00]`) is not padded; a low one (`[00-10]`) is.
    padded = (len(low) > 1 and low.startswith("0")) or (int(high) != 0 and high.startswith("0"))
    if padded and len(low) != len(high):
        raise RangeError(
            f"host range {word!r}: {element!r} pads one bound and not the other (padding "
            f"length mismatch): write both with the same width, [{low.zfill(len(high))}-"
            f"{high.zfill(len(low))}]"
        )
    if int(high) < int(low):
        raise RangeError(f"host range {word!r}: {element!r} goes downwards; write [{high}-{low}]")


def _contiguous(numbers: list[str]) -> list[str]:
    """Numbers as NodeSet folds them before it puts the digits written before a bracket in front:
    sorted by width then value, runs of consecutive numbers that keep their padding (`8,9,10` →
    8-10; `08,09,10` → 08-10)."""
    runs: list[list[str]] = []
    for number in sorted(set(numbers), key=lambda n: (len(n), n)):
        padded = len(number) > 1 and number.startswith("0")
        if runs:
            first, last = runs[-1][0], runs[-1][-1]
            first_padded = len(first) > 1 and first.startswith("0")
            fits = len(number) == len(first) if first_padded else not padded
            if fits and int(number) == int(last) + 1:
                runs[-1].append(number)
                continue
        runs.append([number])
    return [run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]


def split_words(text: str) -> list[str]:
    """Split a -H / --limit value on the commas that are not inside brackets: `lab[01-03,07],gpu01`
    → [`lab[01-03,07]`, `gpu01`]."""
    words: list[str] = []
    current: list[str] = []
    depth = 0
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


def natural_key(name: str) -> tuple[int | str, ...]:
    """lab2 before lab10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"([0-9]+)", name))


def fold(names: Iterable[str]) -> str:
    """Names → the shortest range notation, comma separated: lab01 lab02 lab03 lab07 →
    `lab[01-03,07]`; names without a number, or alone with their prefix, stay as they are. Sorted
    naturally; each once."""
    found: dict[tuple[str, str], list[str]] = {}
    plain: list[str] = []
    for name in dict.fromkeys(names):
        match = _TAIL_NUMBER.match(name)
        if not match or "[" in name or "]" in name:
            plain.append(name)
            continue
        found.setdefault((match["prefix"], match["suffix"]), []).append(match["num"])
    parts: list[tuple[tuple[int | str, ...], str]] = []
    for (prefix, suffix, width), numbers in _by_width(found).items():
        numbers = sorted(set(numbers))
        first = f"{prefix}{numbers[0]:0{width}d}{suffix}"
        if len(numbers) == 1:
            parts.append((natural_key(first), first))
        else:
            parts.append(
                (natural_key(first), f"{prefix}[{','.join(_runs(numbers, width))}]{suffix}")
            )
    parts.extend((natural_key(p), p) for p in plain)
    return ",".join(text for _, text in sorted(parts))


def _by_width(found: dict[tuple[str, str], list[str]]) -> dict[tuple[str, str, int], list[int]]:
    """The numbers of each prefix and suffix, grouped by the width they are padded to. lab08 and
    lab10 belong together: a number without a leading zero fits any padding up to its length."""
    groups: dict[tuple[str, str, int], list[int]] = {}
    for (prefix, suffix), nums in found.items():
        widths = sorted({len(n) for n in nums if n.startswith("0") and len(n) > 1})
        for n in nums:
            padded = n.startswith("0") and len(n) > 1
            width = len(n) if padded else max([w for w in widths if w <= len(n)], default=0)
            groups.setdefault((prefix, suffix, width), []).append(int(n))
    return groups


def _runs(numbers: list[int], width: int) -> list[str]:
    """Sorted numbers as runs of consecutive ones: 1 2 3 7 → `01-03`, `07` (width 2)."""
    runs: list[str] = []
    start = prev = numbers[0]
    for number in [*numbers[1:], None]:
        if number is not None and number == prev + 1:
            prev = number
            continue
        runs.append(
            f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}"
        )
        if number is not None:
            start = prev = number
    return runs


def header(names: Iterable[str]) -> str:
    """The header of a folded group: `lab[01-03,07] (4)`; one host is just its name."""
    names = list(dict.fromkeys(names))
    return names[0] if len(names) == 1 else f"{fold(names)} ({len(names)})"
