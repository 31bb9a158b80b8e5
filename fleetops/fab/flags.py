"""What a parsed command line may mean in fleetops, checked before anything is prompted for or
contacted (`fleet` runs it at the end of its parse, usage.checked_parse; with Fabric's own `fab` the
executor runs it before the run, executor.py).

Fabric's `fab --help` lists its own core flags, and `fab` prints that list before any fabfile is
read, so it cannot say what each does here. Each one either works in fleetops (-H, -i, -S, -t, -T
for the ad-hoc command, -R/--dry as check mode, -f, -d, --prompt-for-passphrase, the listings) or,
given with a fleetops task, is refused here with the reason (UNUSED). `fleet --help` lists only the
ones that work, with fleetops' meaning (cli.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..plans.options import CORE_NUMBERS, BadValue, user, whole
from .decorators import numbers_of

# Fabric's core flags that change nothing in fleetops: each step is one request to the node's agent
# (no shell command of Fabric's to echo, hide, warn about or give a pty), and fleetops logs in with
# keys only.
UNUSED = {
    "warn-only": "-w/--warn-only is Fabric's (a failed shell command only warns) and does "
    "nothing in fleetops: a failed host never stops the others, and the exit status "
    "and recap say what failed",
    "echo": "-e/--echo is Fabric's (print each shell command first) and does nothing in "
    "fleetops, which sends each step to the node's agent as one request, not as a shell "
    "command (FLEETOPS_TRACE=1 counts a run's connections, execs and uploads per host)",
    "hide": "--hide is Fabric's (hide shell commands' output) and does nothing in fleetops: "
    "--json prints one JSON document instead of the report",
    "pty": (
        "--pty is Fabric's (a terminal for shell commands) "
        "and does nothing in fleetops, whose agent needs none"
    ),
    "prompt-for-sudo-password": "--prompt-for-sudo-password is Fabric's and does nothing in "
    "fleetops: hosts with `become: sudo` run the agent through sudo, "
    "and --ask-become-pass asks for its password",
    "prompt-for-login-password": "--prompt-for-login-password is Fabric's and does nothing in "
    "fleetops, which logs in with keys only (the inventory's "
    "identity_file, -i, ssh_config's IdentityFile, ssh-agent)",
}
# The core flags that only tasks on hosts act on (`fleet`'s run options and Fabric's -i and -t)
HOST_FLAGS = (
    "serial",
    "forks",
    "limit",
    "inventory",
    "user",
    "port",
    "no-fold",
    "odd",
    "allow-insecure-venv",
    "identity",
    "connect-timeout",
    "ask-become-pass",
)
# The local tasks that change things (the lab's), which --dry cannot make read-only
LAB_WRITES = (
    "lab.up",
    "lab.down",
    "lab.reset",
    "lab.gpu",
    "lab.kernel",
    "lab.install",
    "lab.stop",
    "lab.start",
    "lab.rekey",
)
PTY_IN_FAB = (
    "; with Fabric's fab, -p before the task is --pty: give -p PLAYBOOK after the task "
    "(`fab -H HOST patch -p PLAYBOOK`), or use fleet, where -p is --playbook anywhere"
)


def runs_fleetops(program: Any) -> bool:
    """Whether the parsed command runs a fleetops task (or the ad-hoc command through fleetops'
    executor): a fabfile's own tasks keep Fabric's ways and flags."""
    collection = getattr(program, "collection", None)
    if collection is None:
        return False
    for ctx in getattr(program, "tasks", None) or []:
        if getattr(collection[ctx.name].body, "__module__", "").startswith("fleetops."):
            return True
    return bool(program.core.remainder) and is_fleetops_collection(collection)


def is_fleetops_collection(collection: Any) -> bool:
    """A collection that declares at least one fleetops host task (fab/tasks.py's @fleet_task)."""
    if collection is None:
        return False
    return any(
        getattr(task.body, "fleetops_task", None) for task in collection.tasks.values()
    ) or any(is_fleetops_collection(sub) for sub in collection.collections.values())


# Flags that print something and end the program when they come before the task: after one, Invoke
# would run the task and drop them
PRINT_AND_END = {
    "version": "-V/--version",
    "list-agent-keys": "--list-agent-keys",
    "print-completion-script": "--print-completion-script",
}
# --list's shape: nothing to shape without it
LIST_SHAPE = {"list-depth": "-D/--list-depth", "list-format": "-F/--list-format"}


def refusal(program: Any) -> tuple[str, str | None] | None:
    """(message, the task whose help to point at) for what the command line cannot mean, or None."""
    if not runs_fleetops(program):
        return None
    for check in (_after_the_task, _without_list, _unused, _unheard):
        said = check(program)
        if said:
            return said, None
    try:
        _check_values(program)
    except BadValue as exc:
        return str(exc), getattr(exc, "task", None)
    return None


def _after_the_task(program: Any) -> str | None:
    """A flag that prints and ends the program, given after a task."""
    after = getattr(getattr(program, "core_via_tasks", None), "args", {})
    for name, flag in PRINT_AND_END.items():
        if name in after and after[name].value:
            return (
                f"{flag} prints and ends the program before any task runs; after a task it would "
                f"be dropped: give it alone (`{_binary(program)} {flag.split('/')[-1]}`)"
            )
    return None


def _without_list(program: Any) -> str | None:
    """A flag that shapes --list, without --list."""
    args = program.args
    listing = "list" in args and args["list"].value
    for name, flag in LIST_SHAPE.items():
        if name in args and args[name].value not in (None, args[name].default) and not listing:
            return f"{flag} shapes --list and does nothing without it: add --list, or leave it out"
    return None


def _unused(program: Any) -> str | None:
    """A flag Fabric has that fleetops does not use."""
    args = program.args
    for name, why in UNUSED.items():
        if name in args and args[name].value:
            pty_in_fab = name == "pty" and "playbook" not in args
            return why + (PTY_IN_FAB if pty_in_fab else "")
    return None


def _binary(program: Any) -> str:
    name = getattr(program, "binary", None)
    return name if isinstance(name, str) and name and not name.endswith(".py") else "fab"


def _unheard(program: Any) -> str | None:
    """A core flag that no task of the command would act on (`fleet --serial 2 history`, `-p` with
    ping, -T with patch, --dry with lab.down), said instead of ignored."""
    command = _Command.of(program)
    for check in (_no_such_option, _timeout_without_run, _hosts_without_tasks, _dry_without_check):
        said = check(command)
        if said:
            return said
    return None


@dataclass(frozen=True)
class _Command:
    """What a command line asks for, as the checks of unheard flags need it."""

    args: Any
    tasks: list[Any]
    # the names of its tasks, `run` for `-- CMD`
    names: list[str]
    # its tasks that run on hosts
    on_hosts: list[str]
    remainder: str
    # the core flags it gives a value
    given: frozenset[str]

    @property
    def doing(self) -> str:
        return ", ".join(self.names) or "this command"

    @classmethod
    def of(cls, program: Any) -> _Command:
        args, tasks, remainder = program.args, program.tasks, program.core.remainder
        on_hosts = [
            ctx.name
            for ctx in tasks
            if getattr(program.collection[ctx.name].body, "fleetops_task", None)
        ]
        names = [ctx.name for ctx in tasks] + (["run"] if remainder else [])
        given = frozenset(
            name
            for name in (*HOST_FLAGS, "json", "playbook", "command-timeout", "dry")
            if name in args and args[name].value not in (None, False, "", [])
        )
        return cls(args, list(tasks), names, on_hosts, remainder, given)


def _no_such_option(command: _Command) -> str | None:
    """--json or --playbook for tasks that take none."""
    if command.remainder:
        return None
    for name in sorted(command.given & {"json", "playbook"}):
        if not any(name in ctx.args for ctx in command.tasks):
            return f"{_flag(command.args[name])}: {command.doing} takes no {name} option"
    return None


def _timeout_without_run(command: _Command) -> str | None:
    if "command-timeout" not in command.given or "run" in command.names:
        return None
    return (
        "-T/--command-timeout is the ad-hoc command's "
        f"timeout (`run`, or `fleet -H HOST -- CMD`); {command.doing} "
        "has its own limits (see each task's --help)"
    )


def _hosts_without_tasks(command: _Command) -> str | None:
    host_flags = command.given & set(HOST_FLAGS)
    if not host_flags or command.on_hosts or command.remainder:
        return None
    return (
        f"{_flag(command.args[min(host_flags)])} is for tasks on hosts; {command.doing} runs none"
    )


def _dry_without_check(command: _Command) -> str | None:
    writes = [ctx.name for ctx in command.tasks if ctx.name in ("init", *LAB_WRITES)]
    if "dry" not in command.given or not writes:
        return None
    return f"-R/--dry: {', '.join(writes)} has no check mode (it is not a task on hosts)"


def _check_values(program: Any) -> None:
    _check_args(program.args, CORE_NUMBERS)
    for ctx in program.tasks:
        try:
            _check_args(ctx.args, numbers_of(program.collection[ctx.name]))
        except BadValue as exc:
            exc.task = ctx.name  # type: ignore[attr-defined]
            raise


def _check_args(args: Any, numbers: dict) -> None:
    """The whole numbers within their ranges, and a login name that can be one."""
    for name, (least, most) in numbers.items():
        # `in` and [] know the aliases (-t), get() not
        if name in args and args[name].value is not None:
            whole(_flag(args[name]), args[name].value, least, most)
    if "user" in args and args["user"].value:
        user(_flag(args["user"]), args["user"].value)


def _flag(arg: Any) -> str:
    """An Argument as typed: `--lines`, `-u/--user`."""
    longs = [n for n in arg.names if len(n) > 1]
    shorts = [n for n in arg.names if len(n) == 1]
    return "/".join([*(f"-{s}" for s in shorts), *(f"--{n}" for n in longs)])
