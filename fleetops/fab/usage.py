"""Usage errors exit 2 (the documented status: nothing was contacted), with the task's help hint.

Invoke turns every parse error into exit 1, the status of a failed task. Plain `fab` gives a project no
hook between parsing and exiting, so the fabfile installs this one (`install()`): a ParseError while the
tasks are parsed becomes Exit(2) with a hint, a value its option does not take names the option, and what the
command line cannot mean in fleetops (flags.py) is refused, all before anything is prompted for or contacted.
`fleet` (cli.py) gets the same through its own subclass, which also covers core-flag typos that `fab` parses
before any fabfile is read.

The same hook lets `fab` take the run options and --json before the task, where Fabric users put flags: Fabric
parses its core flags first and leaves the rest, from the first word it does not know, for the tasks; the ones
fleetops' first task takes are moved behind it (`fab --json -H lab01 ping` is `fab -H lab01 ping --json`).

A closed stdout while Invoke prints a listing or help (`fab --list | head`) ends the program quietly, 141.

The project's fabric.yaml is checked (plans/projectfile.py) when Invoke is told where the project is, before it
merges the file into its config: a broken or mistyped file is one line naming file:line and exit 2, under `fab`
(the hook is installed while Invoke imports the fabfile, just before it reads the file) as under `fleet`."""

from __future__ import annotations

import difflib
import inspect
import sys
from typing import Any

from invoke.config import Config
from invoke.exceptions import Exit, ParseError
from invoke.program import Program

from .. import startup
from ..plans.marks import ConfigError
from ..plans.projectfile import check_project_file
from ..results import EXIT_INTERRUPTED, EXIT_USAGE, reader_gone
from . import keyprompt
from .decorators import RUN_OPTIONS, SHORT_FLAGS
from .flags import PTY_IN_FAB, UNUSED, refusal, runs_fleetops

_installed = False
# Options that mean something else, or nothing, where they are typed: what to type instead
MEANT = {"--diff": "--diff is the file diff of patch and rollback; the hosts unlike the majority: --odd",
         "--fold": "folding is the default; --no-fold turns it off"}
# The options that may come before the task, moved behind it (every host task takes them)
MOVABLE = {*RUN_OPTIONS, "json", "playbook"}


def usage_exit(program: Any, exc: ParseError) -> Exit:
    context = getattr(exc, "context", None)
    return refuse(program, str(exc), getattr(context, "name", None), context)


def refuse(program: Any, message: str, task: str | None = None, context: Any = None) -> Exit:
    # argv[0] may be __main__.py (python -m fabric): name the command the operator knows.
    # The installed `fab` and `fleet` are one class with two names: the name it was built with, else `fab`.
    binary = _binary_of(program)
    word = _unknown_word(message)
    flag = word.startswith("-")
    if word:  # Invoke's "No idea what 'x' is!": said as what the word is not, with the nearest it could be
        message = f"{word!r} is not {f'an option of {task}' if task else 'a core option'}" if flag else \
            f"{word!r} is not a task"
        close = difflib.get_close_matches(word, _flags(program, context) if flag else _tasks(program), n=1)
        if close:
            message += f" (did you mean `{close[0]}`?)"
    if word in MEANT:
        message += f" ({MEANT[word]})"
    if task and (flag or not word):
        hint = f"see `{binary} --help {task}` for its options"
    else:
        hint = f"see `{binary} --list` for the tasks and `{binary} --help` for the core options"
    return Exit(f"usage error: {message}; {hint}", code=EXIT_USAGE)


def _unknown_word(message: str) -> str:
    head, tail = "No idea what '", "' is!"
    return message[len(head):-len(tail)] if message.startswith(head) and message.endswith(tail) else ""


def _tasks(program: Any) -> list[str]:
    collection = getattr(program, "collection", None)
    if collection is None:
        return []
    return [name for primary, aliases in collection.task_names.items() for name in (primary, *aliases)]


def _flags(program: Any, context: Any) -> list[str]:
    """The flags the word could have meant: the task's (`--nodes`), else the program's core flags."""
    context = context or getattr(program, "initial_context", None)
    if context is None:
        return []
    return [*getattr(context, "flags", {}), *getattr(context, "inverse_flags", {})]


def bad_number(program: Any, exc: ValueError) -> Exit:
    """Invoke's int() of an option's value failed (`--threshold lots`): the option and the value, named."""
    words = list(getattr(program, "argv", None) or [])[1:]
    kinds = _int_flags(program)
    tasks = set(getattr(getattr(program, "parser", None), "contexts", {}))
    task = None  # the task whose option it is: the last task named before it
    for i, word in enumerate(words):
        task = word if word in tasks else task
        flag, eq, value = word.partition("=")
        if flag not in kinds or not (eq or i + 1 < len(words)):
            continue
        value = value if eq else words[i + 1]
        try:
            int(value)
        except ValueError:
            return refuse(program, f"{kinds[flag]} {value!r} is not a whole number", task)
    return refuse(program, f"bad option value ({exc})")


def _int_flags(program: Any) -> dict[str, str]:
    """Every whole-number flag the parse knew, as typed (`--lines`, `-t`) → its names (`-t/--connect-timeout`)."""
    contexts = [getattr(program, "initial_context", None)]
    parser = getattr(program, "parser", None)
    contexts += list(getattr(parser, "contexts", {}).values()) if parser is not None else []
    out: dict[str, str] = {}
    for ctx in filter(None, contexts):
        for arg in ctx.args.values():
            if arg.kind is int:
                typed = [f"-{n}" if len(n) == 1 else f"--{n}" for n in arg.names]
                out.update((t, "/".join(sorted(typed, key=len))) for t in typed)
    return out


def options_first(program: Any) -> None:
    """The run options and --json given before the first task, moved behind it when that task takes them."""
    words = program.core.unparsed
    names = {n for primary, aliases in program.collection.task_names.items() for n in (primary, *aliases)}
    at = next((i for i, w in enumerate(words) if w in names), None)
    body = program.collection[words[at]].body if at else None
    if not getattr(body, "__module__", "").startswith("fleetops."):  # a fabfile's own task: Fabric's ways
        return
    params = inspect.signature(body).parameters
    takes = {name: not isinstance(params[name].default, bool) for name in MOVABLE if name in params}
    kept, moved, i = [], [], 0
    while i < at:
        flag, eq, _ = words[i].partition("=")
        name = _param(flag)
        if name in takes:
            width = 2 if takes[name] and not eq else 1
            moved += words[i:i + width]
            i += width
        else:
            kept.append(words[i])
            i += 1
    program.core.unparsed[:] = [*kept, words[at], *moved, *words[at + 1:]]


def _param(flag: str) -> str | None:
    if flag.startswith("--"):
        return flag[2:].replace("-", "_")
    return next((name for name, short in SHORT_FLAGS.items() if flag == f"-{short}"), None)


def checked_parse(program: Any, parse: Any) -> None:
    """Run Invoke's task parse (`parse`), its errors and what fleetops refuses as usage errors (exit 2)."""
    try:
        if program.collection is not None:
            options_first(program)
        parse()
    except ParseError as exc:
        args = program.args
        if "pty" in args and args.pty.value and "playbook" not in args:  # `fab -p PLAYBOOK ...`: -p was --pty
            raise refuse(program, UNUSED["pty"] + PTY_IN_FAB) from None
        raise usage_exit(program, exc) from None
    except ValueError as exc:  # Invoke casts `--serial abc` with int() and lets the ValueError out
        raise bad_number(program, exc) from None
    refused = refusal(program)
    if refused is not None:
        raise refuse(program, *refused)
    if runs_fleetops(program):
        keyprompt.take(program)


def _running_as_program() -> bool:
    """`fab`, `fleet` or `python -m fabric`, not a test or a script that imports the fabfile."""
    parts = sys.argv[0].replace("\\", "/").split("/")[-2:] if sys.argv and sys.argv[0] else []
    return bool(parts) and (parts[-1] in ("fab", "fleet") or parts == ["fabric", "__main__.py"])


def _program_name() -> str:
    return "fleet" if sys.argv and sys.argv[0].rsplit("/", 1)[-1] == "fleet" else "fab"


def _binary_of(program: Any) -> str:
    """Invoke's public `binary`: the name the program was built with, else argv[0]'s, which is no command's
    name under `python -m fabric`."""
    try:
        name = program.binary
    except (AttributeError, TypeError, IndexError):  # no argv to read a name from
        return "fab"
    return name if isinstance(name, str) and name and not name.endswith(".py") else "fab"


def project_file_exit(binary: str, folder: str | None, config: Any) -> Exit | None:
    """The Exit (status 2, one line) for the project's fabric.yaml in `folder` that Invoke could not merge into
    `config` or fleetops could not read; None when it is sound."""
    if not folder:
        return None
    try:
        check_project_file(folder, config.global_defaults())
    except ConfigError as exc:
        return Exit(f"{binary}: {exc}", code=EXIT_USAGE)
    return None


def install() -> None:
    """Make task parse errors exit 2 for this process, a closed stdout under a listing exit 141, a broken
    fabric.yaml one line and exit 2, and Ctrl-C outside a run's own handling exit 130 (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    # `fab` reaches fleetops' code first here, while Invoke loads the fabfile: from now on Ctrl-C before the run
    # starts is one line and exit 130 (startup.py), as with `fleet` from its first line.
    if _running_as_program():
        startup.guard_interrupts()
    original, cleanup, tasks = Program.parse_tasks, Program.parse_cleanup, Program.execute
    locate = Config.set_project_location

    def set_project_location(self: Config, path: Any) -> None:
        # Invoke calls this with the fabfile's folder right before load_project() merges its fabric.yaml.
        refused = project_file_exit(_program_name(), path, self)
        if refused is not None:
            raise refused
        locate(self, path)

    def parse_tasks(self: Program) -> None:
        checked_parse(self, lambda: original(self))

    def execute(self: Program) -> None:
        # Invoke turns a KeyboardInterrupt into exit 1 with nothing said; README's status for Ctrl-C is 130. The
        # run handles its own (run.py); this is a local task's (lab.up, history) and the moments around a run.
        try:
            tasks(self)
        except KeyboardInterrupt:
            raise Exit("interrupted (Ctrl-C)", code=EXIT_INTERRUPTED) from None

    def parse_cleanup(self: Program) -> None:
        try:
            cleanup(self)
        except BrokenPipeError:  # `fab --list | head`: the reader has what it wanted
            raise Exit(code=reader_gone(sys.stdout)) from None

    Program.parse_tasks = parse_tasks  # type: ignore[method-assign]
    Program.parse_cleanup = parse_cleanup  # type: ignore[method-assign]
    Program.execute = execute  # type: ignore[method-assign]
    Config.set_project_location = set_project_location  # type: ignore[method-assign]
