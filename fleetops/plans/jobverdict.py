"""One verdict on a job, SSH or Slurm alike, for every reader of it (`status`, `tail`, `diagnose`,
`jobs`): its word, whether it has ended, what `status`/`tail` exit with (the README's table: 0 while
it runs, when it succeeded or when fleetops' own `stop` ended it; 1 for any other end or one that
cannot be told) and what `diagnose` makes of it. Pure: the job's state word and exit record in, the
verdict out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..results import Severity

LIVE = ("running", "starting", "pending")
# diagnose's severities: a job that cannot be read is UNKNOWN, one that ended badly is something to
# look at (WARN); its CRITICAL (an OOM kill) comes from the kernel's log, not from here.
OK, WARN, UNKNOWN = Severity.OK, Severity.WARN, Severity.UNKNOWN


@dataclass(frozen=True)
class JobVerdict:
    # running, starting, pending, succeeded, stopped, failed, killed, cancelled, lost, unknown
    word: str
    ended: bool
    code: int  # what `status` and `tail` exit with
    health: Severity  # diagnose's verdict for the job

    @property
    def ok(self) -> bool:
        return self.code == 0


def stopped_by_fleetops(
    state: str, ended: dict[str, Any] | None, cancelled_by: object = None
) -> bool:
    """fleetops' own `stop` ended it: an SSH job whose exit record says so (the node wrote `by:
    stop` when `stop` asked it to end), or a Slurm job cancelled by `stop` (job.json's
    `cancelled_by`)."""
    if state == "cancelled":
        return isinstance(cancelled_by, dict)
    return state in ("killed", "failed", "cancelled") and (ended or {}).get("by") == "stop"


def job_verdict(
    state: object, ended: dict[str, Any] | None = None, cancelled_by: object = None
) -> JobVerdict:
    """The verdict on a job whose state word (the node's, or Slurm's overall word) is `state` and
    whose exit record is `ended`."""
    word = state if isinstance(state, str) and state else "unknown"
    ended = ended if isinstance(ended, dict) else None
    if word in LIVE:
        return JobVerdict(word, False, 0, OK)
    if word == "succeeded":
        return JobVerdict(word, True, 0, OK)
    # "stopped": a verdict read again
    if word == "stopped" or stopped_by_fleetops(word, ended, cancelled_by):
        # Slurm's own word stands for a job its scancel ended (`cancelled by fab stop at ...`); an
        # SSH job is `stopped`. Either is an end fleetops was asked for: 0, and nothing for diagnose
        # to look at.
        return JobVerdict("cancelled" if word == "cancelled" else "stopped", True, 0, OK)
    if word == "unknown":
        return JobVerdict(word, False, 1, UNKNOWN)
    if word in ("failed", "killed", "cancelled", "lost"):
        return JobVerdict(word, True, 1, WARN)
    # a word no reader knows: never taken for a good end
    return JobVerdict("unknown", False, 1, UNKNOWN)


def of(job: dict[str, Any]) -> JobVerdict:
    """The verdict on a job as `status`, `jobs` and `diagnose` hold it (state, exit, and a Slurm
    job's cancelled_by)."""
    return job_verdict(job.get("state"), job.get("exit"), job.get("cancelled_by"))
