"""How the client writes a length of time, in one place: a duration (a process's age, a job's
runtime) and a countdown clock (an ETA)."""

from __future__ import annotations


def duration(seconds: float | None) -> str:
    """59s, 2m05s, 1h02m: seconds while they count, minutes with their seconds below two hours, then
    hours."""
    if seconds is None:
        return "?"
    s = max(int(seconds), 0)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def clock(seconds: float | None) -> str:
    """An ETA as a clock: 2:05, 1:02:05."""
    if seconds is None:
        return "-"
    s = max(int(seconds), 0)
    return (
        f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )
