"""A Slurm job of the node's job store as the store's readers (`jobs`, `diagnose`) show it: its
state, exit and runtime, read from squeue/sacct's lines and the exit files its tasks wrote the way
`status` reads them (view.py), so a Slurm job is listed and judged like an SSH job."""

from __future__ import annotations

from ....plans import slurm as sp
from . import view as sv

ENDED = ("succeeded", "failed", "killed", "cancelled")


def _end_times(exits: dict) -> list[float]:
    """When each task that wrote its exit file ended."""
    return [
        e["ended_ts"]
        for e in exits.values()
        if isinstance(e, dict) and isinstance(e.get("ended_ts"), (int, float))
    ]


def _exit(word: str, rows: list[dict], ends: list[float]) -> dict | None:
    """The exit of an ended job: the first failing task's, else task 0's; None while it runs or
    when no task recorded one."""
    if word not in ENDED or not rows:
        return None
    failing = ("killed", "failed", "cancelled")
    worst = next((r for r in rows if r["state"] in failing), rows[0])
    if worst.get("exit_code") is None and not worst.get("signal"):
        return None
    ended = {"exit_code": worst.get("exit_code"), "signal": worst.get("signal")}
    if ends:
        ended["ended_ts"] = max(ends)
    return ended


def _runtime(word: str, started: object, ends: list[float], now_ts: object) -> float | None:
    """From submission to the last task's end, or to now while it runs."""
    if not isinstance(started, (int, float)):
        return None
    if word in ENDED and ends:
        return round(max(ends) - started, 1)
    if word == "running" and isinstance(now_ts, (int, float)):
        return round(now_ts - started, 1)
    return None


def read_state(record: dict, query: object, exits: object, now_ts: object = None) -> dict:
    """state (Slurm's word as `status` gives it: pending, running, succeeded, failed, killed,
    cancelled, unknown), exit (the first failing task's, else task 0's; None while it runs or when
    nothing recorded one), runtime_s (from submission to the last task's end, or to now while it
    runs), tasks (each task's view), notes, and end (`status`'s words for how it ended)."""
    exits = exits if isinstance(exits, dict) else {}
    rows = sv.tasks_view(
        {"job": record, "query": query if isinstance(query, dict) else {}, "exits": exits}
    )
    word = sp.overall([r["state"] for r in rows])
    ends = _end_times(exits)
    return {
        "state": word,
        "exit": _exit(word, rows, ends),
        "runtime_s": _runtime(word, record.get("started_ts"), ends, now_ts),
        "tasks": rows,
        "notes": rows[0]["notes"] if rows else [],
        "end": sv.describe(rows, record),
        "cancelled_by": record.get("cancelled_by"),
    }
