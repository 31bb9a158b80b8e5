"""Answers any family may give instead of its own: the node's agent refused (its error), or the node
is drained."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import Next, Payload


@dataclass(frozen=True)
class AgentRefusal(Payload):
    """The node agent's error: its words are the result's message."""

    own = False


@dataclass(frozen=True)
class KindedRefusal(AgentRefusal):
    """The node agent's error and its kind (None when the node named none), for the tasks whose
    readers key on it."""

    error_kind: str | None


@dataclass(frozen=True)
class DrainedRefusal(Payload):
    """Work refused on a drained node: its mark (who, when, why) and the command that puts it
    back."""

    own = False

    error_kind: str = field(default="drained", kw_only=True)
    drain: dict[str, Any]
    next: Next
