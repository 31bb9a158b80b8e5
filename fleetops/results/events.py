"""Progress a task reports while it works, as values: the task emits one of these through
`RunState.emit`, and only report/ decides how it reads (report/events.py). One class per kind of
progress; `Event` is their union."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JobLine:
    """One line of a job's log under `label` (a host, a host's Slurm task, or the fleet); `progress`
    is what the line reported, for the label's bar."""

    label: str
    line: str
    failure: bool
    progress: dict[str, Any] | None = None


@dataclass(frozen=True)
class JobAttached:
    """`tail` follows `job_id` under `label`: its live row and bar appear."""

    label: str
    job_id: str
    state: str


@dataclass(frozen=True)
class JobEnded:
    """The job followed under `label` is over, in `state`."""

    label: str
    state: str


@dataclass(frozen=True)
class Waiting:
    """A host waits on something for `task`, `left_s` seconds at most from now."""

    host: str
    task: str
    what: str
    left_s: float


@dataclass(frozen=True)
class TailEnd:
    """How the job a tail followed ended (`end`: the node's words, e.g. `succeeded (exit 0)`)."""

    host: str
    job_id: str | None
    end: str


@dataclass(frozen=True)
class Detached:
    """Ctrl-C while following a job started over SSH: it runs on (None: the latest job)."""

    host: str
    job_id: str | None


@dataclass(frozen=True)
class SlurmDetached:
    """Ctrl-C while following a Slurm job: it stays in Slurm."""

    host: str
    job_id: str | None


@dataclass(frozen=True)
class LinesSkipped:
    """An attaching tail starts at the job's last lines: how many it left out (None: unknown)."""

    label: str
    job_id: str
    lines: int | None
    skipped_bytes: int


@dataclass(frozen=True)
class ControllerGone:
    """Slurm's controller cannot be asked (`problem`, its words); the tail follows the log on."""

    host: str
    problem: str


@dataclass(frozen=True)
class ControllerBack:
    """Slurm's controller answers again."""

    host: str


@dataclass(frozen=True)
class SlurmState:
    """A Slurm job became pending or running: `description` is its state in words, `nodes` where it
    runs (empty when not said)."""

    host: str
    slurm_job_id: str | None
    description: str
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class FleetSummary:
    """A sharded job's fleet-wide line once every host has answered."""

    line: str
    complete: int
    shards: int
    plan: str
    save_error: str | None = None


@dataclass(frozen=True)
class CopyRestarted:
    """A resumed download's partial copy was of other bytes than the node's file: it starts over
    from byte 0."""

    host: str
    label: str


@dataclass(frozen=True)
class Said:
    """A sentence made outside the job tasks (a lost connection's retry, tasks/reconnect.py)."""

    text: str


Event = (
    JobLine
    | JobAttached
    | JobEnded
    | Waiting
    | TailEnd
    | Detached
    | SlurmDetached
    | LinesSkipped
    | ControllerGone
    | ControllerBack
    | SlurmState
    | FleetSummary
    | CopyRestarted
    | Said
)
