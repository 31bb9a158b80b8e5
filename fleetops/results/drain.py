"""drain's and undrain's answers: the node's mark (who, when, why), and a Slurm node's side when it
has one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import Next, Payload, declare, optional


@declare
@dataclass(frozen=True)
class Drained(Payload):
    """`slurm`: the Slurm node's state as sinfo reports it (a host with `slurm_node`); `next`: the
    command that does Slurm's side by hand when Slurm refused it."""

    of_tasks = ("drain",)
    drain: dict[str, Any]
    running_job: dict[str, Any] | None
    slurm: dict[str, Any] | None = optional()
    next: Next | None = optional()


@declare
@dataclass(frozen=True)
class Undrained(Payload):
    of_tasks = ("undrain",)
    was: dict[str, Any] | None
    slurm: dict[str, Any] | None = optional()
    next: Next | None = optional()
