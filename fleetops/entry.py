"""The installed `fab` and `fleet` scripts (pyproject.toml [project.scripts]): the program of cli.py, with the
garbage collector held off while it starts (startup.py says why). A separate module because the hold must
come before cli.py imports Fabric, and importing cli.py (tests, `python -m fleetops.cli`) must not hold it."""

from __future__ import annotations

from . import startup


def fab_main() -> None:
    startup.hold()
    from .cli import fab_main as run

    run()


def main() -> None:
    startup.hold()
    from .cli import main as run

    run()
