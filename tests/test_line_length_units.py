"""Lines that fit a screen: no line of the project's Python, nor of docs/architecture.md, over the
line length pyproject.toml gives ruff. Counted in characters, as a reader sees them: ruff's E501
lets a line run past the limit for a pragma comment (`# type: ignore[...]`, `# noqa`) or a URL."""

from __future__ import annotations

from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: the dev lock's tomli
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
PYTHON_PLACES = ("fleetops", "remote_scripts", "tests", "bench", "scripts", "fabfile.py")
# git-ignored places a run leaves behind (a venv, the bench's peers and lab): not the project's code
SKIP = {".venv", "__pycache__", ".lab", "node_modules", ".work"}
AGENT_LINK = REPO / "fleetops" / "agent"


def limit() -> int:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["line-length"]


def python_files() -> list[Path]:
    out = []
    for place in PYTHON_PLACES:
        top = REPO / place
        files = [top] if top.is_file() else sorted(top.rglob("*.py"))
        # fleetops/agent is a link to remote_scripts/: each file once
        out += [f for f in files if not SKIP & set(f.parts) and not f.is_relative_to(AGENT_LINK)]
    return out


def too_long(path: Path, width: int) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [
        f"{path.relative_to(REPO)}:{n}: {len(line)} characters"
        for n, line in enumerate(text.splitlines(), 1)
        if len(line) > width
    ]


def test_the_line_length_is_100():
    assert limit() == 100


def test_no_python_line_is_over_the_line_length():
    files = python_files()
    assert len(files) > 300, "the project's Python was not found where this test looks"
    width = limit()
    assert [hit for f in files for hit in too_long(f, width)] == []


def test_no_line_of_the_architecture_doc_is_over_the_line_length():
    assert too_long(REPO / "docs" / "architecture.md", limit()) == []
