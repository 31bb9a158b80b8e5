"""Usage errors exit 2 (the documented status: nothing was contacted), with the task's help hint.

Invoke turns every parse error into exit 1, the status of a failed task. Plain `fab` gives a project no
hook between parsing and exiting, so the fabfile installs this one (`install()`): a ParseError while the
tasks are parsed becomes Exit(2) with a hint. `fleet` (cli.py) gets the same through its own subclass,
which also covers core-flag typos that `fab` parses before any fabfile is read."""

from __future__ import annotations

import difflib
from typing import Any

from invoke.exceptions import Exit, ParseError
from invoke.program import Program

from ..results import EXIT_USAGE

_installed = False


def usage_exit(program: Any, exc: ParseError) -> Exit:
    # argv[0] may be __main__.py (python -m fabric): name the command the operator knows.
    # The installed `fab` and `fleet` are one class with two names: the name it was built with, else `fab`.
    binary = _binary_of(program)
    context = getattr(exc, "context", None)
    task = getattr(context, "name", None)
    if task:
        hint = f"see `{binary} --help {task}` for its options"
    else:
        hint = f"see `{binary} --list` for the tasks and `{binary} --help` for the core options"
        text = str(exc)
        if text.startswith("No idea what '") and getattr(program, "collection", None) is not None:
            word = text.split("'")[1]
            close = difflib.get_close_matches(word, list(program.collection.task_names), n=1)
            if close:
                hint = f"did you mean `{close[0]}`? " + hint
    return Exit(f"usage error: {exc}; {hint}", code=EXIT_USAGE)


def _binary_of(program: Any) -> str:
    """Invoke's public `binary`: the name the program was built with, else argv[0]'s, which is no command's
    name under `python -m fabric`."""
    try:
        name = program.binary
    except (AttributeError, TypeError, IndexError):  # no argv to read a name from
        return "fab"
    return name if isinstance(name, str) and name and not name.endswith(".py") else "fab"


def install() -> None:
    """Make task parse errors exit 2 for this process (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    original = Program.parse_tasks

    def parse_tasks(self: Program) -> None:
        try:
            original(self)
        except ParseError as exc:
            raise usage_exit(self, exc) from None
        except ValueError as exc:  # Invoke casts `--serial abc` with int() and lets the ValueError out
            raise usage_exit(self, ParseError(f"bad option value ({exc})")) from None

    Program.parse_tasks = parse_tasks  # type: ignore[method-assign]
