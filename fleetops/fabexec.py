"""Fabric executor for fleetops (set in fabric.yaml as tasks.executor_class).

Stock `fab -H a,b t1 t2` runs task-major, one new connection per task and host, one host at a time.
This runs host-major: every host runs its own chain t1 → t2 on one shared connection, hosts run
concurrently, a failure stops only that host's chain, and one recap and exit status close the run.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import fabric
from invoke import Call
from invoke.exceptions import Exit

from . import invocation
from .fabtasks import is_fleet_task
from .inventory import Host, UnknownHost
from .results import EXIT_USAGE, Result, Status, exit_status
from .tasks import fleet_sections, plan_for
from .transport import COUNTERS
from .yamlsrc import ConfigError

DEFAULT_FORKS = 32


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
        forks = int(os.environ.get("FLEETOPS_FORKS") or settings.get("forks") or DEFAULT_FORKS)
        try:
            with ThreadPoolExecutor(max_workers=max(1, min(forks, len(hosts)))) as pool:
                futures = [pool.submit(self._run_chain, h, host_calls, inv) for h in hosts]
                while not all(f.done() for f in futures):
                    try:
                        wait(futures, timeout=0.2)
                    except KeyboardInterrupt:
                        inv.interrupted.set()  # tail detaches, --wait gives up; each host's chain ends cleanly
                for f in futures:
                    f.result()
            code = exit_status(inv.results)
            extra = {"counters": COUNTERS.per_host} if os.environ.get("FLEETOPS_TRACE") or inv.reporter.json_mode \
                else None
            inv.reporter.finish(inv.results, code, extra, fleet_sections(inv.results))
            if os.environ.get("FLEETOPS_TRACE") and not inv.reporter.json_mode:
                for name, row in COUNTERS.per_host.items():
                    inv.reporter.note(f"trace {name}: {row['connections']} connections, {row['execs']} execs, "
                                      f"{row['uploads']} uploads")
        finally:
            invocation.reset()
        if code:
            raise Exit(code=code)
        return {}

    def _run_chain(self, host: Host, calls: list[Call], inv: invocation.Invocation) -> None:
        failed_at: str | None = None
        for call in calls:
            if inv.interrupted.is_set() and not failed_at:
                failed_at = "an interrupt (Ctrl-C)"
            if failed_at:
                inv.record(Result(host.name, call.task.name, Status.SKIPPED,
                                  f"skipped: {failed_at} failed on this host"))
                continue
            context = self.parameterize(call, {"host": host.name}).make_context(self.config)
            result = call.task(context, *call.args, **call.kwargs)
            if isinstance(result, Result) and result.failed:
                failed_at = call.task.name

    def _run_local(self, call: Call) -> None:
        self.config.load_collection(self.collection.configuration(call.called_as))
        self.config.load_shell_env()
        call.task(call.make_context(self.config), *call.args, **call.kwargs)
