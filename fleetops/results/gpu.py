"""The gpu family's answers: the preflight gate's verdict on a host's GPUs, and a node's facts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import Next, Payload, declare, optional
from .table import Table


@declare
@dataclass(frozen=True)
class GpuGate(Payload):
    """The gate's verdict word (OK / WARN / CRITICAL / UNKNOWN), the GPUs as nvidia-smi told them,
    who holds the busy ones, and the one next action. `waited_s` once it was polled; `simulated` for
    a lab node's replay."""

    of_tasks = ("gpu",)
    table: Table
    gpus: list[dict[str, Any]]
    holders: list[str]
    error_kind: str | None
    verdict: str
    next: Next | None
    waited_s: float | None = optional()
    simulated: bool | None = optional()


@dataclass(frozen=True)
class AllocationGpus(Payload):
    """gpu on a Slurm login node: the job's tasks as Slurm lists them and, once read inside the
    allocation with srun, the gate's verdict there (`verdict` and the rest are None before)."""

    tasks: list[dict[str, Any]]
    error_kind: str | None = optional()
    node: str | None = optional()
    task_job_id: str | None = optional()
    srun_argv: list[str] | None = optional()
    gpus: list[dict[str, Any]] | None = optional()
    verdict: str | None = optional()
    table: Table | None = optional()


@declare
@dataclass(frozen=True)
class Facts(Payload):
    """What the node runs (facts' answer) and its row of the fleet's facts table; `next` when a
    reader failed."""

    of_tasks = ("facts",)
    facts: dict[str, Any]
    fact_row: list[str]
    next: Next | None = optional()
