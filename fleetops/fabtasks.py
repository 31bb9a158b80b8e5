"""The bridge from a Fabric task call to fleetops: which host the Connection names, which task to run."""

from __future__ import annotations

from typing import Any

from . import invocation
from .results import Result
from .tasks import host_task as _host_task


def host_task(c: Any, name: str, **kwargs: Any) -> Result:
    host = getattr(c, "original_host", None) or getattr(c, "host", None)
    if not host:
        raise SystemExit(f"{name} needs a host: fab -H <host> {name}")
    return _host_task(invocation.current(), name, host, kwargs)
