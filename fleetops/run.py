"""The one way a run is made and carried out, for `fab`, `fleet` (fab/executor.py) and the library
(api.py) alike:

    run = assemble(RunState(root, settings), ["@lab"], [("patch", {}), ("verify", {})])  # connects nothing
    code = execute(run, forks=32, serial=0)                                                # walks the fleet

assemble() checks the hosts and builds each task's plan exactly once, before any connection; execute() runs
every host's chain (rollout.py), each step a direct call of tasks.registry.run_task.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .plans.inventory import Host
from .report.rows import fleet_sections
from .results import EXIT_INTERRUPTED, Status, exit_status
from .rollout import DEFAULT_FORKS, Step, run_fleet
from .state import RunState
from .tasks.plan import UsageError
from .tasks.registry import plan_for, run_task
from .wire.connector import COUNTERS

__all__ = ["Run", "UsageError", "assemble", "execute"]


@dataclass
class Run:
    state: RunState
    hosts: list[Host]
    steps: list[Step] = field(default_factory=list)


def assemble(state: RunState, hosts: list[str], tasks: list[tuple[str, dict[str, Any]]], *, limit: str = "",
             dry: bool = False) -> Run:
    """Hosts expanded (names, @groups, user@host), every task planned once, --limit applied; `dry`: every
    task in its check mode, or UsageError for one that has none.
    Raises ConfigError, UnknownHost or UsageError: then nothing has connected anywhere."""
    selected = state.inventory.expand(hosts)
    steps = [Step(name, partial(run_task, state, name, plan_for(state, name, kwargs, dry=dry)))
             for name, kwargs in tasks]
    if limit:  # names, globs, @group, !host (plans/inventory.py); UnknownHost when nothing is left
        selected = state.inventory.limit(selected, limit)
    return Run(state, selected, steps)


def execute(run: Run, forks: int = DEFAULT_FORKS, serial: int = 0, *, view: bool = True) -> int:
    """Run every host's chain and return the exit status. `view`: the live view and, at the end, the recap
    (or the JSON document), as `fab` shows them; the library (api.py) returns the results instead."""
    state = run.state
    reporter = state.reporter
    if view:
        reporter.live_start([h.name for h in run.hosts])
    try:
        with _interrupts(state):
            run_fleet(state, run.hosts, run.steps, forks, serial)
        reporter.live_stop()
        code = exit_status(state.results)
        if state.interrupted.is_set():
            code = EXIT_INTERRUPTED
            if view:
                _say_what_was_done(state)
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


@contextmanager
def _interrupts(state: RunState) -> Iterator[None]:
    """Ctrl-C: the first stops starting new work and interrupts the running agent calls (rollout.py closes
    the links; each agent on a node then unwinds cleanly); the second exits at once."""
    if threading.current_thread() is not threading.main_thread():
        yield  # a library caller in a thread keeps its own signal handling
        return

    def handler(signum: int, frame: object) -> None:
        if state.interrupted.is_set():
            os.write(2, b"\nsecond Ctrl-C: exiting now; nodes finish or undo their step on their own\n")
            os._exit(EXIT_INTERRUPTED)
        state.interrupted.set()
        os.write(2, b"\nCtrl-C: starting nothing new, interrupting running steps (Ctrl-C again to exit now)\n")

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _say_what_was_done(state: RunState) -> None:
    done = [r for r in state.results if r.data.get("error_kind") != "interrupted" and r.status is not Status.SKIPPED]
    cut = [r for r in state.results if r.data.get("error_kind") == "interrupted"]
    never = [r for r in state.results if r.status is Status.SKIPPED]

    def names(rs: list) -> str:
        return ", ".join(f"{r.host}:{r.task}" for r in rs) or "none"

    print(f"interrupted (Ctrl-C): done: {names(done)}; interrupted while running: {names(cut)}; "
          f"not started: {names(never)}", file=sys.stderr)
