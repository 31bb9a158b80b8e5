"""Fabric executor for fleetops (set in fabric.yaml as tasks.executor_class).

Stock `fab -H a,b t1 t2` runs task-major, one new connection per task and host, one host at a time.
This runs host-major: every host runs its own chain t1 → t2 on one shared connection, hosts run
concurrently, a failure stops only that host's chain, and one recap and exit status close the run.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

import fabric
from invoke import Call
from invoke.exceptions import Exit

from . import invocation
from .fabtasks import is_fleet_task
from .inventory import Host, UnknownHost
from .results import EXIT_USAGE, Result, exit_status
from .rollout import DEFAULT_FORKS, Step, run_fleet
from .tasks import fleet_sections, plan_for
from .transport import COUNTERS
from .yamlsrc import ConfigError


class FleetExecutor(fabric.Executor):
    def execute(self, *tasks):  # type: ignore[override]
        calls = [c if isinstance(c, Call) else Call(task=c) for c in self.normalize(tasks)]
        host_str = self.core[0].args.hosts.value if self.core else None
        loaded_from = getattr(self.collection, "loaded_from", None)
        settings = dict(self.config.get("fleetops", {}) or {})
        inv = invocation.current(Path(loaded_from) if loaded_from else Path.cwd(), settings)
        if any(c.kwargs.get("json") for c in calls):
            inv.reporter.json_mode = True
        host_calls = [c for c in calls if is_fleet_task(c)]
        for call in calls:
            if call not in host_calls:
                self._run_local(call)
        if not host_calls:
            return {}
        if not host_str:
            inv.reporter.error(f"{', '.join(c.task.name for c in host_calls)} needs hosts: use -H lab01 "
                               "(inventory names, @group, or user@host)")
            raise Exit(code=EXIT_USAGE)
        try:
            hosts = inv.inventory.expand(host_str.split(","))
            for call in host_calls:  # validate every playbook before any connection
                plan_for(inv, call.task.name, call.kwargs)
        except (ConfigError, UnknownHost) as exc:
            inv.reporter.error(str(exc))
            raise Exit(code=EXIT_USAGE) from None
        forks = int(self._option("forks", "FLEETOPS_FORKS") or settings.get("forks") or DEFAULT_FORKS)
        serial = int(self._option("serial", "FLEETOPS_SERIAL") or 0)
        limit = str(self._option("limit", "FLEETOPS_LIMIT") or "")
        if limit:
            patterns = [p.strip() for p in limit.split(",") if p.strip()]
            hosts = [h for h in hosts if any(fnmatch.fnmatchcase(h.name, p) for p in patterns)]
            if not hosts:
                inv.reporter.error(f"--limit {limit!r} matches none of the selected hosts")
                raise Exit(code=EXIT_USAGE)
        steps = [Step(call.task.name, self._runner(call)) for call in host_calls]
        inv.reporter.live_start([h.name for h in hosts])
        try:
            run_fleet(inv, hosts, steps, forks, serial)
            inv.reporter.live_stop()
            code = exit_status(inv.results)
            extra = {"counters": COUNTERS.per_host} if os.environ.get("FLEETOPS_TRACE") or inv.reporter.json_mode \
                else None
            inv.reporter.finish(inv.results, code, extra, fleet_sections(inv.results))
            if os.environ.get("FLEETOPS_TRACE") and not inv.reporter.json_mode:
                for name, row in COUNTERS.per_host.items():
                    inv.reporter.note(f"trace {name}: {row['connections']} connections, {row['execs']} execs, "
                                      f"{row['uploads']} uploads")
        finally:
            inv.reporter.live_stop()
            invocation.reset()
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

    def _runner(self, call: Call):
        def run(host: Host) -> Result | None:
            context = self.parameterize(call, {"host": host.name}).make_context(self.config)
            return call.task(context, *call.args, **call.kwargs)

        return run

    def _run_local(self, call: Call) -> None:
        self.config.load_collection(self.collection.configuration(call.called_as))
        self.config.load_shell_env()
        call.task(call.make_context(self.config), *call.args, **call.kwargs)
