"""Operator runbooks (docs/runbooks/*.md) read as data: front matter, and the command blocks that CI
runs.

A runbook is Markdown with YAML front matter between `---` lines:

    ---
    title: A node drifted
    symptom: verify fails on a node that passed yesterday
    lab: {nodes: 2, setup: ["fab -H lab01 patch", "fab -H lab01 run \\"...\\""]}
    ---

Runnable blocks are fenced with the info string `console lab`. In them a line starting with `$ ` is
a command as the operator types it, with an optional trailing `# exit N` (default 0); the lines
after it, up to the next command, are output lines that must appear in the command's real output, in
any order (hosts answer as they finish; the runbook shows the key lines, not everything). Each `…`
in a line stands for any text. Fences with another info string (`console`, `sh`) are shown, not run:
out-of-band steps only. Pure: no network, no printing; tests/test_runbooks_lab.py runs the blocks
against the lab."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .fields import expect_mapping, get_int, get_str, get_str_list, reject_unknown
from .yamlsrc import ConfigError, load_text

RUNNABLE = "console lab"
_EXIT = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")


@dataclass
class Step:
    command: str
    exit: int
    expect: list[str]
    line: int  # 1-based line of the `$ ` command in the runbook


@dataclass
class Runbook:
    path: Path
    title: str
    symptom: str
    nodes: int
    setup: list[str]
    steps: list[Step] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.stem


def parse(text: str, path: Path) -> Runbook:
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        raise ConfigError(
            path, 1, "a runbook starts with front matter between `---` lines (title, symptom, lab)"
        )
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise ConfigError(path, 1, "the front matter is not closed with a `---` line") from None
    # Line numbers in the front matter's errors: the YAML starts on the file's second line.
    meta = expect_mapping(
        load_text("\n" + "\n".join(lines[1:end]), path), str(path), 1, "runbook front matter"
    )
    reject_unknown(meta, ("title", "symptom", "lab"), "runbook front matter")
    lab = expect_mapping(meta["lab"], str(path), 1, "lab") if meta.get("lab") else None
    if lab:
        reject_unknown(lab, ("nodes", "setup"), "lab")
    book = Runbook(
        path,
        get_str(meta, "title", required=True) or "",
        get_str(meta, "symptom", required=True) or "",
        get_int(lab, "nodes", default=1, minimum=1) if lab else 1,
        get_str_list(lab, "setup") if lab else [],
    )
    book.steps = _steps(lines, end + 1, path)
    return book


def _steps(lines: list[str], start: int, path: Path) -> list[Step]:
    steps: list[Step] = []
    fence: str | None = None
    for i in range(start, len(lines)):
        stripped = lines[i].strip()
        if fence is None:
            if stripped.startswith("```"):
                fence = stripped[3:].strip()
            continue
        if stripped.startswith("```"):
            fence = None
            continue
        if fence != RUNNABLE:
            continue
        if stripped.startswith("$ "):
            command, status = stripped[2:], 0
            m = _EXIT.search(command)
            if m:
                command, status = command[: m.start()], int(m[1])
            steps.append(Step(command.strip(), status, [], i + 1))
        elif stripped:
            if not steps or steps[-1].line < _block_start(lines, i):
                raise ConfigError(
                    path, i + 1, f"output before any `$ ` command in a `{RUNNABLE}` block"
                )
            steps[-1].expect.append(lines[i].rstrip())
    if fence is not None:
        raise ConfigError(path, None, "a fenced block is not closed")
    return steps


def _block_start(lines: list[str], i: int) -> int:
    """1-based line of the fence that opens the block holding line index i."""
    while i > 0 and not lines[i].strip().startswith("```"):
        i -= 1
    return i + 1


def load_all(folder: Path) -> list[Runbook]:
    return [parse(p.read_text(), p) for p in sorted(folder.glob("*.md")) if p.name != "README.md"]
