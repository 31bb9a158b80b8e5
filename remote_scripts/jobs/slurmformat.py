"""How Slurm's answers about a job are laid out (stdlib only, nothing else imported): the formats
the node agent asks squeue and sacct for, Slurm's states of a job still in the queue, and the split
of one answer's line into its fields. One definition for both sides: the agent asks and reads with
it (slurmquery.py), the client parses with it (fleetops/plans/slurm.py imports it from the agent's
sources; the agent cannot import fleetops)."""

from __future__ import annotations

# The squeue format asked for; the field names below follow it, in order. The name is last: it is
# the only field a user chooses freely, so it may hold `|` (each line is split into at most
# len(FIELDS) parts).
SQUEUE_FORMAT = "%i|%A|%F|%K|%T|%r|%N|%M|%l|%b|%P|%u|%V|%j"
SQUEUE_FIELDS = (
    "id",
    "job_id",
    "array_job_id",
    "array_task",
    "state",
    "reason",
    "nodes",
    "elapsed",
    "time_limit",
    "gres",
    "partition",
    "user",
    "submit",
    "name",
)
# JobName last, as above
SACCT_FORMAT = "JobID,State,ExitCode,NodeList,Elapsed,Start,End,User,Submit,JobName"
# Only fields without free text, so the fixed-width columns split on blanks (restart_counts).
RESTARTS_FORMAT = "JobArrayID:64,RestartCnt:12"
# Slurm's states of a job still in the queue: running (or about to), and waiting to.
RUNNING = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"})
PENDING = frozenset(
    {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "STOPPED", "RESV_DEL_HOLD"}
)
ACTIVE = RUNNING | PENDING


def split_fields(line: str, names: tuple[str, ...] | list[str]) -> dict[str, str] | None:
    """One `|`-separated line of squeue's (SQUEUE_FIELDS) or sacct's (SACCT_FORMAT) as its fields
    by name: split at most len(names) - 1 times, so a `|` in the free-text name, the last field,
    stays in it. None when the line has fewer fields."""
    parts = line.split("|", len(names) - 1)
    return dict(zip(names, parts)) if len(parts) == len(names) else None


def restart_counts(stdout: str) -> dict[str, int]:
    """RESTARTS_FORMAT's lines: each job's (or array task's) id and how many times Slurm requeued
    it."""
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out
