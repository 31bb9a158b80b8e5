"""What a parsed command line may mean in fleetops, checked before anything is prompted for or
contacted (`fleet` runs it at the end of its parse, usage.checked_parse; with Fabric's own `fab` the
executor runs it before the run, executor.py).

Fabric's `fab --help` lists its own core flags, and `fab` prints that list before any fabfile is
read, so it cannot say what each does here. Each one either works in fleetops (-H, -i, -S, -t, -T
for the ad-hoc command, -R/--dry as check mode, -f, -d, --prompt-for-passphrase, the listings) or,
given with a fleetops task, is refused here with the reason (UNUSED). `fleet --help` lists only the
ones that work, with fleetops' meaning (cli.py)."""

from __future__ import annotations

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
    args = program.args
    after = getattr(getattr(program, "core_via_tasks", None), "args", {})
    for name, flag in PRINT_AND_END.items():
        if name in after and after[name].value:
            return (
                f"{flag} prints and ends the program before any task runs; after a task it would "
                f"be dropped: give it alone (`{_binary(program)} {flag.split('/')[-1]}`)"
            ), None
    for name, flag in LIST_SHAPE.items():
        given = name in args and args[name].value not in (None, args[name].default)
        if given and not ("list" in args and args["list"].value):
            return (
                f"{flag} shapes --list and does nothing without it: add --list, or leave it out",
                None,
            )
    for name, why in UNUSED.items():
        if name in args and args[name].value:
            pty_in_fab = name == "pty" and "playbook" not in args
            return why + (PTY_IN_FAB if pty_in_fab else ""), None
    unheard = _unheard(program)
    if unheard:
        return unheard, None
    try:
        _check_values(program)
    except BadValue as exc:
        return str(exc), getattr(exc, "task", None)
    return None


def _binary(program: Any) -> str:
    name = getattr(program, "binary", None)
    return name if isinstance(name, str) and name and not name.endswith(".py") else "fab"


def _unheard(program: Any) -> str | None:
    """A core flag that no task of the command would act on (`fleet --serial 2 history`, `-p` with
    ping, -T with patch, --dry with lab.down), said instead of ignored."""
    args, tasks = program.args, program.tasks
    hosts = [
        ctx.name
        for ctx in tasks
        if getattr(program.collection[ctx.name].body, "fleetops_task", None)
    ]
    names = [ctx.name for ctx in tasks] + (["run"] if program.core.remainder else [])
    doing = ", ".join(names) or "this command"
    given = {
        name
        for name in (*HOST_FLAGS, "json", "playbook", "command-timeout", "dry")
        if name in args and args[name].value not in (None, False, "", [])
    }
    for name in sorted(given & {"json", "playbook"}):
        if not program.core.remainder and not any(name in ctx.args for ctx in tasks):
            return f"{_flag(args[name])}: {doing} takes no {name} option"
    if "command-timeout" in given and "run" not in names:
        return (
            "-T/--command-timeout is the ad-hoc command's "
            f"timeout (`run`, or `fleet -H HOST -- CMD`); {doing} "
            "has its own limits (see each task's --help)"
        )
    if given & set(HOST_FLAGS) and not hosts and not program.core.remainder:
        return (
            f"{_flag(args[min(given & set(HOST_FLAGS))])} is for tasks on hosts; {doing} runs none"
        )
    writes = [ctx.name for ctx in tasks if ctx.name in ("init", *LAB_WRITES)]
    if "dry" in given and writes:
        return f"-R/--dry: {', '.join(writes)} has no check mode (it is not a task on hosts)"
    return None


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
