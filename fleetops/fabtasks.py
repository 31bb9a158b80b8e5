"""The bridge from a Fabric task call to fleetops: which host the Connection names, which task to run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fabric import task

from . import invocation
from .results import Result
from .tasks import host_task as _host_task


def host_task(c: Any, name: str, **kwargs: Any) -> Result:
    host = getattr(c, "original_host", None) or getattr(c, "host", None)
    if not host:
        raise SystemExit(f"{name} needs a host: fab -H <host> {name}")
    return _host_task(invocation.current(), name, host, kwargs)


def fleet_task(**options: Any) -> Callable[[Callable], Any]:
    """fabric.task for a per-host fleetops task; the executor runs these as per-host chains."""

    def wrap(body: Callable) -> Any:
        body.fleetops_host_task = True  # type: ignore[attr-defined]
        return task(**options)(body)

    return wrap


def is_fleet_task(call: Any) -> bool:
    return bool(getattr(call.task.body, "fleetops_host_task", False))


def show_history(host: str | None, last: int | None, as_json: bool) -> None:
    import json
    import sys

    from . import audit
    from .redaction import redact
    from .report import Reporter, render_table

    records = audit.read(host, last)
    if as_json:
        sys.stdout.write(redact(json.dumps(records, indent=1)) + "\n")
        return
    columns = ["time", "operator", "host", "task", "playbook", "result", "changed", "duration_s", "msg"]
    rows = [[str(r.get(c, "")) if c != "msg" else str(r.get(c, ""))[:60] for c in columns] for r in records]
    title = f"audit log {audit.log_path()}" + (f" (host {host})" if host else "")
    Reporter().console.print(render_table({"title": title, "columns": columns, "rows": rows}))
