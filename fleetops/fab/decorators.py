"""`@fleet_task`: declares a fabfile task (its name, options and help) as a fleetops host task. The executor
(executor.py) runs the task of that name from fleetops.tasks for each host, with the options the command
line gave; the fabfile body itself is a declaration and never runs.

Short flags are explicit, never Invoke's automatic first-free-letter (which made `-j` mean --json on one
task and --job-id on another): SHORT_FLAGS is the whole scheme, the same letter meaning the same option
on every task. Every host task also takes the run options (RUN_OPTIONS), so plain `fab` has them too."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import fabric

# The one short-flag scheme (README "Flags"). Nothing else gets a short flag; -h stays Fabric's --help.
SHORT_FLAGS = {"json": "j", "check": "c", "playbook": "p", "verbose": "v"}

# Options of the whole run, accepted by every host task (any task of the command may give them; with
# `fleet` they are core flags too). name → (default, help)
RUN_OPTIONS: dict[str, tuple[Any, str]] = {
    "serial": (0, "roll out in batches of N hosts; a batch with a failure stops the roll-out"),
    "forks": (0, "hosts worked on at once (default 32)"),
    "limit": ("", "only these of the selected hosts: names, globs, @group, !host, comma-separated"),
    "inventory": ("", "inventory directory or .yaml file (default: fabric.yaml's fleetops.inventory; "
                      "env FLEETOPS_INVENTORY). Not -i: that is Fabric's SSH identity file"),
    "fold": (True, "hosts that answered the same are shown once, under their host range (from 2 hosts); "
                   "--no-fold: one block per host. FLEETOPS_FOLD=1 folds any number, =0 none"),
    "odd": (False, "odd ones out: each group of hosts that answered differently, as a unified diff against "
                   "the majority's answer"),
    # On a task without a file diff of its own (patch and rollback have --diff: the file's diff), --diff is
    # --odd, the name ClusterShell's users know.
    "diff": (False, "odd ones out (the same as --odd): each minority group as a diff against the majority"),
    "verbose": (False, "everything each host answered: every passing check with its evidence, every diagnose "
                       "finding with its commands, the agent call (default: what failed and what to run next)"),
    "allow_insecure_venv": (False, "run on a node whose Python (its prefix, sys.path, site-packages, .pth files) "
                                   "another user may write, with a warning, instead of refusing it"),
}


class FleetTask(fabric.Task):
    """fabric.Task whose short flags come from SHORT_FLAGS only."""

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:  # type: ignore[override]
        opts = super().arg_opts(name, default, taken_names)
        if name in SHORT_FLAGS:
            opts["names"] = [*opts["names"], SHORT_FLAGS[name]]
        return opts


def explicit_task(**options: Any) -> Callable[[Callable], Any]:
    """fabric.task with the house short-flag scheme (for local tasks such as history)."""
    return fabric.task(klass=FleetTask, auto_shortflags=False, **options)


def fleet_task(**options: Any) -> Callable[[Callable], Any]:
    """fabric.task for a per-host fleetops task; the executor runs these as per-host chains."""

    def wrap(body: Callable) -> Any:
        @functools.wraps(body)  # Fabric reads the help from body's docstring
        def declared(c: Any, *args: Any, **kwargs: Any) -> None:
            raise SystemExit(f"{body.__name__} runs through fleetops' executor: set tasks.executor_class: "
                             "fleetops.fab.executor.FleetExecutor in fabric.yaml (or use `fleet`)")

        sig = inspect.signature(body)
        extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
                 for name, (default, _) in RUN_OPTIONS.items() if name not in sig.parameters]
        declared.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *extra])  # type: ignore[attr-defined]
        declared.fleetops_task = body.__name__  # type: ignore[attr-defined]
        declared.fleetops_run_options = [p.name for p in extra]  # type: ignore[attr-defined]
        helps = {**{name: text for name, (_, text) in RUN_OPTIONS.items()}, **options.pop("help", {})}
        return explicit_task(help=helps, **options)(declared)

    return wrap


def run_options_of(call: Any) -> list[str]:
    """The RUN_OPTIONS a call's task took from the run (not its own parameters: patch's --diff is its own)."""
    return list(getattr(call.task.body, "fleetops_run_options", RUN_OPTIONS))


def fleet_task_name(call: Any) -> str | None:
    """The fleetops task a Fabric call names, or None for a local task (history, lab.*)."""
    return getattr(call.task.body, "fleetops_task", None)
