"""`fab` and `fleet`: Fabric's `fab` with fleet options (same tasks, same syntax, same fabfile).

    fab -H @lab --serial 1 patch verify
    fab -H @gpus --limit 'gpu0*' --forks 8 gpu --wait 600
    fab -H lab01,lab02 -- uname -a            # Fabric's ad-hoc form, through the inventory (the `run` task)
    fab --inventory staging/ -H @gpus ping

Installing fleetops installs this program as `fab` (over Fabric's own script, which fleetops depends on) and
as `fleet`. Why its own `fab`: Fabric's loads no fabfile and no fabric.yaml for `fab -H x -- cmd` (a command
and no task), so that command would bypass the inventory, the host-key policy and the audit log; and its
core flags cannot include --serial/--limit/--forks/--inventory. In a project whose fabfile has no fleetops
tasks, this program behaves exactly like Fabric's (FleetExecutor hands such runs to fabric.Executor).
Stock Fabric (`python -m fabric`) still runs every fleetops task; only the two points above need this one.
"""

from __future__ import annotations

import os
import sys

from fabric import Config
from fabric import __version__ as fabric_version
from fabric.main import Fab
from invoke import Argument
from invoke.exceptions import Exit, ParseError
from invoke.parser import Parser, ParserContext
from invoke.program import Program

from .fab.executor import FleetExecutor
from .fab.usage import usage_exit
from .results import EXIT_USAGE


class Fleet(Fab):
    _named: set[str] | None = None  # the words of the command line while parse_tasks runs (_make_parser)

    def load_collection(self) -> None:
        # Fabric skips the project for `-- cmd` alone; this loads it, so the command goes through the
        # inventory, strict host keys and the audit log (the executor turns it into the `run` task).
        try:
            Program.load_collection(self)
        except Exit as exc:
            if "Can't find any collection" not in str(exc.message or ""):
                raise
            where = self.args["search-root"].value or os.getcwd()
            print(f"{self.binary}: no fabfile.py in {where} or any folder above it: run it from the fleetops "
                  f"project (or a folder inside it), or name the project with `{self.binary} -r PATH/TO/PROJECT "
                  "...`", file=sys.stderr)
            raise Exit(code=EXIT_USAGE) from None

    def parse_core(self, *args, **kwargs) -> None:  # type: ignore[override]
        try:
            super().parse_core(*args, **kwargs)
        except ParseError as exc:
            raise usage_exit(self, exc) from None
        except ValueError as exc:
            raise usage_exit(self, ParseError(f"bad option value ({exc})")) from None

    def parse_tasks(self) -> None:
        help_for = self.args.help.value if "help" in self.args else None
        self._named = {*self.core.unparsed, *([help_for] if isinstance(help_for, str) else [])}
        try:
            super().parse_tasks()
        except ParseError as exc:
            raise usage_exit(self, exc) from None
        except ValueError as exc:  # Invoke casts `--serial abc` with int() and lets the ValueError out
            raise usage_exit(self, ParseError(f"bad option value ({exc})")) from None

    def _make_parser(self) -> Parser:
        """Invoke builds a parser context for every task of the collection, then deep-copies them all (and
        formats their repr for a debug line) on every parse: ~10 ms of each run's start-up for ~40 tasks. A
        parse only ever looks up the words typed, so contexts for the tasks the command line names (or asks
        --help for) parse it the same, with the same errors. Shell completion, which lists every task, gets
        Invoke's full parser (it calls this outside parse_tasks)."""
        named, self._named = self._named, None
        if named is None or self.collection is None:
            return super()._make_parser()
        ignore = self.config.tasks.ignore_unknown_help
        contexts = [ParserContext(name=primary, aliases=aliases,
                                  args=self.collection[primary].get_arguments(ignore_unknown_help=ignore))
                    for primary, aliases in self.collection.task_names.items()
                    if primary in named or any(alias in named for alias in aliases)]
        return Parser(initial=self.initial_context, contexts=contexts)

    def core_args(self):  # type: ignore[override]
        return super().core_args() + [
            Argument(names=("serial",), kind=int, default=0,
                     help="roll out in batches of N hosts; a batch with a failure stops the roll-out"),
            Argument(names=("limit",), kind=str, default="",
                     help="only hosts whose names match these comma-separated patterns (fnmatch)"),
            Argument(names=("forks",), kind=int, default=0, help="hosts worked on at once (default 32)"),
            Argument(names=("no-fold",), kind=bool, default=False,
                     help="one block per host, even when many hosts answer the same (env FLEETOPS_FOLD=0)"),
            Argument(names=("odd",), kind=bool, default=False,
                     help="show each minority group's output as a diff against the majority's"),
            Argument(names=("verbose", "v"), kind=bool, default=False,
                     help="everything each host answered, passing checks too (default: what failed, and what "
                          "to run next)"),
            Argument(names=("inventory",), kind=str, default="",
                     help="inventory directory or .yaml file (env FLEETOPS_INVENTORY); not -i, which is "
                          "Fabric's SSH identity file"),
        ]

    def print_version(self) -> None:
        self.version = _version()  # read from the installed metadata only here, not on every start-up
        super().print_version()
        print(f"fleetops (Fabric {fabric_version})")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fleetops")
    except PackageNotFoundError:
        return "dev"


program = Fleet(name="fleetops", executor_class=FleetExecutor, config_class=Config, binary="fleet",
                binary_names=["fleet"])
fab_program = Fleet(name="fleetops", executor_class=FleetExecutor, config_class=Config, binary="fab",
                    binary_names=["fab"])


def main() -> None:
    _run_and_exit(program)


def fab_main() -> None:
    _run_and_exit(fab_program)


def _run_and_exit(prog: Program) -> None:
    """Run the program, then end the process without Python's teardown. Tearing down a finished run
    (clearing every module, collecting the connections' objects) cost 0.13-0.18 s of CPU and wall time
    after the last line was printed, more than a whole host's work. By then nothing is left
    to do at exit: the run's pool has joined its workers, every connection is closed, the audit log and
    last-failed are written and closed; only the two streams are flushed here. An exception that is not an
    exit (a bug) still takes Python's usual way out."""
    try:
        prog.run()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed, status 1, as Python does
        sys.stderr.write(f"{code}\n")
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`fab ... | head`): what was read was read
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
