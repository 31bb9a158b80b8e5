"""Fabric executor for fleetops (set in fabric.yaml as tasks.executor_class).

Stock `fab -H a,b t1 t2` runs task-major, one new connection per task and host, one host at a time.
This runs host-major: every host runs its own chain t1 → t2 on one shared connection, hosts run
concurrently, a failure stops only that host's chain, and one recap and exit status close the run.
The run itself is made and carried out by fleetops.run (assemble, execute), as for the library.
"""

from __future__ import annotations

import os
from pathlib import Path

import fabric
from invoke import Call
from invoke.exceptions import Exit

from ..plans.inventory import UnknownHost
from ..plans.yamlsrc import ConfigError
from ..results import EXIT_USAGE
from ..rollout import DEFAULT_FORKS
from ..run import UsageError, assemble, execute
from ..state import RunState
from .decorators import fleet_task_name


class FleetExecutor(fabric.Executor):
    def execute(self, *tasks):  # type: ignore[override]
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
                self._run_local(call)
        if not host_calls:
            return {}
        state = RunState(root, settings)
        if any(c.kwargs.get("json") for c in calls):
            state.reporter.json_mode = True
        if not host_str:
            state.reporter.error(f"{', '.join(c.task.name for c in host_calls)} needs hosts: use -H lab01 "
                                 "(inventory names, @group, or user@host)")
            raise Exit(code=EXIT_USAGE)
        limit = str(self._option("limit", "FLEETOPS_LIMIT") or "")
        try:
            run = assemble(state, host_str.split(","), [(fleet_task_name(c), c.kwargs) for c in host_calls],
                           limit=limit)
        except (ConfigError, UnknownHost, UsageError) as exc:
            state.reporter.error(str(exc))
            raise Exit(code=EXIT_USAGE) from None
        forks = int(self._option("forks", "FLEETOPS_FORKS") or settings.get("forks") or DEFAULT_FORKS)
        serial = int(self._option("serial", "FLEETOPS_SERIAL") or 0)
        code = execute(run, forks, serial)
        if code:
            raise Exit(code=code)
        return {}

    def _option(self, name: str, env: str) -> object:
        """A `fleet` core flag if given, else the environment (so plain `fab` can use it too)."""
        try:
            value = self.core[0].args.get(name).value if self.core and self.core[0].args.get(name) else None
        except (AttributeError, IndexError):
            value = None
        return value or os.environ.get(env)

    def _run_local(self, call: Call) -> None:
        self.config.load_collection(self.collection.configuration(call.called_as))
        self.config.load_shell_env()
        call.task(call.make_context(self.config), *call.args, **call.kwargs)

