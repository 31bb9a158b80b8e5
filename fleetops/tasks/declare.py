"""A host task stated once, in its family's module: its name, help, options (each with its help,
default and range), whether it writes on the node, the agent op it calls, its result type, and how
it plans, reads the answer or runs. The run's task table (tasks/registry.py), `fab`/`fleet`
(fab/tasks.py: the Invoke task, its --help and --list line), and the API's option check (api.py) are
all read from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, overload

from ..plans.options import Range
from ..results import Result
from .plan import TaskSpec

HELP_JSON = "print one JSON document instead of the human view"
HELP_PLAYBOOK = "playbook YAML (default: fleetops.playbook in fabric.yaml)"
HELP_JOB_ID = "a job id on the node (default: the node's latest job)"


@dataclass(frozen=True)
class Option:
    """One option of a task: `name` as Python spells it (--job-id is job_id), its help line, its
    default, and for a whole number its range (least, greatest or None), checked before anything
    connects."""

    name: str
    help: str
    default: Any = None
    numbers: Range | None = None
    iterable: bool = False  # repeatable: a list of every value given
    optional: bool = False  # a flag that may come with or without its value (--shards / --shards 4)
    required: bool = False  # a positional argument with no default (run's command)
    positional: bool = False  # a positional argument with a default (schedule's `verify`)


JSON = Option("json", HELP_JSON, False)


class ResultClass:
    """A task's result type, given as the class or as "module:Name": a family loaded on first use
    (deferred.py) names its result classes, imported when read, so a run that names none of its
    tasks does not build their dataclasses at start-up."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = "_" + name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> type: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> type: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> type:
        if obj is None:  # the dataclass's default
            return Result
        value = obj.__dict__[self._slot]
        if isinstance(value, str):
            module, _, name = value.partition(":")
            # the import statement's way in, not importlib.import_module's: `python -X importtime`
            # (the start-up tests' harness) times and names only imports made that way
            value = getattr(__import__(module, fromlist=[name]), name)
            obj.__dict__[self._slot] = value
        assert isinstance(value, type)
        return value

    def __set__(self, obj: object, value: type | str) -> None:
        obj.__dict__[self._slot] = value


@dataclass
class HostTask(TaskSpec):
    """A task run on every selected host. `writes`: it changes the node; with a `check` option that
    is its check mode (--dry sets it), without one --dry refuses it. A task that does not write runs
    as is under --dry, and its `op` must be one the agent counts as read-only (so its request may be
    sent ahead)."""

    help: str = ""
    options: tuple[Option, ...] = (JSON,)
    writes: bool = False
    op: str = ""  # the agent op its plan calls; "" for none (trust talks to SSH itself)
    result: ResultClass = ResultClass()
    # -p may name a set (a folder): each host runs the playbook its versions fit
    playbook_set: bool = False
    dry: str | None = field(init=False, default="read-only")

    def __post_init__(self) -> None:
        names = [o.name for o in self.options]
        if len(set(names)) != len(names):
            raise ValueError(f"task {self.name}: an option is declared twice: {names}")
        if not self.writes:
            self.dry = "read-only"
        else:
            self.dry = "check" if "check" in names else None

    def option_names(self) -> frozenset[str]:
        """The options the task itself takes, as the API names them (the front end's --json is not
        one)."""
        return frozenset(o.name for o in self.options if o.name != "json")
