"""Code, tests and docs speak of the product, not of the work that made it: no ticket or session
numbers (CHANGELOG.md keeps the history). No lab."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLACES = (
    "fleetops",
    "remote_scripts",
    "tests",
    "docs",
    "bench",
    "scripts",
    "fabfile.py",
    "README.md",
)
HISTORY = re.compile(r"\b(?:issues?|session)\s+[0-9]+", re.IGNORECASE)


def history_lines(root: Path) -> list[str]:
    found = []
    for place in PLACES:
        top = root / place
        for path in sorted([top] if top.is_file() else top.rglob("*") if top.is_dir() else []):
            # bench/.work: what a bench run made (git-ignored; the peers' own venv among it), not
            # the project's
            if not path.is_file() or "__pycache__" in path.parts or ".work" in path.parts:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue  # binary data (recordings, fixtures)
            found += [
                f"{path.relative_to(root)}:{n}: {line.strip()}"
                for n, line in enumerate(text.splitlines(), 1)
                if HISTORY.search(line)
            ]
    return found


def test_no_ticket_or_session_numbers_outside_the_changelog():
    assert history_lines(REPO) == []


def test_the_scan_sees_them(tmp_path):
    # split: this file is scanned
    ticket, session = "fixed in Issue " + "16, item 2", "as in session " + "10's run"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(f"fine\n{ticket}\n{session}\n")
    (tmp_path / "README.md").write_text(
        "upstream vllm-project/vllm#5901 is a citation, not history\n"
    )
    assert history_lines(tmp_path) == [f"docs/a.md:2: {ticket}", f"docs/a.md:3: {session}"]
