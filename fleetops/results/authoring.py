"""capture's and rebase's answers: the playbook capture wrote; the hunks a rebase moved, the
candidate's checks on the node, the candidate written and the text in it still to review."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import Payload, declare, optional


@declare
@dataclass(frozen=True)
class Captured(Payload):
    of_tasks = ("capture",)
    playbook_path: str
    requires: Any


@declare
@dataclass(frozen=True)
class Rebased(Payload):
    """`checks` once the candidate's callsites and probe ran on the node; `candidate` and `review`
    once it was written."""

    of_tasks = ("rebase",)
    versions: dict[str, Any]
    counts: dict[str, int]
    hunks: list[dict[str, Any]]
    checks: list[dict[str, Any]] | None = optional()
    candidate: str | None = optional()
    review: list[Any] | None = optional()
