"""The one way a run is made and carried out, for `fab`, `fleet` (fab/executor.py) and the library
(api.py) alike:

    run = assemble(RunState(root, settings), ["@lab"], [("patch", {}), ("verify", {})])  # connects nothing
    code = execute(run, forks=32, serial=0)                                                # walks the fleet

assemble() checks the hosts and builds each task's plan exactly once, before any connection; execute() runs
every host's chain (rollout.py), each step a direct call of tasks.registry.run_task.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .plans.inventory import Host
from .report.rows import fleet_sections
from .results import exit_status
from .rollout import DEFAULT_FORKS, Step, run_fleet
from .state import RunState
from .tasks.registry import plan_for, run_task
from .wire.connector import COUNTERS


class UsageError(Exception):
    """The command line selects nothing to do (e.g. --limit matches no host). Nothing was contacted."""


@dataclass
class Run:
    state: RunState
    hosts: list[Host]
    steps: list[Step] = field(default_factory=list)


def assemble(state: RunState, hosts: list[str], tasks: list[tuple[str, dict[str, Any]]], *, limit: str = "") -> Run:
    """Hosts expanded (names, @groups, user@host), every task planned once, --limit applied.
    Raises ConfigError, UnknownHost or UsageError: then nothing has connected anywhere."""
    selected = state.inventory.expand(hosts)
    steps = [Step(name, partial(run_task, state, name, plan_for(state, name, kwargs))) for name, kwargs in tasks]
    if limit:
        patterns = [p.strip() for p in limit.split(",") if p.strip()]
        selected = [h for h in selected if any(fnmatch.fnmatchcase(h.name, p) for p in patterns)]
        if not selected:
            raise UsageError(f"--limit {limit!r} matches none of the selected hosts")
    return Run(state, selected, steps)


def execute(run: Run, forks: int = DEFAULT_FORKS, serial: int = 0, *, view: bool = True) -> int:
    """Run every host's chain and return the exit status. `view`: the live view and, at the end, the recap
    (or the JSON document), as `fab` shows them; the library (api.py) returns the results instead."""
    state = run.state
    reporter = state.reporter
    if view:
        reporter.live_start([h.name for h in run.hosts])
    try:
        run_fleet(state, run.hosts, run.steps, forks, serial)
        reporter.live_stop()
        code = exit_status(state.results)
        if view:
            tracing = bool(os.environ.get("FLEETOPS_TRACE"))
            extra = {"counters": COUNTERS.per_host} if tracing or reporter.json_mode else None
            reporter.finish(state.results, code, extra, fleet_sections(state.results))
            if tracing and not reporter.json_mode:
                for name, row in COUNTERS.per_host.items():
                    reporter.note(f"trace {name}: {row['connections']} connections, {row['execs']} execs, "
                                  f"{row['uploads']} uploads")
    finally:
        reporter.live_stop()
        state.close()
    return code
