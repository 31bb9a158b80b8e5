"""verify's answer: which playbook it checked and, when a check failed, what to run next (each check
is an item of the result, with its evidence)."""

from __future__ import annotations

from dataclasses import dataclass

from . import Next, Payload, declare, optional


@declare
@dataclass(frozen=True)
class Verification(Payload):
    of_tasks = ("verify",)
    playbook: str | None
    next: Next | None = optional()
