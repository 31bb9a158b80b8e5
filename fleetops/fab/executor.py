"""Fabric executor for fleetops (set in fabric.yaml as tasks.executor_class).

Stock `fab -H a,b t1 t2` runs task-major, one new connection per task and host, one host at a time.
This runs host-major: every host runs its own chain t1 → t2 on one shared connection, hosts run
concurrently, a failure stops only that host's chain, and one recap and exit status close the run.
The run itself is made and carried out by fleetops.run (assemble, execute), as for the library.

Fabric's ad-hoc form (`fleet -H lab01 -- uname -a`, or `fab ... -- cmd` after tasks) becomes the `run`
task: the same inventory, host keys, example guard and audit log as every other task.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import fabric
from invoke import Call
from invoke.exceptions import Exit

from .. import startup
from ..results import EXIT_USAGE
from .decorators import RUN_OPTIONS, fleet_task_name, run_options_of

# The run itself (fleetops.run: the tasks, the plans, the report with rich) is imported by execute() when a
# command names a host task: `fab --list`, `fab --help` and the local tasks (lab.*, history) never load it.


class FleetExecutor(fabric.Executor):
    def execute(self, *tasks):  # type: ignore[override]
        if not _is_fleetops_collection(self.collection):
            # fleetops installs this executor's program as `fab`: another project's fabfile keeps Fabric's ways.
            startup.release()  # its tasks may run for hours: collect as Python normally does
            return super().execute(*tasks)
        calls = [c if isinstance(c, Call) else Call(task=c) for c in self.normalize(tasks)]
        host_str = self.core[0].args.hosts.value if self.core else None
        loaded_from = getattr(self.collection, "loaded_from", None)
        settings = dict(self.config.get("fleetops", {}) or {})
        root = Path(loaded_from) if loaded_from else Path.cwd()
        # Local tasks (lab.*) find the project through the config, not through a module global.
        self.config["fleetops"] = {**settings, "root": str(root)}
        host_calls = [c for c in calls if fleet_task_name(c)]
        for call in calls:
            if call not in host_calls:
                startup.release()  # a local task (lab.up, history, ...) is not start-up
                self._run_local(call)
        # Run options given to any task of the command apply to the whole run (plain `fab` has no other place).
        run_opts: dict[str, Any] = {}
        steps = []
        for c in host_calls:
            kwargs = dict(c.kwargs)
            for name in run_options_of(c):
                value = kwargs.pop(name, None)
                if value is not None and value != RUN_OPTIONS[name][0]:  # given (--no-fold gives False)
                    run_opts[name] = value
            steps.append((fleet_task_name(c), kwargs))
        remainder = self.core.remainder if self.core is not None else ""
        if remainder:
            steps.append(("run", {"command": remainder}))
        if not steps:
            return {}
        names = ", ".join(name for name, _ in steps)
        from ..plans.hostrange import RangeError
        from ..plans.inventory import UnknownHost
        from ..plans.yamlsrc import ConfigError
        from ..report.console import Reporter
        from ..rollout import DEFAULT_FORKS
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
        allow_venv = bool(run_opts.get("allow_insecure_venv"))
        if not host_str:
            state.reporter.error(f"{names} needs hosts: use -H lab01 (inventory names, @group, globs, or "
                                 "user@host:port for a host outside the inventory whose key is in known_hosts)")
            raise Exit(code=EXIT_USAGE)
        limit = str(self._option("limit", "FLEETOPS_LIMIT") or run_opts.get("limit") or "")
        dry = bool(self.core[0].args.dry.value) if self.core and self.core[0].args.get("dry") else False
        try:
            keys = self.config.connect_kwargs.get("key_filename") or []
            state.use_ssh_config(self.core[0].args["ssh-config"].value if self.core else None,
                                 [keys] if isinstance(keys, str) else list(keys))
            state.inventory.allow_insecure_venv = allow_venv
            run = assemble(state, [host_str], steps, limit=limit, dry=dry)  # commas split there, not in lab[01,07]
            forks = int(self._option("forks", "FLEETOPS_FORKS") or run_opts.get("forks") or settings.get("forks")
                        or DEFAULT_FORKS)
            serial = int(self._option("serial", "FLEETOPS_SERIAL") or run_opts.get("serial") or 0)
        except (ConfigError, UnknownHost, RangeError) as exc:  # a file or a host name: the message names it
            state.reporter.error(str(exc))
            raise Exit(code=EXIT_USAGE) from None
        except (UsageError, ValueError) as exc:  # the command line itself: point at the task's options
            state.reporter.error(f"{exc}; see `fab --help {names.split(', ')[0]}`")
            raise Exit(code=EXIT_USAGE) from None
        # --no-fold / --odd: task options (any task of the command), or core flags where the program has them
        no_fold = run_opts.get("fold") is False or bool(self._option("no-fold", ""))
        odd = bool(run_opts.get("odd") or run_opts.get("diff") or self._option("odd", ""))
        code = execute(run, forks, serial, fold=False if no_fold else None, odd=odd, command=list(sys.argv))
        if code:
            raise Exit(code=code)
        return {}

    def _choose_inventory(self, root: Path, settings: dict, run_opts: dict[str, Any]) -> None:
        """--inventory (a task option, or `fleet --inventory`), else FLEETOPS_INVENTORY, else fabric.yaml.
        The resolved path replaces the setting RunState loads it from (an absolute path stays itself)."""
        from ..plans.inventory import find_inventory

        override = str(self._option("inventory", "") or run_opts.get("inventory") or "") or None
        settings["inventory"] = str(find_inventory(root, override, settings.get("inventory", "hosts")))

    def _option(self, name: str, env: str) -> object:
        """A `fleet` core flag if given, else the environment (so plain `fab` can use it too)."""
        try:
            value = self.core[0].args.get(name).value if self.core and self.core[0].args.get(name) else None
        except (AttributeError, IndexError):
            value = None
        return value or (os.environ.get(env) if env else None)

    def _run_local(self, call: Call) -> None:
        self.config.load_collection(self.collection.configuration(call.called_as))
        self.config.load_shell_env()
        call.task(call.make_context(self.config), *call.args, **call.kwargs)


def _is_fleetops_collection(collection: Any) -> bool:
    """A fabfile that declares at least one fleetops host task (fabfile.py's @fleet_task)."""
    if collection is None:
        return False
    return any(getattr(task.body, "fleetops_task", None) for task in collection.tasks.values()) or any(
        _is_fleetops_collection(sub) for sub in collection.collections.values())
