"""The job tasks: extract, tail, status, logs, stop and jobs, on any host, through the host's job
backend (backend.py: the interface and the one function that chooses it). `ssh` runs jobs on the
node itself, `slurm/` through a Slurm login node; `shards` splits an extract across hosts; `listing`
is the `jobs` table, `findings` diagnose's reading of the latest job. The tasks are declared in
tasks/deferred.py; each runs here, through the host's backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

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

__all__ = [
    "JobBackend",
    "TailFollower",
    "backend_for",
    "backend_of_record",
    "interpret_jobs_list",
    "register",
    "run_extract",
    "run_jobs_list",
    "run_logs",
    "run_status",
    "run_stop",
    "run_tail",
    "unregister",
]


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
