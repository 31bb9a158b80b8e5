"""fleetops as a library: the same tasks, rollout and results as `fab`, from Python.

    from fleetops.api import run
    results = run(".", "@lab", [("patch", {}), ("verify", {"kinds": "grep,compile"})])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .invocation import Invocation
from .results import Result
from .rollout import DEFAULT_FORKS, Step, run_fleet
from .tasks import host_task, plan_for


def run(root: str | Path, hosts: str | list[str], tasks: list[tuple[str, dict[str, Any]]], *,
        forks: int = DEFAULT_FORKS, serial: int = 0, quiet: bool = True,
        settings: dict[str, Any] | None = None) -> list[Result]:
    """Run `tasks` on `hosts` (inventory names, @groups). Raises ConfigError/UnknownHost before connecting."""
    inv = Invocation(Path(root).resolve(), settings or {"inventory": "hosts"})
    inv.reporter.json_mode = quiet  # quiet: results are returned, nothing is printed
    words = hosts.split(",") if isinstance(hosts, str) else hosts
    selected = inv.inventory.expand(words)
    for name, kwargs in tasks:
        plan_for(inv, name, kwargs)

    def step(name: str, kwargs: dict[str, Any]) -> Step:
        return Step(name, lambda host: host_task(inv, name, host.name, kwargs))

    try:
        run_fleet(inv, selected, [step(n, kw) for n, kw in tasks], forks, serial)
    finally:
        inv.close()
    return list(inv.results)
