"""`@fleet_task`: declares a fabfile task (its name, options and help) as a fleetops host task. The executor
(executor.py) runs the task of that name from fleetops.tasks for each host, with the options the command
line gave; the fabfile body itself is a declaration and never runs."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from fabric import task


def fleet_task(**options: Any) -> Callable[[Callable], Any]:
    """fabric.task for a per-host fleetops task; the executor runs these as per-host chains."""

    def wrap(body: Callable) -> Any:
        @functools.wraps(body)  # Fabric reads the options and the help from body's signature and docstring
        def declared(c: Any, *args: Any, **kwargs: Any) -> None:
            raise SystemExit(f"{body.__name__} runs through fleetops' executor: set tasks.executor_class: "
                             "fleetops.fab.executor.FleetExecutor in fabric.yaml (or use `fleet`)")

        declared.fleetops_task = body.__name__  # type: ignore[attr-defined]
        return task(**options)(declared)

    return wrap


def fleet_task_name(call: Any) -> str | None:
    """The fleetops task a Fabric call names, or None for a local task (history, lab.*)."""
    return getattr(call.task.body, "fleetops_task", None)
