"""`fab runbooks`: the operator runbooks shipped in docs/runbooks/, one line each (name, title,
symptom)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.table import Table

from ..plans.runbooks import load_all
from ..plans.yamlsrc import ConfigError
from ..results import EXIT_USAGE
from .richload import rich


def show_runbooks(root: str | Path | None, as_json: bool = False) -> int:
    folder = Path(root or Path.cwd()) / "docs" / "runbooks"
    # a project of its own (fleet init): the runbooks the package ships (package data)
    if not folder.is_dir():
        folder = Path(__file__).resolve().parents[1] / "runbooks"
    try:
        books = load_all(folder)
    except (ConfigError, OSError) as exc:
        print(f"runbooks: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if as_json:
        doc = [
            {"name": b.name, "title": b.title, "symptom": b.symptom, "file": _where(b.path, root)}
            for b in books
        ]
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return 0
    if not books:
        print(f"no runbooks in {folder}")
        return 0
    # The title names the folder, the file column each file's name, whole (a path folded mid-name
    # cannot be copied); the prose columns wrap between words around it
    table = Table(
        title=f"Runbooks ({_where(folder, root)}/)", title_justify="left", show_lines=False
    )
    table.add_column("runbook", overflow="fold", ratio=1)
    table.add_column("when", overflow="fold", ratio=2)
    table.add_column("file", no_wrap=True)
    for b in books:
        table.add_row(b.title, b.symptom, b.path.name)
    # its closed pipe (`| head`) exits 141, as every report's
    rich().Console(emoji=False).print(table)
    return 0


def _where(path: Path, root: str | Path | None) -> str:
    """A runbook's path as the operator reads it: from the project, or where the package keeps
    it."""
    try:
        return str(path.relative_to(Path(root or Path.cwd()).resolve()))
    except ValueError:
        return str(path)
