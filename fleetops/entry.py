"""The installed `fleet` script (pyproject.toml [project.scripts]): the program of cli.py, with the
garbage collector held off while it starts (startup.py says why). A separate module because the hold
must come before cli.py imports Fabric, and importing cli.py (tests, `python -m fleetops.cli`) must
not hold it."""

from __future__ import annotations

import os
import sys
from types import ModuleType

from . import startup


def import_program() -> ModuleType:
    """cli.py, whose `program` is the installed fleet's."""
    from . import cli

    return cli


def main() -> None:
    # before anything else is imported: Ctrl-C there is one line and exit 130
    startup.guard_interrupts()
    # answered without importing Invoke (startup.py says why)
    if startup.asks_only_version(sys.argv[1:]):
        os._exit(startup.print_versions())
    startup.hold()
    # a warm OpenSSH run's agents, started while the program starts (wire/warmstart.py says when)
    from .wire import warmstart

    warmstart.begin(sys.argv[1:])
    import_program().main()
