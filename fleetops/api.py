"""fleetops as a library: the same tasks, rollout and results as `fab`, from Python (docs/api.md).

    from fleetops.api import run
    results = run(".", "@lab", [("patch", {}), ("verify", {"kinds": "grep,compile"})])

Everything wrong with the request is raised before anything connects, as one of fleetops' own errors
(all exported here and from `fleetops`): UnknownTask and UnknownOption (both UsageError, with a "did
you mean"), UsageError, ConfigError (a bad inventory or playbook), UnknownHost. What happens on a
node is never raised: it is a Result (FAILED, UNREACHABLE, ...)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import run as _run
from .plans.host import UnknownHost
from .plans.marks import did_you_mean
from .plans.yamlsrc import ConfigError
from .results import Result, Status
from .rollout import DEFAULT_FORKS
from .state import RunState
from .tasks.plan import UsageError
from .tasks.registry import declared_tasks

__all__ = [
    "TASK_OPTIONS",
    "ConfigError",
    "Result",
    "Status",
    "UnknownHost",
    "UnknownOption",
    "UnknownTask",
    "UsageError",
    "run",
]

# Each host task and the options it takes: `fab TASK --help`'s, spelled as Python names (--job-id:
# job_id), without the front end's --json and run options (run()'s own arguments), read from its
# declaration (tasks/declare.py).
TASK_OPTIONS: Mapping[str, frozenset[str]] = {
    name: task.option_names() for name, task in declared_tasks().items()
}


class UnknownTask(UsageError):
    """A task name that is no fleetops host task."""


class UnknownOption(UsageError):
    """An option the named task does not take (a misspelled one is never silently ignored)."""


def check_tasks(tasks: list[tuple[str, dict[str, Any]]]) -> None:
    """Every (task, options) pair names a host task and only options it takes; raises UnknownTask,
    UnknownOption or UsageError (a malformed pair) otherwise."""
    for i, pair in enumerate(tasks):
        if not (
            isinstance(pair, tuple)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and isinstance(pair[1], Mapping)
        ):
            raise UsageError(
                f"tasks[{i}] is {pair!r}: give (task name, {{option: value}}), e.g. ('ping', {{}})"
            )
        name, options = pair
        if name not in TASK_OPTIONS:
            raise UnknownTask(
                f"unknown task {name!r}{did_you_mean(name, TASK_OPTIONS)} (tasks: "
                f"{', '.join(sorted(TASK_OPTIONS))})"
            )
        accepted = TASK_OPTIONS[name]
        for option in options:
            if option not in accepted:
                known = ", ".join(sorted(accepted)) or "none"
                raise UnknownOption(
                    f"{name} takes no option {option!r}{did_you_mean(option, accepted)} "
                    f"({name}'s options: {known})"
                )


def run(
    root: str | Path,
    hosts: str | list[str],
    tasks: list[tuple[str, dict[str, Any]]],
    *,
    forks: int = DEFAULT_FORKS,
    serial: int = 0,
    quiet: bool = True,
    settings: dict[str, Any] | None = None,
) -> list[Result]:
    """Run `tasks` (each a (name, options) pair, in order) on `hosts` (inventory names, @groups,
    ranges) of the project at `root`, and return every host's results. Raises UnknownTask,
    UnknownOption, UsageError, ConfigError or UnknownHost before anything connects; a node's trouble
    is a Result, never raised."""
    check_tasks(tasks)
    state = RunState(Path(root).resolve(), settings or {"inventory": "hosts"})
    state.reporter.json_mode = quiet  # quiet: results are returned, nothing is printed
    # assemble() splits, brackets aware (lab[01,07])
    words = [hosts] if isinstance(hosts, str) else hosts
    _run.execute(_run.assemble(state, words, tasks), forks, serial, view=False)
    return list(state.results)
