"""`fab playbook.lint` on the terminal: the report on stdout, a playbook that is not there on
stderr."""

from __future__ import annotations

import sys
from pathlib import Path

from ..plans.lint import lint_report


def show_lint(
    root: str | Path | None, playbook: str | None, default: str, as_json: bool = False
) -> int:
    text, code = lint_report(root, playbook, default, as_json=as_json)
    print(text, file=sys.stderr if code == 2 else sys.stdout)
    return code
