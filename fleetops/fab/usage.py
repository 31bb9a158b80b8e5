"""Usage errors exit 2 (the documented status: no request was sent to any node), with the task's
help hint; what fleetops needs of the program while it parses and before it runs.

Only public hooks. `fleet` (cli.py) is a subclass of Fabric's program: its parse_tasks runs Invoke's
parse through checked_parse (a ParseError becomes Exit(2) with a hint, a value its option does not
take names the option, and what the command line cannot mean in fleetops, flags.py, is refused), its
config_class checks the project's fabric.yaml before Invoke merges it, and a closed stdout under a
listing ends it quietly (141).

Fabric's own `fab` gives a project two hooks, and fleetops changes nothing of Fabric's beyond them:
the fabfile (at_fabfile_load, below, runs while Invoke imports it) and the collection's
configuration (fabric.yaml names fleetops' executor, which refuses what flags.py refuses before
anything is prompted for or contacted). So with `fab` a word Invoke's parser does not know is
Invoke's own error (exit 1), and the run options go after the task."""

from __future__ import annotations

import difflib
import signal
import sys
from pathlib import Path
from typing import Any

from invoke.exceptions import Exit, ParseError

from .. import startup
from ..plans.marks import ConfigError
from ..plans.projectfile import check_project_file
from ..results import EXIT_USAGE
from . import keyprompt
from .flags import PTY_IN_FAB, UNUSED, refusal, runs_fleetops

# Options that mean something else, or nothing, where they are typed: what to type instead
MEANT = {
    "--diff": "--diff is the file diff of patch and rollback; the hosts unlike the majority: --odd",
    "--fold": "folding is the default; --no-fold turns it off",
}


def usage_exit(program: Any, exc: ParseError) -> Exit:
    context = getattr(exc, "context", None)
    return refuse(program, str(exc), getattr(context, "name", None), context)


def refuse(program: Any, message: str, task: str | None = None, context: Any = None) -> Exit:
    # argv[0] may be __main__.py (python -m fabric): name the command the operator knows. The
    # installed `fab` and `fleet` are one class with two names: the name it was built with, else
    # `fab`.
    binary = _binary_of(program)
    word = _unknown_word(message)
    flag = word.startswith("-")
    # Invoke's "No idea what 'x' is!": said as what the word is not, with the nearest it could be
    if word:
        message = (
            f"{word!r} is not {f'an option of {task}' if task else 'a core option'}"
            if flag
            else f"{word!r} is not a task"
        )
        close = difflib.get_close_matches(
            word, _flags(program, context) if flag else _tasks(program), n=1
        )
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
    return (
        message[len(head) : -len(tail)]
        if message.startswith(head) and message.endswith(tail)
        else ""
    )


def _tasks(program: Any) -> list[str]:
    collection = getattr(program, "collection", None)
    if collection is None:
        return []
    return [
        name for primary, aliases in collection.task_names.items() for name in (primary, *aliases)
    ]


def _flags(program: Any, context: Any) -> list[str]:
    """The flags the word could have meant: the task's (`--nodes`), else the program's core
    flags."""
    context = context or getattr(program, "initial_context", None)
    if context is None:
        return []
    return [*getattr(context, "flags", {}), *getattr(context, "inverse_flags", {})]


def bad_number(program: Any, exc: ValueError) -> Exit:
    """Invoke's int() of an option's value failed (`--threshold lots`): the option and the value,
    named."""
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
    """Every whole-number flag the parse knew, as typed (`--lines`, `-t`) → its names
    (`-t/--connect-timeout`)."""
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


def checked_parse(program: Any, parse: Any) -> None:
    """Run Invoke's task parse (`parse`), its errors and what fleetops refuses as usage errors (exit
    2)."""
    try:
        parse()
    except ParseError as exc:
        args = program.args
        # `fab -p PLAYBOOK ...`: -p was --pty
        if "pty" in args and args.pty.value and "playbook" not in args:
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
    """Invoke's public `binary`: the name the program was built with, else argv[0]'s, which is no
    command's name under `python -m fabric`."""
    try:
        name = program.binary
    except (AttributeError, TypeError, IndexError):  # no argv to read a name from
        return "fab"
    return name if isinstance(name, str) and name and not name.endswith(".py") else "fab"


def project_file_exit(binary: str, folder: str | None, config: Any) -> Exit | None:
    """The Exit (status 2, one line) for the project's fabric.yaml in `folder` that Invoke could not
    merge into `config` or fleetops could not read; None when it is sound."""
    if not folder:
        return None
    try:
        check_project_file(folder, config.global_defaults())
    except ConfigError as exc:
        return Exit(f"{binary}: {exc}", code=EXIT_USAGE)
    return None


def at_fabfile_load(fabfile: str | None) -> None:
    """What `fab` gets from the fabfile (Invoke imports it before it reads the project's fabric.yaml
    and before it parses the tasks): from here Ctrl-C before the run starts is one line and exit 130
    (startup.py), a closed stdout under the task list ends the program as it ends `yes | head`
    (SIGPIPE: the shell says 141; the executor gives Python's handling back before any task runs),
    and a broken or mistyped fabric.yaml next to the fabfile is one line naming file:line and exit 2
    instead of Invoke's traceback. Nothing is done for a script or a test that imports the
    fabfile."""
    if not fabfile or not _running_as_program():
        return
    startup.guard_interrupts()
    try:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # not the main thread, or no SIGPIPE (Windows): Python's own handling
    except (ValueError, AttributeError):
        pass
    from fabric import Config  # already imported by Fabric's program

    folder = Path(fabfile).resolve().parent
    if Path(fabfile).name == "__init__.py":  # a fabfile package: the project is the folder above it
        folder = folder.parent
    refused = project_file_exit(_program_name(), str(folder), Config)
    if refused is not None:
        raise refused


def pipe_as_python_has_it() -> None:
    """SIGPIPE ignored again, as Python starts (a write to a closed stdout is BrokenPipeError): the
    run reports a reader that left (results.reader_gone) and still writes its audit log."""
    try:
        if signal.getsignal(signal.SIGPIPE) == signal.SIG_DFL:
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    except (ValueError, AttributeError):
        pass
