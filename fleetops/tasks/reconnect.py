"""A `tail` that outlives a dropped link, for SSH jobs and Slurm alike: the same waits, limit and
note."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    from ..results import Result
    from ..wire.connector import Connector, TransportError

TAIL_WAIT_S = 2.0
RECONNECT_MAX_S = 600.0
LOST_KINDS = ("lost", "unreachable", "timeout")


class Reconnect:
    """Doubling waits (0.5 s up to 8 s) while a link stays lost, given up RECONNECT_MAX_S after it
    was lost."""

    def __init__(self, interrupted: threading.Event | None = None) -> None:
        # the run's Ctrl-C: then the link was closed on purpose, not lost
        self.interrupted = interrupted
        self.lost_since: float | None = None
        self.backoff = 0.5
        self.count = 0

    def lost(
        self, exc: TransportError, node: Connector, note: Callable[[str], None], resume: str = ""
    ) -> str | None:
        """After `exc`: None once it has waited (call again), or why it gives up. Any other failure
        is raised."""
        if self.interrupted is not None and self.interrupted.is_set():
            return None  # Ctrl-C closed it: the caller detaches on its next turn, and says so
        if exc.kind not in LOST_KINDS:
            raise exc
        self.lost_since = self.lost_since or time.monotonic()
        if time.monotonic() - self.lost_since > RECONNECT_MAX_S:
            return f"gave up reconnecting after {RECONNECT_MAX_S:.0f}s: {exc}"
        note(
            f"{node.host.name} | connection lost ({exc.kind}); reconnecting in "
            f"{self.backoff:.1f}s{resume}"
        )
        node.close()
        time.sleep(self.backoff)
        self.backoff = min(self.backoff * 2, 8.0)
        self.count += 1
        return None

    def back(self) -> None:
        """An answer came: the next loss starts from the shortest wait again."""
        self.lost_since, self.backoff = None, 0.5

    def poll(
        self,
        ask: Callable[[], dict],
        node: Connector,
        note: Callable[[str], None],
        position: dict,
        resume: str = "",
    ) -> dict | Result | None:
        """One tail request over a link that may be lost: its answer; None after a wait, to ask
        again; or the tail's end as a Result (the agent's error, or UNREACHABLE once it gives up,
        with `position`: the job and where its log was left)."""
        from ..results import Result, Status
        from ..wire.connector import TransportError
        from .plan import agent_error

        host = node.host.name
        try:
            answer = ask()
        except TransportError as exc:
            gave_up = self.lost(exc, node, note, resume)
            return (
                Result(host, "tail", Status.UNREACHABLE, gave_up, data=position)
                if gave_up
                else None
            )
        self.back()
        return agent_error(host, "tail", answer) if answer.get("error") else answer


def tail_request(position: dict, attach: tuple[int | None, bool]) -> dict:
    """A tail request from where the last answer left off (`position`: the job and its offsets);
    attaching (no offset yet), the node starts at the last N lines or, from_start, at byte 0."""
    request = {**position, "wait_s": TAIL_WAIT_S}
    if all(v is None for k, v in position.items() if k != "job_id"):
        request.update(last_lines=attach[0], from_start=attach[1])
    return request
