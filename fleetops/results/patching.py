"""patch's and rollback's answers: each file is an item of the result (its state, drift and diff in
its details); the payload says whether it was a check, against which playbook, and what to run next
when the set was refused."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import Next, Payload, declare, optional


@declare
@dataclass(frozen=True)
class PatchSet(Payload):
    of_tasks = ("patch", "rollback")
    check_mode: bool
    playbook: str | None
    next: Next | None = optional()


@dataclass(frozen=True)
class VersionsChanged(Payload):
    """The installed versions changed between their approval and the write: nothing written."""

    requirements: Any


@dataclass(frozen=True)
class JobRunningRefusal(Payload):
    """Refused: a job of the node runs from the files (its record), and the command that follows
    it."""

    own = False
    error_kind: str = field(default="job_running", kw_only=True)
    job: dict[str, Any]
    next: Next


@dataclass(frozen=True)
class Interrupted(Payload):
    """Ctrl-C cut the link while the node worked on the set. Once the node was asked afterwards: how
    the set ended (`settled`: written, put back, not written, unfinished, none) and each file's form
    now; `error_kind` is None when the whole set was written before the interrupt reached it."""

    error_kind: str | None = "interrupted"
    settled: str | None = optional()
    forms: dict[str, str] | None = optional()
