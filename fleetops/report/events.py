"""The words of a task's progress: each event (results/events.py) as the line the console prints."""

from __future__ import annotations

from ..results.events import (
    ControllerBack,
    ControllerGone,
    CopyRestarted,
    Detached,
    Event,
    FleetSummary,
    JobAttached,
    JobEnded,
    JobLine,
    LinesSkipped,
    Said,
    SlurmDetached,
    SlurmState,
    TailEnd,
    Waiting,
)


def event_text(event: Event) -> str | None:
    """The line a note-kind event prints; None for the kinds that draw a job's row, bar or log
    line, or a wait (the Reporter's own methods draw those, by terminal and by --json)."""
    match event:
        case JobLine() | JobAttached() | JobEnded() | Waiting():
            return None
        case ControllerGone() | ControllerBack() | SlurmState():
            return _slurm_text(event)
        case FleetSummary(line, complete, shards, plan, save_error):
            saved = f" ({save_error})" if save_error else ""
            return f"fleet | {line}; {complete}/{shards} shards complete; plan {plan}{saved}"
        case Said(text):
            return text
        case _:
            return _job_text(event)


def _job_text(event: TailEnd | Detached | SlurmDetached | LinesSkipped | CopyRestarted) -> str:
    """What a job's tail, or a file's copy, says as it goes."""
    match event:
        case TailEnd(host, job_id, end):
            return f"{host} | job {job_id} {end}"
        case Detached(host, job_id):
            return f"{host} | detached: job {job_id or '(the latest)'} is still running"
        case SlurmDetached(host, job_id):
            return (
                f"{host} | detached: Slurm job {job_id} keeps running "
                f"(fab -H {host} tail to re-attach)"
            )
        case LinesSkipped(label, job_id, lines, skipped_bytes):
            count = lines if lines is not None else "the"
            return (
                f"{label} | job {job_id}: {count} earlier lines not shown ({skipped_bytes} bytes); "
                "--from-start replays them"
            )
        case CopyRestarted(host, label):
            return (
                f"{host} | {label}: the partial copy did not match the node's file; "
                "downloading it again from byte 0"
            )


def _slurm_text(event: ControllerGone | ControllerBack | SlurmState) -> str:
    """What Slurm's side of a job says as it goes."""
    match event:
        case ControllerGone(host, problem):
            return (
                f"{host} | {problem}; the job may still be running: following its log until Slurm "
                "answers again (Ctrl-C detaches)"
            )
        case ControllerBack(host):
            return f"{host} | Slurm's controller answers again"
        case SlurmState(host, slurm_job_id, description, nodes):
            where = f" on {', '.join(nodes)}" if nodes else ""
            return f"{host} | Slurm job {slurm_job_id}: {description}{where}"
