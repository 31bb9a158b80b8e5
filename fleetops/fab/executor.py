"""Fabric executor for fleetops (set in fabric.yaml as tasks.executor_class).

Stock `fab -H a,b t1 t2` runs task-major, one new connection per task and host, one host at a time.
This runs host-major: every host runs its own chain t1 → t2 on one shared connection, hosts run
concurrently, a failure stops only that host's chain, and one recap and exit status close the run.
The run itself is made and carried out by fleetops.run (assemble, execute), as for the library.

Fabric's ad-hoc form (`fleet -H lab01 -- uname -a`, or `fab ... -- cmd` after tasks) becomes the
`run` task: the same inventory, host keys, example guard and audit log as every other task.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from invoke import Call, Executor
from invoke.exceptions import Exit

from .. import startup
from ..results import EXIT_INTERRUPTED, EXIT_USAGE, reader_gone
from . import keyprompt, usage
from .become import ask_become_pass
from .decorators import RUN_OPTIONS, fleet_task_name, run_options_of
from .flags import is_fleetops_collection, refusal
from .keyprompt import ask_key_passphrase


@dataclass
class ParsedCommand:
    """The parsed command line as flags.refusal reads it from a program (`fleet`), here from what
    Fabric's program hands its executor: the core flags, the tasks' parser contexts, the
    collection."""

    args: Any
    tasks: list
    collection: Any
    core: Any
    binary: str


# The run itself (fleetops.run: the tasks, the plans, the report with rich) is imported by execute()
# when a command names a host task: `fab --list`, `fab --help` and the local tasks (lab.*, history)
# never load it.


class FleetExecutor(Executor):
    """Invoke's Executor: `fleet` and a fabfile of fleetops' tasks run each host's chain here,
    without Fabric's connection code (imported by the wire once a host is connected to). A fabfile
    of Fabric's own tasks, in a project whose fabric.yaml names this executor, gets Fabric's
    executor, as if it were named."""

    def execute(self, *tasks):  # type: ignore[override]
        usage.pipe_as_python_has_it()
        # Invoke turns a KeyboardInterrupt into exit 1 with nothing said; README's status for Ctrl-C
        # is 130. The run handles its own (run.py); this is a local task's (lab.up, history) and the
        # moments around a run.
        try:
            if not is_fleetops_collection(self.collection):
                # fabric.yaml names this executor, the fabfile declares no fleetops task: Fabric's
                # ways.
                startup.release()  # its tasks may run for hours: collect as Python normally does
                return _fabrics(self).execute(*tasks)
            self._refuse(tasks)
            return self._execute(tasks)
        # `fab ... | head`, from a print outside the report: the reader has what it wanted
        except BrokenPipeError:
            raise Exit(code=reader_gone(sys.stdout)) from None
        except KeyboardInterrupt:
            raise Exit("interrupted (Ctrl-C)", code=EXIT_INTERRUPTED) from None

    def _refuse(self, tasks: tuple) -> None:
        """What fleetops refuses on the command line (fab/flags.py), before anything is prompted for
        or contacted. `fleet` has refused it while it parsed (usage.checked_parse); Fabric's `fab`
        comes here with it."""
        if self.core is None or getattr(self.core, "fleetops_checked", False):
            return
        parsed = ParsedCommand(self.core[0].args, list(tasks), self.collection, self.core, "fab")
        refused = refusal(parsed)
        if refused is not None:
            raise usage.refuse(parsed, *refused)

    def _execute(self, tasks: tuple) -> dict:
        calls = [c if isinstance(c, Call) else Call(task=c) for c in self.normalize(tasks)]
        loaded_from = getattr(self.collection, "loaded_from", None)
        settings = dict(self.config.get("fleetops", {}) or {})
        root = Path(loaded_from) if loaded_from else Path.cwd()
        # Local tasks (lab.*) find the project through the config, not through a module global.
        # typed str by Invoke
        self.config["fleetops"] = {**settings, "root": str(root)}  # type: ignore[assignment]
        host_calls = [c for c in calls if fleet_task_name(c)]
        for call in calls:
            if call not in host_calls:
                startup.release()  # a local task (lab.up, history, ...) is not start-up
                self._run_local(call)
        run_opts, steps = self._steps(host_calls)
        if not steps:
            return {}
        code = self._run(root, settings, run_opts, steps)
        if code:
            raise Exit(code=code)
        return {}

    def _steps(
        self, host_calls: list[Call]
    ) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
        """The run options given to any task of the command (plain `fab` has no other place for
        them), and each host task with its own options; the ad-hoc command (`-- CMD`) is the `run`
        task. `fleet`'s core --json, -p and -T go to the steps that take them."""
        run_opts: dict[str, Any] = {}
        steps: list[tuple[str, dict[str, Any]]] = []
        for c in host_calls:
            kwargs = dict(c.kwargs)
            for name in run_options_of(c):
                value = kwargs.pop(name, None)
                if value is not None and value != RUN_OPTIONS[name][0]:  # given
                    run_opts[name] = value
            steps.append((fleet_task_name(c) or c.name, kwargs))  # a host call names a fleet task
        # `fleet`'s core flags: the same options before the task
        for name, (default, _) in RUN_OPTIONS.items():
            value = self._option(name.replace("_", "-"), "")
            if name not in run_opts and value is not None and value != default:
                run_opts[name] = value
        remainder = self.core.remainder if self.core is not None else ""
        if remainder:
            steps.append(("run", {"command": remainder}))
        self._core_to_steps(steps)
        return run_opts, steps

    def _core_to_steps(self, steps: list[tuple[str, dict[str, Any]]]) -> None:
        """`fleet`'s core --json to every step, -p to those that take a playbook and were given
        none, -T to the ad-hoc command when it has no timeout of its own."""
        core = {name: self._option(name, "") for name in ("json", "playbook", "command-timeout")}
        for name, kwargs in steps:
            if core["json"]:
                kwargs["json"] = True  # every host task takes --json
            if core["playbook"] and "playbook" in kwargs and not kwargs["playbook"]:
                kwargs["playbook"] = core["playbook"]
            if core["command-timeout"] and name == "run" and kwargs.get("timeout") is None:
                kwargs["timeout"] = core["command-timeout"]

    def _run(self, root: Path, settings: dict, run_opts: dict[str, Any], steps: list) -> int:
        names = ", ".join(name for name, _ in steps)
        from ..plans.host import UnknownHost
        from ..plans.hostrange import RangeError
        from ..plans.yamlsrc import ConfigError
        from ..report.console import Reporter
        from ..run import UsageError, assemble, execute
        from ..state import RunState

        json_mode = any(kw.get("json") for _, kw in steps)
        try:
            self._choose_inventory(root, settings, run_opts)
        except ConfigError as exc:
            Reporter(json_mode).error(str(exc))
            raise Exit(code=EXIT_USAGE) from None
        state = RunState(root, settings)
        state.reporter.json_mode = state.reporter.json_mode or json_mode
        state.reporter.verbose = bool(run_opts.get("verbose") or self._option("verbose", ""))
        host_str = self._hosts_given(state, names)
        try:
            _job_ids(steps)
            forks, serial = self._numbers(settings, run_opts)
            self._connect_settings(state, run_opts)
            run = assemble(state, [host_str], steps, limit=self._limit(run_opts), dry=self._dry())
            # an example inventory's host: bad input, before any connection
            state.inventory.targets(run.hosts)
            # before the become password: both may come from stdin, in this order
            if keyprompt.requested():
                state.key_passphrases(run.hosts, ask_key_passphrase)
            if run_opts.get("ask_become_pass"):
                self._become_password(state, run.hosts)
        # a file or a host name: the message names it
        except (ConfigError, UnknownHost, RangeError) as exc:
            state.reporter.error(str(exc))
            raise Exit(code=EXIT_USAGE) from None
        # the command line itself: point at the task's options
        except (UsageError, ValueError) as exc:
            state.reporter.error(f"{exc}; see `{self._binary()} --help {names.split(', ')[0]}`")
            raise Exit(code=EXIT_USAGE) from None
        # --no-fold / --odd: task options (any task of the command), or core flags where the program
        # has them
        no_fold = bool(run_opts.get("no_fold") or self._option("no-fold", ""))
        odd = bool(run_opts.get("odd") or self._option("odd", ""))
        return execute(
            run,
            forks,
            serial,
            fold=False if no_fold else None,
            odd=odd,
            command=list(sys.argv),
            reports=self._reports(run_opts),
        )

    def _hosts_given(self, state: Any, names: str) -> str:
        """-H's value; a usage error (EXIT_USAGE) when it names no host."""
        from ..plans.hostrange import split_words

        host_str = self.core[0].args.hosts.value if self.core else None
        if host_str and split_words(host_str):
            return str(host_str)
        # none given, or `-H ,`
        named = f"-H {host_str!r} names no host" if host_str else f"{names} needs hosts"
        state.reporter.error(
            f"{named}: use -H lab01 (inventory names, @group, globs, or user@host:port for a "
            "host outside the inventory whose key is in known_hosts), comma-separated"
        )
        raise Exit(code=EXIT_USAGE)

    def _reports(self, run_opts: dict[str, Any]) -> dict[str, str]:
        """--metrics and --junit: a task's option, or the core flag."""
        reports = {
            kind: run_opts.get(kind) or self._option(kind, "") for kind in ("metrics", "junit")
        }
        return {kind: str(path) for kind, path in reports.items() if path}

    def _numbers(self, settings: dict, run_opts: dict[str, Any]) -> tuple[int, int]:
        """(forks, serial): the command line, else the environment (FLEETOPS_FORKS,
        FLEETOPS_SERIAL), else fabric.yaml's fleetops.forks; each checked (BadValue names where a
        bad one came from)."""
        from ..plans.options import configured_forks, from_environment

        env = from_environment(os.environ)
        forks = (
            self._option("forks", "")
            or run_opts.get("forks")
            or configured_forks(os.environ, settings)
        )
        serial = self._option("serial", "") or run_opts.get("serial") or env.get("serial") or 0
        return int(forks), int(serial)

    def _connect_settings(self, state: Any, run_opts: dict[str, Any]) -> None:
        """ssh_config (-S), and what the command line says for every host of the run: -u/--user,
        --port, -i, -t/--connect-timeout (plans/host.py CommandLine: it wins over the inventory, as
        with ssh)."""
        from ..plans.host import CommandLine
        from ..run import UsageError
        from ..wire.transports import TRANSPORTS

        keys = self.config.connect_kwargs.get("key_filename") or []
        state.transport = run_opts.get("transport") or None
        if state.transport is not None and state.transport not in TRANSPORTS:
            raise UsageError(
                f"--transport {state.transport!r}: choose one of {', '.join(TRANSPORTS)}"
            )
        state.use_ssh_config(
            self._option("ssh-config", ""),
            [keys] if isinstance(keys, str) else list(keys),
            # --prompt-for-passphrase
            self.config.connect_kwargs.get("passphrase"),
        )
        state.inventory.allow_insecure_venv = bool(run_opts.get("allow_insecure_venv"))
        state.inventory.command_line = CommandLine(
            user=self._option("user", "") or run_opts.get("user"),
            port=self._option("port", "") or run_opts.get("port"),
            identity_files=tuple(str(k) for k in self._option("identity", "") or []),
            connect_timeout=self._option("connect-timeout", ""),
        )

    @staticmethod
    def _become_password(state: Any, hosts: list) -> None:
        """--ask-become-pass: asked once, only when a host of this run logs in with `become:`; a
        password no host would use is not asked for (a script piping one in would hang or lose its
        stdin otherwise)."""
        if any(getattr(h, "become", None) for h in hosts):
            state.inventory.become_password = ask_become_pass()
        else:
            state.reporter.note(
                "--ask-become-pass: no host of this run has `become: sudo`; no password asked"
            )

    def _limit(self, run_opts: dict[str, Any]) -> str:
        return str(self._option("limit", "FLEETOPS_LIMIT") or run_opts.get("limit") or "")

    def _dry(self) -> bool:
        return bool(self._option("dry", ""))

    def _binary(self) -> str:
        return "fleet" if sys.argv and Path(sys.argv[0]).name == "fleet" else "fab"

    def _choose_inventory(self, root: Path, settings: dict, run_opts: dict[str, Any]) -> None:
        """--inventory (a task option, or `fleet --inventory`), else FLEETOPS_INVENTORY, else
        fabric.yaml. The resolved path replaces the setting RunState loads it from (an absolute path
        stays itself)."""
        from ..plans.inventory import find_inventory

        override = str(self._option("inventory", "") or run_opts.get("inventory") or "") or None
        settings["inventory"] = str(
            find_inventory(root, override, settings.get("inventory", "hosts"))
        )

    def _option(self, name: str, env: str) -> Any:
        """A core flag if the program has it and it was given, else the environment (so plain `fab`
        can use it)."""
        try:
            args = self.core[0].args if self.core else {}
            # `in` and [] know the aliases (-t), get() not
            value = args[name].value if name in args else None
        except (AttributeError, IndexError):
            value = None
        return value or (os.environ.get(env) if env else None)

    def _run_local(self, call: Call) -> None:
        self.config.load_collection(self.collection.configuration(call.called_as))
        self.config.load_shell_env()
        kwargs = dict(call.kwargs)
        # -H for connections, disconnect
        self.config.fleetops["cli_hosts"] = self._option("hosts", "") or ""
        for name in ("json", "playbook"):  # `fleet --json history`: a core flag the task takes
            if name in kwargs and not kwargs[name] and self._option(name, ""):
                kwargs[name] = self._option(name, "")
        call.task(call.make_context(self.config), *call.args, **kwargs)


def _fabrics(executor: Executor) -> Executor:
    """Fabric's own executor for the same collection, config and parsed command line (Fabric's
    program builds it from these three, as Invoke's does)."""
    import fabric

    return fabric.Executor(executor.collection, executor.config, executor.core)


def _job_ids(steps: list[tuple[str, dict[str, Any]]]) -> None:
    """--job-id as typed, blanks around it dropped; one the node would refuse is refused before
    connecting."""
    from ..plans.options import job_id

    for _, kwargs in steps:
        if kwargs.get("job_id") is not None:
            kwargs["job_id"] = job_id("--job-id", kwargs["job_id"])
