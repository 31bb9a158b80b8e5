"""`@fleet_task`: declares a fabfile task (its name, options and help) as a fleetops host task. The
executor (executor.py) runs the task of that name from fleetops.tasks for each host, with the
options the command line gave; the fabfile body itself is a declaration and never runs.

Short flags are explicit, never Invoke's automatic first-free-letter (which made `-j` mean --json on
one task and --job-id on another): SHORT_FLAGS is the whole scheme, the same letter meaning the same
option on every task. Every host task also takes the run options (RUN_OPTIONS), so plain `fab` has
them too."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from invoke import Argument, Task, task

from ..plans.options import RUN_NUMBERS, Range

if TYPE_CHECKING:
    from ..tasks.declare import HostTask

# The one short-flag scheme (README "Flags"). Nothing else gets a short flag; -h stays Fabric's
# --help.
SHORT_FLAGS = {"json": "j", "check": "c", "playbook": "p", "user": "u", "verbose": "v"}

COMMAND_LINE_WINS = "the command line wins over the inventory and ssh_config, as with ssh"

# Options of the whole run, accepted by every host task (any task of the command may give them; with
# `fleet` they are core flags too). name → (default, help)
RUN_OPTIONS: dict[str, tuple[Any, str]] = {
    "serial": (None, "roll out in batches of N hosts; a batch with a failure stops the roll-out"),
    "forks": (None, "hosts worked on at once (default 32)"),
    "limit": ("", "only these of the selected hosts: names, globs, @group, !host, comma-separated"),
    "inventory": (
        "",
        "inventory directory or .yaml file (default: fabric.yaml's fleetops.inventory; "
        "env FLEETOPS_INVENTORY). Not -i: that is the SSH identity file",
    ),
    "user": (
        None,
        f"log in as USER on every host of the run ({COMMAND_LINE_WINS}; a user@ in the -H word "
        "wins over it)",
    ),
    "port": (
        None,
        f"connect to PORT on every host of the run ({COMMAND_LINE_WINS}; a :port in the -H word "
        "wins over it)",
    ),
    "no_fold": (
        False,
        "one block per host, even when hosts answered the same (FLEETOPS_FOLD=0 too; "
        "FLEETOPS_FOLD=1 folds any number of hosts)",
    ),
    "odd": (
        False,
        "odd ones out: each group of hosts that answered differently, as a unified diff against "
        "the majority's answer",
    ),
    "verbose": (
        False,
        "everything each host answered: every passing check with its evidence, every diagnose "
        "finding with its commands, the agent call (default: what failed and what to run next)",
    ),
    "allow_insecure_venv": (
        False,
        "run on a node whose Python (its prefix, sys.path, site-packages, .pth files) "
        "another user may write, with a warning, instead of refusing it",
    ),
    "metrics": (
        "",
        "also write the results to FILE as Prometheus metrics (node_exporter's textfile collector "
        "reads it; replaced whole, by rename)",
    ),
    "junit": (
        "",
        "also write the results to FILE as JUnit XML (a test case per host and check), for CI",
    ),
    "transport": (None, "openssh (the system ssh, with persistent master connections) or paramiko"),
    "ask_become_pass": (
        False,
        "ask once for the sudo password of hosts with `become: sudo` (sent only to sudo's "
        "prompt on the node; without it sudo runs with -n, never asking)",
    ),
}


class NotWhole(str):
    """A word given where a whole number goes (`--threshold lots`), kept as typed: refused, naming
    the option, before the run (fab/flags.py), where Invoke's int() would have let a ValueError out
    of its parser."""


class WholeArgument(Argument):
    """A whole-number option whose value Invoke could not cast keeps the word (NotWhole) for the
    refusal."""

    def set_value(self, value: Any, cast: bool = True) -> None:
        try:
            super().set_value(value, cast)
        except ValueError:
            super().set_value(NotWhole(value), cast=False)


def whole_argument(arg: Argument) -> Argument:
    if arg.kind is not int or isinstance(arg, WholeArgument):
        return arg
    return WholeArgument(
        names=arg.names,
        kind=int,
        default=arg.default,
        help=arg.help,
        positional=arg.positional,
        optional=arg.optional,
        incrementable=arg.incrementable,
        attr_name=arg.attr_name,
    )


class DefaultedPositional(Argument):
    """A positional argument with a default (`schedule verify`): the next word fills it, unless a
    flag of its task came first (`schedule --list`), which leaves it its default; with neither it is
    missing, as Invoke says."""

    siblings: tuple[Argument, ...] = ()

    @property
    def value(self) -> Any:
        if self._value is not None:
            return self._value
        return self.default if any(a.got_value for a in self.siblings if a is not self) else None

    @value.setter
    def value(self, arg: str) -> None:
        self.set_value(arg, cast=True)


def defaulted_positionals(args: list[Argument]) -> list[Argument]:
    out = [
        DefaultedPositional(
            names=a.names,
            kind=a.kind,
            default=a.default,
            help=a.help,
            positional=True,
            optional=a.optional,
            incrementable=a.incrementable,
            attr_name=a.attr_name,
        )
        if a.positional and a.default is not None
        else a
        for a in args
    ]
    for arg in out:
        if isinstance(arg, DefaultedPositional):
            arg.siblings = tuple(out)
    return out


class FleetTask(Task):
    """Invoke's Task (fabric.Task less the hosts Fabric's executor would connect to: fleetops'
    executor takes them from -H and the inventory), whose short flags come from SHORT_FLAGS only,
    and whose whole-number options (numbers_of) are cast by Invoke (a word that is not a number is a
    usage error naming the option) also when they have no default (`tail --lines`)."""

    def arg_opts(  # type: ignore[override]
        self, name: str, default: str, taken_names: set[str]
    ) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        if name in SHORT_FLAGS:
            opts["names"] = [*opts["names"], SHORT_FLAGS[name]]
        if name in numbers_of(self):
            opts["kind"] = int
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        return defaulted_positionals(
            [whole_argument(arg) for arg in super().get_arguments(ignore_unknown_help)]
        )


def numbers_of(task: Any) -> dict[str, Range]:
    """A task's whole-number options: name → (least, greatest or None)."""
    return getattr(getattr(task, "body", None), "fleetops_numbers", {})


def explicit_task(
    numbers: dict[str, Range] | None = None, **options: Any
) -> Callable[[Callable], Any]:
    """Invoke's task decorator with the house short-flag scheme (for local tasks such as history);
    `numbers`: its whole-number options and their ranges, checked before it runs (fab/flags.py)."""

    def wrap(body: Callable) -> Any:
        body.fleetops_numbers = dict(numbers or {})  # type: ignore[attr-defined]
        return task(klass=FleetTask, auto_shortflags=False, **options)(body)

    return wrap


def fleet_task(
    numbers: dict[str, Range] | None = None, **options: Any
) -> Callable[[Callable], Any]:
    """The task decorator for a per-host fleetops task; the executor runs these as per-host chains.
    `numbers`: the task's whole-number options and their ranges (the run options' are added)."""

    def wrap(body: Callable) -> Any:
        @functools.wraps(body)  # Fabric reads the help from body's docstring
        def declared(c: Any, *args: Any, **kwargs: Any) -> None:
            raise SystemExit(
                f"{body.__name__} runs through fleetops' executor: set tasks.executor_class: "
                "fleetops.fab.executor.FleetExecutor in fabric.yaml (or use `fleet`)"
            )

        sig = inspect.signature(body)
        extra = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
            for name, (default, _) in RUN_OPTIONS.items()
            if name not in sig.parameters
        ]
        params = [*sig.parameters.values(), *extra]
        declared.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        declared.fleetops_task = body.__name__  # type: ignore[attr-defined]
        declared.fleetops_run_options = [p.name for p in extra]  # type: ignore[attr-defined]
        helps = {
            **{name: text for name, (_, text) in RUN_OPTIONS.items()},
            **options.pop("help", {}),
        }
        return explicit_task(numbers={**RUN_NUMBERS, **(numbers or {})}, help=helps, **options)(
            declared
        )

    return wrap


def from_declaration(task: HostTask) -> Any:
    """The fab task of a declared host task (tasks/declare.py): its signature, help, ranges and
    repeatable options read from the declaration, its body a declaration like every fleet_task's."""

    def body(c: Any, **kwargs: Any) -> None: ...

    body.__name__ = body.__qualname__ = task.name
    body.__doc__ = task.help
    body.__module__ = task.plan.__module__
    params = [
        inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        *(
            inspect.Parameter(
                o.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=inspect.Parameter.empty if o.required else o.default,
            )
            for o in task.options
        ),
    ]
    body.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    numbers = {o.name: o.numbers for o in task.options if o.numbers is not None}
    return fleet_task(
        numbers=numbers,
        help={o.name: o.help for o in task.options},
        iterable=[o.name for o in task.options if o.iterable],
        optional=[o.name for o in task.options if o.optional],
        positional=[o.name for o in task.options if o.required or o.positional],
    )(body)


def run_options_of(call: Any) -> list[str]:
    """The RUN_OPTIONS a call's task took from the run (not its own parameters: patch's --diff is
    its own)."""
    return list(getattr(call.task.body, "fleetops_run_options", RUN_OPTIONS))


def fleet_task_name(call: Any) -> str | None:
    """The fleetops task a Fabric call names, or None for a local task (history, lab.*)."""
    return getattr(call.task.body, "fleetops_task", None)
