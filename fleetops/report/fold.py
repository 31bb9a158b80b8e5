"""Folding: hosts that answered the same are shown once, under a host-range header (`lab[01-03,07]
(4)`).

A result is drawn as lines of (text, style) segments with a label slot where the host's name goes
(richload.markup fills it in). Two results fold when their drawn text is the same once each host's
own name and address are replaced by a placeholder, and their status and exit code match: what the
operator would read is then identical but for who said it. `odd_ones_out()` diffs each minority
group against the majority. Stdlib only (the benchmark and the unit tests use it without a
terminal).
"""

from __future__ import annotations

import difflib
import functools
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..plans.hostrange import fold as fold_names
from ..plans.hostrange import header, natural_key
from ..results import Result, Status
from ..results.adhoc import CommandOutput

Segment = tuple[str, str]  # (text, rich style or "")
Line = list[Segment]
LABEL = "\0host\0"  # the label slot: richload.markup writes the host name or the group header there
PLACEHOLDER = "{host}"  # stands for each host's own name inside folded text
ADDRESS_PLACEHOLDER = "{addr}"  # and for its own address (address:port)
# folding is on by default from this many hosts: two that answered alike print once
FOLD_MIN_HOSTS = 2
# The style of a segment that is a command to copy (a `next:` command): richload.markup draws it
# bold. In a folded group its `-H {host}` becomes the group's own hosts (`-H 'lab[01-03]'`), so it
# runs as printed.
COMMAND = "command"
# A duration inside a message ("import ... ok (1.59s; ...)"): it differs on every host and run, so
# hosts fold without it and a folded group shows the range its members took (0.04-1.59s).
DURATION = re.compile(r"(?<![\w.])([0-9]+(?:\.[0-9]+)?)s(?![\w])")


@dataclass
class Identity:
    """What counts as a host's own name in its text: its inventory name, its address:port, and its
    address when no other host of the run shares it (127.0.0.1 for every lab node is nobody's
    own)."""

    name: str
    address: str = ""
    port: int = 0
    address_unique: bool = False
    _words: list[str] | None = field(default=None, repr=False, compare=False)

    def words(self) -> list[str]:
        """The host's own words, longest first (a longer word wins where two start at the same
        place)."""
        if self._words is not None:
            return self._words
        words = [self.name]
        if self.address and self.port:
            words.append(f"{self.address}:{self.port}")
        if self.address and self.address_unique and self.address != self.name:
            words.append(self.address)
        self._words = sorted(set(words), key=len, reverse=True)
        return self._words

    def replace(self, text: str) -> str:
        """Each of the host's words that stands alone in text (not part of a longer name, address or
        file name: `lab1` is not in `lab10`, `x.lab1` or `lab1.yaml`) → its placeholder; leftmost
        first, then longest, as a regex alternation would. Plain string search: a compiled pattern
        per host cost ~0.25 ms of client CPU per host at N=128, and most text never names its host
        at all."""
        for word in self.words():
            if word in text:
                break
        else:
            return text  # the common case, decided in C
        out: list[str] = []
        done = 0
        for start, end, word in self._hits(text):
            if start < done:
                continue  # inside a word already replaced
            out += [text[done:start], PLACEHOLDER if word == self.name else ADDRESS_PLACEHOLDER]
            done = end
        return "".join(out) + text[done:] if out else text

    def replace_in_command(self, text: str) -> str:
        """A command's `-H <this host>` → `-H {host}`; any other mention of the host stays as it is,
        so two hosts fold only when their commands differ by the -H word alone."""
        word = f"-H {shlex.quote(self.name)}"
        start = text.find(word)
        while start != -1:
            end = start + len(word)
            if end == len(text) or text[end] == " ":
                return f"{text[:start]}-H {PLACEHOLDER}{text[end:]}"
            start = text.find(word, end)
        return text

    def _hits(self, text: str) -> list[tuple[int, int, str]]:
        hits = []
        for word in self.words():
            start = text.find(word)
            while start != -1:
                end = start + len(word)
                if _stands_alone(text, start, end):
                    hits.append((start, end, word))
                start = text.find(word, start + 1)
        return sorted(hits, key=lambda hit: (hit[0], hit[0] - hit[1]))


_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def _stands_alone(text: str, start: int, end: int) -> bool:
    """Not preceded by a name character or a dot; not followed by a name character, nor by a dot
    that goes on into one (a sentence's full stop still ends the word)."""
    if start > 0 and (text[start - 1] in _NAME_CHARS or text[start - 1] == "."):
        return False
    if end < len(text):
        after = text[end]
        if after in _NAME_CHARS:
            return False
        if (
            after == "."
            and end + 1 < len(text)
            and text[end + 1] in _NAME_CHARS
            and text[end + 1] not in "_-"
        ):
            return False
    return True


def identities(hosts: Iterable[tuple[str, str, int]]) -> dict[str, Identity]:
    """(name, address, port) per host → Identity, with address_unique worked out over the run."""
    hosts = list(hosts)
    counts: dict[str, int] = {}
    for _, address, _ in hosts:
        counts[address] = counts.get(address, 0) + 1
    return {
        name: Identity(name, address, port, counts.get(address, 0) == 1)
        for name, address, port in hosts
    }


@dataclass
class Drawn:
    """One result drawn: its lines (label slot unfilled), the table it prints first, its fold
    key."""

    result: Result
    lines: list[Line]
    table: dict | None
    folded_lines: list[Line] = field(default_factory=list)  # own name → placeholder
    key: tuple = ()
    folded_rows: tuple = ()  # the table's rows with the placeholder
    durations: list[float] = field(default_factory=list)  # every duration in the text, in order


@dataclass
class Group:
    task: str
    hosts: list[str]
    status: Status
    drawn: Drawn  # the first member's drawing stands for all
    durations: list[list[float]] = field(default_factory=list)  # per position: each member's value

    @functools.cached_property
    def header(self) -> str:
        # Read for every line the group prints; group() has settled the members by then.
        return header(self.hosts)

    def lines(self) -> list[Line]:
        """The group's lines: the host's own text when alone; when folded, the placeholder text with
        each duration as the range the members took."""
        if len(self.hosts) == 1:
            return self.drawn.lines
        # never short, whatever the text
        spans = iter([_span(values) for values in self.durations] + ["?s"] * 1000)
        hosts = shlex.quote(fold_names(self.hosts))
        return [
            [
                (
                    text.replace(f"-H {PLACEHOLDER}", f"-H {hosts}")
                    if style == COMMAND
                    else text
                    if text == LABEL
                    else DURATION.sub(lambda _m: next(spans), text),
                    style,
                )
                for text, style in line
            ]
            for line in self.drawn.folded_lines
        ]

    def plain(self) -> list[str]:
        """The group's text with the placeholders, for diffs: two groups differ in what they said,
        never in who said it."""
        # a command is the group's own, even in a diff: it runs
        hosts = shlex.quote(fold_names(self.hosts))
        text = [
            "".join(
                PLACEHOLDER
                if seg == LABEL
                else seg.replace(f"-H {PLACEHOLDER}", f"-H {hosts}")
                if style == COMMAND
                else DURATION.sub("{t}s", seg)
                for seg, style in line
            )
            for line in self.drawn.folded_lines
        ]
        table = self.drawn.table
        if table:
            text += [
                " | ".join(str(c) for c in table["columns"]),
                *(" | ".join(str(v) for v in row) for row in self.drawn.folded_rows),
            ]
        return text


def plain(line: Line, label: str) -> str:
    return "".join(label if text == LABEL else text for text, _ in line)


def substitute(lines: list[Line], identity: Identity | None) -> list[Line]:
    if identity is None:
        return lines
    whole = "\0".join(text for line in lines for text, _ in line)
    if not any(word in whole for word in identity.words()):
        return lines  # most results never name their host: one search instead of one per segment
    return [
        [
            (
                text
                if text == LABEL
                else identity.replace_in_command(text)
                if style == COMMAND
                else identity.replace(text),
                style,
            )
            for text, style in line
        ]
        for line in lines
    ]


def draw_all(
    results: list[Result],
    draw: Callable[[Result], tuple[list[Line], dict | None]],
    who: dict[str, Identity],
) -> list[Drawn]:
    return [_drawn(r, draw, who.get(r.host) or Identity(r.host)) for r in results]


def _drawn(
    r: Result, draw: Callable[[Result], tuple[list[Line], dict | None]], ident: Identity
) -> Drawn:
    """One result drawn, with what it is grouped by: its lines with its own names as
    placeholders and durations as {t}, its table likewise, its task, status and exit status."""
    lines, table = draw(r)
    folded = substitute(lines, ident)
    table_key: tuple = ()
    if table:
        table_key = tuple(tuple(ident.replace(str(v)) for v in row) for row in table["rows"])
    # `run`: same exit, one group
    code = r.payload.exit_code if isinstance(r.payload, CommandOutput) else None
    key = (r.task, r.status.value, code, _comparable(folded), table_key)
    return Drawn(r, lines, table, folded, key, table_key, _durations(folded))


def _durations(folded: list[Line]) -> list[float]:
    """The durations said outside commands, in order: a group shows their span."""
    return [
        float(m[1])
        for line in folded
        for seg, style in line
        if seg != LABEL and style != COMMAND
        for m in DURATION.finditer(seg)
    ]


def _comparable(folded: list[Line]) -> tuple[str, ...]:
    """The lines as compared between hosts. A command is compared as written: `sleep 5s` and
    `sleep 6s` are two commands, not one duration."""
    return tuple(
        "".join(
            seg if style == COMMAND else DURATION.sub("{t}s", seg)
            for seg, style in line
            if seg != LABEL
        )
        for line in folded
    )


def group(drawn: list[Drawn]) -> list[Group]:
    """Groups per task (tasks in the order they first answered), the largest group of a task first,
    then by the first host's name. A group's hosts are in natural order."""
    by_key: dict[tuple, Group] = {}
    task_order: dict[str, int] = {}
    for d in drawn:
        task_order.setdefault(d.result.task, len(task_order))
        g = by_key.get(d.key)
        if g is None:
            by_key[d.key] = Group(
                d.result.task, [d.result.host], d.result.status, d, [[v] for v in d.durations]
            )
        elif d.result.host not in g.hosts:
            g.hosts.append(d.result.host)
            for values, v in zip(g.durations, d.durations):
                values.append(v)
    groups = list(by_key.values())
    for g in groups:
        g.hosts.sort(key=natural_key)
    groups.sort(key=lambda g: (task_order[g.task], -len(g.hosts), natural_key(g.hosts[0])))
    return groups


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:g}s" if low == high else f"{low:g}-{high:g}s"


def odd_ones_out(groups: list[Group]) -> list[tuple[str, Group | None, list[str]]]:
    """Per task with more than one group: (task, the majority group, unified diff lines) for each
    minority group, majority text as `---`, the minority's as `+++`. A task whose hosts all agree
    gives one entry (task, None, [a sentence]) so the operator sees that it was looked at."""
    out: list[tuple[str, Group | None, list[str]]] = []
    tasks: dict[str, list[Group]] = {}
    for g in groups:
        tasks.setdefault(g.task, []).append(g)
    for task, members in tasks.items():
        majority = members[0]  # group() put the largest first
        if len(members) == 1:
            out.append((task, None, [f"{task}: all {len(majority.hosts)} hosts answered the same"]))
            continue
        for minority in members[1:]:
            diff = list(
                difflib.unified_diff(
                    majority.plain(),
                    minority.plain(),
                    fromfile=majority.header,
                    tofile=minority.header,
                    lineterm="",
                )
            )
            out.append((task, minority, diff))
    return out


def host_outcome(statuses: Iterable[Status]) -> Status:
    """A host's outcome over its results: unreachable, else failed, else changed, else ok; skipped
    only when every step was skipped."""
    seen = set(statuses)
    for status in (Status.UNREACHABLE, Status.FAILED, Status.CHANGED, Status.OK):
        if status in seen:
            return status
    return Status.SKIPPED


def outcomes(results: list[Result]) -> dict[str, Status]:
    per_host: dict[str, list[Status]] = {}
    for r in results:
        per_host.setdefault(r.host, []).append(r.status)
    return {host: host_outcome(s) for host, s in per_host.items()}


def summary_line(results: list[Result], seconds: float | None) -> str:
    """`32 hosts: 29 ok, 2 changed, 1 failed, 0 unreachable in 4.1 s` (skipped named only when some
    were)."""
    counts = {s: 0 for s in Status}
    for status in outcomes(results).values():
        counts[status] += 1
    n = sum(counts.values())
    parts = [
        f"{counts[s]} {s.value}"
        for s in (Status.OK, Status.CHANGED, Status.FAILED, Status.UNREACHABLE)
    ]
    if counts[Status.SKIPPED]:
        parts.append(f"{counts[Status.SKIPPED]} skipped")
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    return f"{n} host{'' if n == 1 else 's'}: {', '.join(parts)}{took}"


def recap_groups(recap: dict[str, dict[str, int]]) -> list[tuple[str, dict[str, int]]]:
    """The recap folded: hosts with the same counts share one row, headed by their range."""
    rows: dict[tuple, list[str]] = {}
    for host, row in recap.items():
        rows.setdefault(tuple(sorted(row.items())), []).append(host)
    out = [(header(hosts), dict(key)) for key, hosts in rows.items()]
    order = [Status.UNREACHABLE, Status.FAILED, Status.CHANGED, Status.OK, Status.SKIPPED]
    out.sort(key=lambda item: tuple(-item[1].get(s.value, 0) for s in order))
    return out
