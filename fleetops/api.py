"""fleetops as a library: the same tasks, rollout and results as `fab`, from Python.

    from fleetops.api import run
    results = run(".", "@lab", [("patch", {}), ("verify", {"kinds": "grep,compile"})])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import run as _run
from .results import Result
from .rollout import DEFAULT_FORKS
from .state import RunState


def run(root: str | Path, hosts: str | list[str], tasks: list[tuple[str, dict[str, Any]]], *,
        forks: int = DEFAULT_FORKS, serial: int = 0, quiet: bool = True,
        settings: dict[str, Any] | None = None) -> list[Result]:
    """Run `tasks` on `hosts` (inventory names, @groups). Raises ConfigError/UnknownHost before connecting."""
    state = RunState(Path(root).resolve(), settings or {"inventory": "hosts"})
    state.reporter.json_mode = quiet  # quiet: results are returned, nothing is printed
    words = [hosts] if isinstance(hosts, str) else hosts  # assemble() splits, brackets aware (lab[01,07])
    _run.execute(_run.assemble(state, words, tasks), forks, serial, view=False)
    return list(state.results)
