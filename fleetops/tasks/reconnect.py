"""A `tail` that outlives a dropped link, for SSH jobs and Slurm alike: the same waits, limit and note."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    from ..wire.connector import Connector, TransportError

TAIL_WAIT_S = 2.0
RECONNECT_MAX_S = 600.0
LOST_KINDS = ("lost", "unreachable", "timeout")


class Reconnect:
    """Doubling waits (0.5 s up to 8 s) while a link stays lost, given up RECONNECT_MAX_S after it was lost."""

    def __init__(self, interrupted: threading.Event | None = None) -> None:
        self.interrupted = interrupted  # the run's Ctrl-C: then the link was closed on purpose, not lost
        self.lost_since: float | None = None
        self.backoff = 0.5
        self.count = 0

    def lost(self, exc: TransportError, node: Connector, note: Callable[[str], None], resume: str = "") -> str | None:
        """After `exc`: None once it has waited (call again), or why it gives up. Any other failure is raised."""
        if self.interrupted is not None and self.interrupted.is_set():
            return None  # Ctrl-C closed it: the caller detaches on its next turn, and says so
        if exc.kind not in LOST_KINDS:
            raise exc
        self.lost_since = self.lost_since or time.monotonic()
        if time.monotonic() - self.lost_since > RECONNECT_MAX_S:
            return f"gave up reconnecting after {RECONNECT_MAX_S:.0f}s: {exc}"
        note(f"{node.host.name} | connection lost ({exc.kind}); reconnecting in {self.backoff:.1f}s{resume}")
        node.close()
        time.sleep(self.backoff)
        self.backoff = min(self.backoff * 2, 8.0)
        self.count += 1
        return None

    def back(self) -> None:
        """An answer came: the next loss starts from the shortest wait again."""
        self.lost_since, self.backoff = None, 0.5
