"""The job tasks: extract, tail, status, logs, stop and jobs, on any host, through the host's job backend
(backend.py: the interface and the one function that chooses it). `ssh` runs jobs on the node itself, `slurm/`
through a Slurm login node; `shards` splits an extract across hosts; `listing` is the `jobs` table, `findings`
diagnose's reading of the latest job. Each task here is the plan, then the host's backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...plans.yamlsrc import ConfigError
from ...results import Result
from ...wire.connector import Connector
from . import shards, slurm, ssh  # noqa: F401  (importing a backend's module registers it)
from .backend import (
    JobBackend,
    TailFollower,
    backend_for,
    backend_of_record,
    interpret_jobs_list,
    register,
    unregister,
)

if TYPE_CHECKING:
    from ...state import RunState
    from ..plan import Plan

__all__ = ["JobBackend", "TailFollower", "backend_for", "backend_of_record", "interpret_jobs_list", "job_plan",
           "jobs_list_plan", "register", "run_extract", "run_jobs_list", "run_logs", "run_status", "run_stop",
           "run_tail", "unregister"]


def job_plan(op: str, needs_job: bool) -> Callable[[RunState, dict], Plan]:
    def plan(run: RunState, kwargs: dict) -> Plan:
        from ..plan import Plan

        book = None
        name = kwargs.get("job") or "extract"
        try:
            book = run.playbook(kwargs.get("playbook"))
        except ConfigError:
            if needs_job:
                raise
        if needs_job and book is not None and name not in (book.jobs or {}):
            known = ", ".join(sorted(book.jobs or {})) or "none"
            raise ConfigError(book.path, None, f"playbook {book.name!r} has no job {name!r} (jobs: {known})")
        return Plan(op, {}, 120, book, options={**kwargs, "job": name})

    return plan


def jobs_list_plan(run: RunState, kwargs: dict) -> Plan:
    from ..plan import Plan, UsageError

    try:
        limit = int(kwargs.get("last") or 0)
    except ValueError:
        raise UsageError(f"jobs --last {kwargs.get('last')!r}: not a number of jobs") from None
    if limit < 0:
        raise UsageError(f"jobs --last {limit}: must be 0 (all) or more")
    return Plan("jobs_list", {"limit": limit}, 120, None, options=dict(kwargs))


def run_extract(run: RunState, plan: Plan, node: Connector) -> Result:
    return shards.launch(run, plan, node, backend_for(node.host))


def run_status(run: RunState, plan: Plan, node: Connector) -> Result:
    return shards.run_status(run, plan, node, backend_for(node.host))


def run_tail(run: RunState, plan: Plan, node: Connector) -> Result:
    return shards.run_tail(run, plan, node, backend_for(node.host))


def run_logs(run: RunState, plan: Plan, node: Connector) -> Result:
    return backend_for(node.host).logs(run, plan, node)


def run_stop(run: RunState, plan: Plan, node: Connector) -> Result:
    return backend_for(node.host).stop(run, plan, node)


def run_jobs_list(run: RunState, plan: Plan, node: Connector) -> Result:
    return backend_for(node.host).list(run, plan, node)
