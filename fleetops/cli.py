"""`fleet`: fleetops' own program. Invoke's Program with fleetops' tasks bundled, as Invoke
documents for a program of one's own (Program(namespace=...)): no fabfile is loaded, so it works in
any folder of a project, and `fleet init` in any folder at all. Fabric's core flags that fleetops
honours are declared here (core_args, as Fabric's own program declares them) and its fabric.yaml is
read as Fabric reads it (config_class, FleetConfig): Fabric's program and Config cannot be imported
without Fabric's connection code and paramiko, which a start that connects to nothing (--version,
--help, --list, a usage error) has no use for; the wire imports them when a host is connected to.

    fleet init ops                     # a project: hosts/, playbooks/, fabric.yaml, fabfile.py
    fleet -H @lab --serial 1 patch verify
    fleet -H @gpus --limit 'gpu0*' --forks 8 gpu --wait 600
    fleet -H lab01,lab02 -- uname -a   # Fabric's ad-hoc form, via the inventory (the `run` task)
    fleet --inventory staging/ -H @gpus ping

The project is the nearest folder at or above the working directory (or `-r DIR`) that holds
fabfile.py, as Fabric finds it; its fabric.yaml is read as Fabric reads it. Fabric's own `fab` stays
Fabric's (installing fleetops replaces no other package's script): in a project its one-line fabfile
gives `fab` the same tasks, with the run options after a task. `fleet` is there for what `fab`
cannot do: Fabric's `fab` loads no fabfile and no fabric.yaml for `fab -H x -- cmd` (a command and
no task), so that command would bypass the inventory, the host-key policy and the audit log; its
--help lists Fabric's core flags (printed before any project is read), some of which do nothing in
fleetops (refused when given: fab/flags.py), where `fleet --help` lists only those that work, with
what they do here; its --version names only Fabric's parts.
"""

from __future__ import annotations

import copy
import getpass
import os
import sys
from pathlib import Path
from typing import Any

from invoke import Argument, Collection
from invoke.config import Config, merge_dicts
from invoke.exceptions import Exit, ParseError
from invoke.program import Program

from . import compat, startup
from .fab.decorators import COMMAND_LINE_WINS, RUN_OPTIONS, SHORT_FLAGS
from .fab.executor import FleetExecutor
from .fab.flags import UNUSED
from .fab.usage import bad_number, checked_parse, project_file_exit, usage_exit
from .plans.options import RUN_NUMBERS
from .plans.projectfile import find_project
from .results import EXIT_USAGE, reader_gone

# What `fleet` runs without a project: making one, and the listings.
NEEDS_NO_PROJECT = ("init",)


class FleetConfig(Config):
    """Fabric's configuration as Fabric's Config reads it (fabric.yaml and ~/.fabric.yaml,
    /etc/fabric.yaml, FABRIC_* variables; Fabric's defaults), less its ssh_config loading (the wire
    reads ssh_config itself), with the project's fabric.yaml checked when Invoke is told where the
    project is, before it merges the file: a broken or mistyped file is one line naming file:line
    and exit 2."""

    prefix = "fabric"

    @staticmethod
    def global_defaults() -> dict[str, Any]:
        """Invoke's defaults with Fabric's settings added, as fabric.Config.global_defaults has
        them. Fabric's remote runners are its connection code: named (None) so that fabric.yaml keys
        are checked alike, never run by fleetops, whose tasks go through the node's agent."""
        defaults = Config.global_defaults()
        merge_dicts(
            defaults,
            {
                "authentication": {"identities": [], "strategy_class": None},
                "connect_kwargs": {},
                "forward_agent": False,
                "gateway": None,
                "inline_ssh_env": True,
                "load_ssh_configs": True,
                "port": 22,
                "runners": {"remote": None, "remote_shell": None},
                "ssh_config_path": None,
                "tasks": {"collection_name": "fabfile"},
                "timeouts": {"connect": None},
                "user": _local_user(),
            },
        )
        return defaults

    def set_project_location(self, path: str | None) -> None:  # type: ignore[override]
        refused = project_file_exit("fleet", path, self)
        if refused is not None:
            raise refused
        super().set_project_location(path)


def _local_user() -> str | None:
    """The login name Fabric's config defaults to (fabric.util.get_local_user): getpass's, else
    none."""
    try:
        return getpass.getuser()
    except (KeyError, OSError, ImportError):  # no name for this uid (a container's)
        return None


# Fabric's core flags (fabric.main.Fab.core_args): names, kind, Fabric's help, as Fabric declares
# them. CORE_HELP and _fleets (below) say what they do in fleetops.
FABRIC_CORE_ARGS = (
    (("H", "hosts"), str, "Comma-separated host name(s) to execute tasks against."),
    (
        ("i", "identity"),
        list,
        "Path to runtime SSH identity (key) file. May be given multiple times.",
    ),
    (("list-agent-keys",), bool, "Display ssh-agent key list, and exit."),
    (("prompt-for-login-password",), bool, "Request an upfront SSH-auth password prompt."),
    (("prompt-for-passphrase",), bool, "Request an upfront SSH key passphrase prompt."),
    (("S", "ssh-config"), str, "Path to runtime SSH config file."),
    (("t", "connect-timeout"), int, "Specifies default connection timeout, in seconds."),
)


class Fleet(compat.NamedTasksParser, Program):
    namespace: Collection | None
    collection: Collection
    project: Path | None = None

    def parse_collection(self) -> None:
        """The bundled tasks, loaded from the project's folder: its fabric.yaml read as Fabric reads
        a project's, and the folder the executor and the local tasks work in (the collection's
        loaded_from)."""
        if self.namespace is not None and not self.namespace.task_names:
            # imported once the core flags are read (not for --version)
            from .fab.tasks import fleet_namespace

            self.namespace = fleet_namespace()
        given = self.args["search-root"].value
        self.project = find_project(Path(given) if given else Path.cwd())
        if given and self.project is None:
            raise Exit(
                f"{self.binary}: no fabfile.py in {given} or any folder above it: not a fleetops "
                f"project (`{self.binary} init {given}` makes one)",
                code=EXIT_USAGE,
            )
        if self.project is not None:
            self.config.set_project_location(str(self.project))
            self.config.load_project()
        super().parse_collection()
        # the program's namespace stays as it was built
        self.collection = copy.copy(self.collection)
        self.collection.loaded_from = str(self.project) if self.project else None
        self.scoped_collection = self.collection

    def parse_core(self, *args, **kwargs) -> None:  # type: ignore[override]
        try:
            super().parse_core(*args, **kwargs)
        except ParseError as exc:
            raise usage_exit(self, exc) from None
        except ValueError as exc:  # Invoke casts `--serial abc` with int(): the option is named
            raise bad_number(self, exc) from None
        if self.args["list-agent-keys"].value:  # as Fabric's program lists them, then the end
            from .wire.keys import agent_key_lines

            for line in agent_key_lines():
                print(line)
            raise Exit

    def update_config(self, merge: bool = True) -> None:
        """Invoke's, then -i and -t where Fabric's program puts them (connect_kwargs,
        authentication.identities), winning over fabric.yaml's. Fabric's program also loads
        ssh_config here; the run reads it (-S) itself."""
        super().update_config(merge=merge)
        paths = self.args["identity"].value
        if paths:
            self.config.connect_kwargs["key_filename"] = paths
            self.config.authentication["identities"] = [Path(x) for x in paths]
        if self.args["connect-timeout"].value:
            self.config.connect_kwargs["timeout"] = self.args["connect-timeout"].value

    def no_tasks_given(self) -> None:
        """`fleet -H HOST -- CMD`, a command and no task, is the ad-hoc command (the executor's
        `run`), as in Fabric's program; anything else without a task is Invoke's (the help)."""
        if self.core.unparsed or not self.core.remainder or self.args.complete.value:
            super().no_tasks_given()

    def parse_tasks(self) -> None:
        words = self.core.unparsed
        if words[:1] == ["init"] and all(w.startswith("-") for w in words[1:]):
            # init's help: Invoke's positional DIRECTORY would take the flag
            if {"-h", "--help"} & {*words}:
                self.args.help.value = "init"
                del words[:]
            else:
                # `fleet init` alone: here (Invoke has no optional positional argument)
                words.append(".")
        help_for = self.args.help.value if "help" in self.args else None
        self.named_words = {*words, *([help_for] if isinstance(help_for, str) else [])}
        # Invoke's parse, checked (fab/usage.py): usage errors exit 2, idle flags refused
        checked_parse(self, super().parse_tasks)
        # the executor need not refuse it again
        self.core.fleetops_checked = True  # type: ignore[attr-defined]
        if self.project is None and (
            self.core.remainder or any(c.name not in NEEDS_NO_PROJECT for c in self.tasks)
        ):
            # Before any connection or name lookup: without a project there is no inventory, no
            # host-key policy of its own and no audit log to go through.
            raise Exit(
                f"{self.binary}: no fleetops project in {os.getcwd()} or any folder above it (a "
                f"project is a folder with fabfile.py): make one with `{self.binary} init DIR`, "
                f"or name one with `{self.binary} -r PATH/TO/PROJECT ...`",
                code=EXIT_USAGE,
            )

    def parse_cleanup(self) -> None:
        try:
            super().parse_cleanup()
        except BrokenPipeError:  # `fleet --list | head`: the reader has what it wanted
            raise Exit(code=reader_gone(sys.stdout)) from None

    def core_args(self):  # type: ignore[override]
        # Invoke gives -r/--search-root only to a program that loads its tasks from disk; `fleet`
        # finds the project (its fabric.yaml, inventory, playbooks) with it all the same.
        bundled = [
            Argument(
                names=("search-root", "r"),
                help="the project: this folder or the nearest above it "
                "with fabfile.py (default: here)",
            )
        ]
        fabrics = [
            Argument(names=names, kind=kind, help=text) for names, kind, text in FABRIC_CORE_ARGS
        ]
        return (
            [_fleets(arg) for arg in (*super().core_args(), *fabrics)]
            + (bundled if self.namespace is not None else [])
            + [
                Argument(
                    names=(
                        name.replace("_", "-"),
                        *([SHORT_FLAGS[name]] if name in SHORT_FLAGS else []),
                    ),
                    kind=int if name in RUN_NUMBERS else bool if isinstance(default, bool) else str,
                    default=default,
                    help=text,
                )
                for name, (default, text) in RUN_OPTIONS.items()
            ]
            + [
                Argument(
                    names=("json", "j"),
                    kind=bool,
                    default=False,
                    help=(
                        "one JSON document instead of the report "
                        "(every task takes it, before or after it)"
                    ),
                ),
                Argument(
                    names=("playbook", "p"),
                    kind=str,
                    default="",
                    help="the playbook YAML, for every task of the command that reads one "
                    "(default: fabric.yaml's fleetops.playbook)",
                ),
            ]
        )

    def print_help(self) -> None:
        """Invoke's, without Fabric's flags that do nothing in fleetops (fab/flags.py UNUSED:
        refused if given)."""
        print(f"Usage: {self.binary} [--core-opts] <subcommand> [--subcommand-opts] ...")
        print("")
        print("Core options:")
        print("")
        hidden = tuple(f"--{name}" for name in UNUSED)
        self.print_columns(
            [
                t
                for t in self.initial_context.help_tuples()
                if not any(f"{flag}=" in t[0] or t[0].endswith(flag) for flag in hidden)
            ]
        )
        self.list_tasks()

    def print_version(self) -> None:
        # read from the installed metadata only here, not on every start
        print("\n".join(startup.versions()))


# What Fabric's core flags do in fleetops, in `fleet --help`. Fabric's own help stays in `fab
# --help` (Fabric prints it before any project is read).
CORE_HELP = {
    "dry": "check mode: patch and rollback show what they would change and write nothing; "
    "read-only tasks run as they are; a task that changes things and has no check mode "
    "(run, extract, stop, trust) is refused",
    "identity": "the SSH key to log in with, for every host of "
    f"the run ({COMMAND_LINE_WINS}: it replaces an "
    "inventory host's identity_file; a host outside the inventory tries each one given)",
    "connect-timeout": "seconds to wait for each host's SSH connection and login "
    f"({COMMAND_LINE_WINS}: it replaces "
    "the inventory's connect_timeout)",
    "command-timeout": "seconds before the ad-hoc command (`run`, `fleet -H HOST -- CMD`) is "
    "killed on each host (run --timeout; "
    "default 300); refused with another task",
}


def _fleets(arg: Argument) -> Argument:
    """One of Fabric's core flags as `fleet` has it: help saying what it does in fleetops; -p is
    --playbook, so Fabric's --pty keeps only its long name (hidden, and refused if given)."""
    for name in set(arg.names) & set(CORE_HELP):
        arg.help = CORE_HELP[name]
    if "pty" in arg.names:
        return Argument(names=("pty",), kind=bool, default=False, help=arg.help)
    return arg


# Bundled namespace: an empty one here, fleetops' tasks once parse_collection runs.
program = Fleet(
    name="fleetops",
    namespace=Collection(),
    executor_class=FleetExecutor,
    config_class=FleetConfig,
    binary="fleet",
    binary_names=["fleet"],
)


def main() -> None:
    _run_and_exit(program)


def _run_and_exit(prog: Program) -> None:
    """Run the program, then end the process without Python's teardown. Tearing down a finished run
    (clearing every module, collecting the connections' objects) cost 0.13-0.18 s of CPU and wall
    time after the last line was printed, more than a whole host's work. By then nothing is left to
    do at exit: the run's pool has joined its workers, every connection is closed, the audit log and
    last-failed are written and closed; only the two streams are flushed here. An exception that is
    not an exit (a bug) still takes Python's usual way out."""
    try:
        prog.run()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    except BrokenPipeError:  # `fleet --list | head`: the reader left; what it read was printed
        code = reader_gone(sys.stdout)
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
