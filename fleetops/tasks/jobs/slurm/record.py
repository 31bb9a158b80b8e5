"""A Slurm job of the node's job store as the store's readers (`jobs`, `diagnose`) show it: its
state, exit and runtime, read from squeue/sacct's lines and the exit files its tasks wrote the way
`status` reads them (view.py), so a Slurm job is listed and judged like an SSH job."""

from __future__ import annotations

from ....plans import slurm as sp
from . import view as sv

ENDED = ("succeeded", "failed", "killed", "cancelled")


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
    worst = next(
        (r for r in rows if r["state"] in ("killed", "failed", "cancelled")),
        rows[0] if rows else None,
    )
    ends = [
        e["ended_ts"]
        for e in exits.values()
        if isinstance(e, dict) and isinstance(e.get("ended_ts"), (int, float))
    ]
    ended: dict | None = None
    if (
        word in ENDED
        and worst is not None
        and (worst.get("exit_code") is not None or worst.get("signal"))
    ):
        ended = {"exit_code": worst.get("exit_code"), "signal": worst.get("signal")}
        if ends:
            ended["ended_ts"] = max(ends)
    started = record.get("started_ts")
    runtime = None
    if isinstance(started, (int, float)):
        if word in ENDED and ends:
            runtime = max(ends) - started
        elif word == "running" and isinstance(now_ts, (int, float)):
            runtime = now_ts - started
    return {
        "state": word,
        "exit": ended,
        "runtime_s": round(runtime, 1) if runtime is not None else None,
        "tasks": rows,
        "notes": rows[0]["notes"] if rows else [],
        "end": sv.describe(rows, record),
        "cancelled_by": record.get("cancelled_by"),
    }
