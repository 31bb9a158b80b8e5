"""The node family's answers: ping's (which python runs the agent)."""

from __future__ import annotations

from dataclasses import dataclass

from . import Payload, declare


@declare
@dataclass(frozen=True)
class Ping(Payload):
    of_tasks = ("ping",)
    python: str
    version: str
