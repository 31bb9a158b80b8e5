"""A result as the lines the operator reads: (text, style) segments with the host's name left as the
LABEL slot (folding fills in a group's header), and the table printed first, if any. Plain data, no
rich: what the verdict, evidence, node notes and `next:` lines say, short unless verbose."""

from __future__ import annotations

from typing import Any

from ..redaction import shown
from ..results import Item, Next, Result, Severity, Status, shape_of
from ..results.adhoc import CommandOutput
from ..results.checks import Verification
from .fold import COMMAND, LABEL, Line, Segment

STYLE = {
    Status.OK: "green",
    Status.CHANGED: "yellow",
    Status.FAILED: "bold red",
    Status.UNREACHABLE: "bold magenta",
    Status.SKIPPED: "cyan",
}
VERDICT_STYLE: dict[str | None, str] = {
    Severity.CRITICAL: "bold red",
    Severity.UNKNOWN: "bold magenta",
    Severity.WARN: "yellow",
    Severity.OK: "green",
}  # diagnose
SEP: list[Segment] = [(" ", ""), ("|", "dim"), (" ", "")]
EVIDENCE_SHOWN = 5  # per check in the human view; what is left is counted, never dropped silently
# failed checks a failing verify lists without -v (each on one line), the rest counted
VERIFY_SHOWN = 10
VERIFY_LINE = 64  # a failed check's label and message without -v: its line fits 80 columns


def draw(r: Result, verbose: bool) -> tuple[list[Line], dict | None]:
    """A result as lines of (text, style) segments, the host's name left as the LABEL slot; and the
    table it prints first, if any. Both cleaned (redaction.shown): what folding and layout get is
    what may show."""
    lines, table = _draw(r, verbose)
    if table and not table.get("rows"):
        # a header over nothing says less than the result's own line (no GPU found, say)
        table = None
    if table:
        title = table.get("title")
        table = {
            **table,
            "title": shown(str(title)) if title else title,
            "rows": [[shown(str(v)) for v in row] for row in table["rows"]],
        }
    return [
        [(text if text == LABEL else shown(text), style) for text, style in line] for line in lines
    ], table


def _draw(r: Result, verbose: bool) -> tuple[list[Line], dict | None]:
    """Short unless verbose: a result's ok items are counted, not listed (a host whose checks all
    pass is its one line), and the call's own evidence is shown when the call is what failed. What
    failed, with its evidence, and what to run next are always there."""
    host: Segment = (LABEL, "bold")
    lines: list[Line] = [
        [host, *SEP, (r.task, ""), *SEP, (r.status.value, STYLE[r.status]), *SEP, (r.msg, "")]
    ]
    verify = shape_of(r) is Verification
    lines.extend(_command_output_lines(r, host))
    if verify and r.failed and not verbose and r.items:
        return _short_verify(lines, r), None
    table = r.table
    # the table shows the ok items
    items = [item for item in r.items if not (table and item.status is Status.OK)]
    shown_items = [item for item in items if item.status is not Status.OK or verbose]
    lines.extend(_item_lines(shown_items, verbose))
    hidden = len(items) - len(shown_items)
    if hidden and r.status is not Status.OK:  # an ok result's own line says it all
        done = "passed" if verify else "ok"
        lines.append([("    ", ""), (f"{hidden} {done}, not shown: -v shows them", "dim")])
    lines.extend(_evidence_lines(r, verbose))
    lines.extend(_node_notes(r))
    lines.extend(_closing_lines(r))
    return lines, table


def _closing_lines(r: Result) -> list[Line]:
    """The playbook a set chose, then what to do next: once per result, so once per folded
    group; always last."""
    lines: list[Line] = []
    # from a playbook set, by the host's versions (tasks/registry.py)
    if r.data.get("chosen_playbook"):
        lines.append([("    ", ""), ("playbook:", "dim"), (f" {r.data['chosen_playbook']}", "")])
    if r.next is not None:
        lines.extend(next_lines(r.next, "    "))
    return lines


def _command_output_lines(r: Result, host: Segment) -> list[Line]:
    """An ad-hoc command's output, each line prefixed with its host."""
    if not isinstance(r.payload, CommandOutput):
        return []
    lines: list[Line] = []
    for text, mark in ((r.payload.stdout, ("|", "dim")), (r.payload.stderr, ("!", "red"))):
        lines.extend([host, (" ", ""), mark, (" ", ""), (x, "")] for x in text.splitlines())
    return lines


def _item_lines(items: list[Item], verbose: bool) -> list[Line]:
    """Each item's line, its details and its next commands; what a kind of check proves is said
    once, at its first item."""
    lines: list[Line] = []
    scopes_shown: set[str] = set()
    for item in items:
        verdict = item.details.get("verdict")  # a diagnose finding says its verdict word
        word = f"{verdict:<8}" if verdict else f"{item.status.value:<7}"
        lines.append(
            [
                ("    ", ""),
                (word, VERDICT_STYLE.get(verdict, STYLE[item.status])),
                (f" {item.label}: {item.msg}", ""),
            ]
        )
        details = item.details
        if details.get("proves") in scopes_shown:
            details = {k: v for k, v in details.items() if k not in ("proves", "cannot")}
        scopes_shown.add(item.details.get("proves", ""))
        lines.extend(
            [("            ", ""), (x, "dim")] for x in _item_detail_lines(details, verbose)
        )
        if item.next is not None:
            lines.extend(next_lines(item.next, "            "))
    return lines


def _evidence_lines(r: Result, verbose: bool) -> list[Line]:
    """The call's own evidence, when the call is what failed (or -v)."""
    ev = r.evidence
    # a command's own exit status: the agent call's is not news
    own_exit = isinstance(r.payload, CommandOutput)
    if not (
        r.failed
        and ev is not None
        and (
            verbose
            or ev.exit_code not in (0, None)
            or ev.stderr_tail
            or not (own_exit or any(i.status is Status.FAILED for i in r.items))
        )
    ):
        return []
    ended = f" {ev.exit_code}  " if ev.exit_code is not None else " no exit status (cut off)  "
    lines: list[Line] = [
        [
            ("    ", ""),
            ("command:", "dim"),
            (f" {ev.command}  ", ""),
            ("exit:", "dim"),
            (ended, ""),
            ("took:", "dim"),
            (f" {ev.seconds}s", ""),
        ]
    ]
    if ev.stderr_tail:
        lines.append([("    ", ""), ("stderr (last lines):", "dim")])
        lines.extend([(f"      {x}", "")] for x in ev.stderr_tail)
    return lines


def _short_verify(lines: list[Line], r: Result) -> list[Line]:
    """A failing verify in a screen: what to run next first, then each failed check on one line, at
    most VERIFY_SHOWN of them; what is left out (the rest, each check's evidence and what it proves)
    is counted and -v shows it. A dozen failed checks with their evidence was 140 lines with its
    `next:` at the bottom."""
    if r.next is not None:
        lines.extend(next_lines(r.next, "    "))
    failed = [i for i in r.items if i.status is not Status.OK]
    for item in failed[:VERIFY_SHOWN]:
        word = f"{item.status.value:<7}"
        lines.append(
            [
                ("    ", ""),
                (word, STYLE[item.status]),
                (f" {_clip(f'{item.label}: {item.msg}')}", ""),
            ]
        )
    left = (
        [f"{len(failed) - VERIFY_SHOWN} more failed check{'s' * (len(failed) - VERIFY_SHOWN != 1)}"]
        if len(failed) > VERIFY_SHOWN
        else []
    )
    passed = len(r.items) - len(failed)
    left += [f"{passed} passed"] if passed else []
    if left:
        lines.append([("    ", ""), (f"{', '.join(left)}, not shown: -v shows them", "dim")])
    lines.extend(_evidence_lines(r, False))
    lines.extend(_node_notes(r))
    return lines


def _clip(text: str) -> str:
    """One line of a terminal (-v shows it whole): cut at a word when one is near, with an
    ellipsis."""
    text = " ".join(text.split())
    if len(text) <= VERIFY_LINE:
        return text
    cut = text[: VERIFY_LINE - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space >= VERIFY_LINE // 2 else cut).rstrip(" ,;:") + "…"


def next_lines(nxt: Next, indent: str) -> list[Line]:
    """`next: why`, then each command alone on its line (what a triple-click copies, whole at any
    width: the terminal wraps it, nothing cuts it)."""
    if not nxt.why and not nxt.commands:
        return []  # nothing to say: no bare `next:`
    out: list[Line] = [[(indent, ""), ("next:", "bold"), (f" {nxt.why or 'run'}", "")]]
    out.extend([(indent + "  ", ""), (command, COMMAND)] for command in nxt.commands)
    return out


def _node_notes(r: Result) -> list[Line]:
    """What the node did or let pass on the way, whatever the task: files quarantined or tidied,
    warnings."""
    lines: list[Line] = []
    # what the node tidied on the way, whatever the task
    for moved in r.data.get("quarantined") or ():
        text = (
            f" quarantined corrupt state file {moved.get('path')} ({moved.get('why')}); moved to "
            f"{moved.get('moved_to')}"
        )
        lines.append([("    ", ""), ("node:", "yellow"), (text, "")])
    for path in r.data.get("removed_temp_files") or ():
        lines.append(
            [("    ", ""), ("node:", "yellow"), (f" removed a dead upload's temp file {path}", "")]
        )
    # what the operator let pass (--allow-insecure-venv)
    for text in r.data.get("node_warnings") or ():
        lines.append([("    ", ""), ("node warning:", "yellow"), (f" {text}", "")])
    return lines


def _item_detail_lines(details: dict[str, Any], verbose: bool) -> list[str]:
    out = _drift_lines(details.get("drift", []))
    if details.get("diff_text") and details.get("show_diff"):
        out.extend(details["diff_text"].rstrip("\n").splitlines())
    out.extend(_item_evidence_lines(details))
    if details.get("stderr_tail"):
        out.append("stderr (last lines):")
        out.extend("  " + x for x in details["stderr_tail"][-10:])
    if details.get("proves"):
        out.append(f"proves: {details['proves']}; cannot prove: {details['cannot']}")
    out.extend(details.get("notes", []))
    return out


def _drift_lines(drifts: list[dict[str, Any]]) -> list[str]:
    """Each drifted hunk, where it is and its first line that differs."""
    out: list[str] = []
    for drift in drifts:
        if drift.get("hunk") is None:
            out.append(drift.get("message", ""))
            continue
        out.append(
            f"hunk {drift['hunk']} {drift['header']}: {drift['state']} near line "
            f"{drift['near_line']}"
        )
        diff = drift.get("first_difference")
        if diff:
            out.append(f"  line {diff['line']}: expected {diff['expected']!r}")
            out.append(f"  {' ' * len(str(diff['line']))}       found    {diff['found']!r}")
    return out


def _item_evidence_lines(details: dict[str, Any]) -> list[str]:
    """The first EVIDENCE_SHOWN pieces of evidence, and how many more there are."""
    evidence = details.get("evidence", [])
    out: list[str] = []
    for ev in evidence[:EVIDENCE_SHOWN]:
        out.extend(_one_evidence(ev))
    # a grep counts lines past those it answers with
    total = max(len(evidence), details.get("matches") or 0)
    if total > EVIDENCE_SHOWN:
        kept = "all" if total == len(evidence) else f"the first {len(evidence)}"
        out.append(f"and {total - EVIDENCE_SHOWN} more (--json for {kept})")
    return out


def _one_evidence(ev: object) -> list[str]:
    """A call site's error, a line of a file, fields, or the last lines of a text."""
    if not isinstance(ev, dict):
        return str(ev).splitlines()[-3:]
    if {"file", "line", "callee", "error"} <= set(ev):
        return [f"{ev['file'].rsplit('/', 1)[-1]}:{ev['line']}: {ev['callee']}: {ev['error']}"]
    if "line" in ev and "text" in ev:
        return [f"line {ev['line']}: {ev['text']}"]
    return [", ".join(f"{k}={v}" for k, v in ev.items())]
