"""Slurm's answers, parsed (pure functions, no network): `sbatch --parsable`, `squeue --states=all
--array --format=...` and `sacct --parsable2 --duplicates`, how their job states map onto fleetops'
job words, and whose job a line is.

Only explicit formats are read: squeue's and sacct's own field lists, `|` between fields and the one
free-text field (the job's name) last, so a name with `|` in it cannot shift a field. `scontrol -o
show job` is never read: its `Key=Value` words include free text (the name first, the Comment later)
that can carry any other key, so no reading of it can tell the real JobState from one a job wrote
into its own Comment. (`squeue --json` would be the safe one, but Slurm 22.05 ignores every filter
with it: each poll would list the whole cluster.)

A job id is fleetops' job only while the line's user, name and submit time are the ones job.json
recorded at submission: after slurmctld forgot the job (a restart without its state, ids wrapping at
MaxJobId) the same id names another job, maybe another user's, and that line is never taken for ours
(`Identity`).

The node agent (remote_scripts/jobs/slurm.py) runs the commands with fixed argv lists and hands back
their raw stdout/stderr/exit status; everything is decided here, on the client, so the parsers are
tested on output recorded from a real Slurm (tests/fixtures/slurm/).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# The formats the node agent asks squeue and sacct for, Slurm's queue states, and the line split
# both sides read the answers with are the agent's own: one definition, since the agent cannot
# import fleetops but the client can import the agent's sources.
from ..agent.jobs.slurmformat import PENDING as PENDING
from ..agent.jobs.slurmformat import RESTARTS_FORMAT as RESTARTS_FORMAT
from ..agent.jobs.slurmformat import RUNNING as RUNNING
from ..agent.jobs.slurmformat import SACCT_FORMAT as SACCT_FORMAT
from ..agent.jobs.slurmformat import SQUEUE_FIELDS as SQUEUE_FIELDS
from ..agent.jobs.slurmformat import SQUEUE_FORMAT as SQUEUE_FORMAT
from ..agent.jobs.slurmformat import restart_counts, split_fields

PARTITION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
ACCOUNT = PARTITION
# gpu:1, gpu:h200:8, gpu
GRES = re.compile(r"[A-Za-z0-9_]+(?::[A-Za-z0-9_.-]+)*:[0-9]{1,4}|[A-Za-z0-9_]+")
# Slurm's --time forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; or UNLIMITED.
TIME_LIMIT = re.compile(
    r"[0-9]{1,6}(?::[0-9]{1,2}){0,2}|[0-9]{1,4}-[0-9]{1,2}(?::[0-9]{1,2}){0,2}|UNLIMITED"
)

FAILED = frozenset(
    {
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)


class SlurmParseError(ValueError):
    """Output that is not what the command prints: the message quotes it."""


@dataclass
class TaskState:
    """One job (or one array task) as the scheduler sees it."""

    task: int  # the array index; 0 for a job that is not an array
    state: str  # Slurm's word: PENDING, RUNNING, COMPLETED, CANCELLED, FAILED, ...
    job_id: str = ""  # Slurm's own id of this task ("12" or "12_1")
    reason: str = ""
    nodes: str = ""
    exit_code: int | None = None
    signal: int | None = None
    elapsed: str = ""
    source: str = ""  # squeue, sacct, exit-file
    user: str = ""  # whose job Slurm says it is, its name and submit time (Identity)
    name: str = ""
    submit: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def word(self) -> str:
        return state_word(self.state)


@dataclass(frozen=True)
class Identity:
    """What job.json recorded of fleetops' own job at submission: the login user, the job name, and
    the submit time squeue printed for it (empty when it could not be read then: user and name must
    still match)."""

    user: str
    name: str
    submit: str = ""

    def owns(self, st: TaskState, restarts: dict[str, int] | None = None) -> bool:
        """A requeue gives the job a later submit time: a line whose submit moved is ours only when
        Slurm counts a restart for it (`restarts`, parse_restarts)."""
        moved = bool((restarts or {}).get(st.job_id)) and st.submit > self.submit
        return (
            st.user == self.user
            and st.name == self.name
            and (not self.submit or not st.submit or st.submit == self.submit or moved)
        )

    @classmethod
    def of(cls, job: dict[str, Any]) -> Identity:
        return cls(
            str(job.get("slurm_user") or ""),
            str(job.get("name") or ""),
            str(job.get("slurm_submit") or ""),
        )


def split_owned(
    rows: list[TaskState], identity: Identity, restarts: dict[str, int] | None = None
) -> tuple[list[TaskState], list[TaskState]]:
    """(fleetops' own lines, lines of another job that now has the same id). With no user recorded
    (a job submitted by an older fleetops), the name alone decides."""
    ours: list[TaskState] = []
    others: list[TaskState] = []
    for st in rows:
        mine = identity.owns(st, restarts) if identity.user else st.name == identity.name
        (ours if mine else others).append(st)
    return ours, others


def state_word(slurm_state: str) -> str:
    """Slurm's state → fleetops' job word: pending, running, succeeded, failed, cancelled."""
    base = slurm_state.split()[0].rstrip("+").upper() if slurm_state else ""
    if base in RUNNING:
        return "running"
    if base in PENDING:
        return "pending"
    if base == "COMPLETED":
        return "succeeded"
    if base == "CANCELLED":
        return "cancelled"
    if base in FAILED:
        return "failed"
    return "unknown"


def parse_sbatch(stdout: str) -> str:
    """`sbatch --parsable` prints `ID` or `ID;CLUSTER`."""
    text = stdout.strip()
    m = re.fullmatch(r"([0-9]+)(?:;([A-Za-z0-9_.-]+))?", text)
    if not m:
        raise SlurmParseError(f"sbatch --parsable printed {text[:200]!r}, not a job id")
    return m.group(1)


def _lines(
    command: str, stdout: str, names: tuple[str, ...] | list[str]
) -> Iterator[tuple[int, dict[str, str]]]:
    """Each line's number and its fields by name (blank lines passed over); a line short of fields
    is SlurmParseError, quoted."""
    for n, line in enumerate(stdout.splitlines(), 1):
        if not line.strip():
            continue
        row = split_fields(line, names)
        if row is None:
            raise SlurmParseError(
                f"{command} line {n} has {len(line.split('|'))} fields, expected {len(names)}: "
                f"{line[:200]!r}"
            )
        yield n, row


def parse_squeue(stdout: str) -> list[TaskState]:
    """Lines of `squeue --noheader --states=all --array --format=SQUEUE_FORMAT`; each array task on
    its own line; jobs that ended within MinJobAge are listed with their final state."""
    out = []
    for _, row in _lines("squeue", stdout, SQUEUE_FIELDS):
        task = int(row["array_task"]) if row["array_task"].isdigit() else 0
        out.append(
            TaskState(
                task=task,
                state=row["state"],
                job_id=row["id"],
                reason=row["reason"],
                nodes=row["nodes"],
                elapsed=row["elapsed"],
                source="squeue",
                user=row["user"],
                name=row["name"],
                submit=row["submit"],
                extra={
                    k: row[k] for k in ("job_id", "array_job_id", "time_limit", "gres", "partition")
                },
            )
        )
    return out


def parse_restarts(stdout: str) -> dict[str, int]:
    """`squeue --noheader --array --Format=JobArrayID:64,RestartCnt:12`: each job's (or array
    task's) id and how many times Slurm requeued it. Both columns are free of blanks, so a line
    splits on them."""
    return {
        job: count
        for job, count in restart_counts(stdout).items()
        if re.fullmatch(r"[0-9]+(?:_[0-9]+)?", job)
    }


def _exit(text: str) -> tuple[int | None, int | None]:
    """Slurm's ExitCode `CODE:SIGNAL`."""
    m = re.fullmatch(r"([0-9]+):([0-9]+)", text.strip())
    if not m:
        return None, None
    code, sig = int(m.group(1)), int(m.group(2))
    return code, (sig or None)


def _tasks_of(array_task: str) -> list[int]:
    """An array task list as sacct prints a pending one: `3`, or a range `0-1`, `0-7%2`,
    `1,3,5-6`."""
    out: list[int] = []
    for part in array_task.split("%")[0].split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        elif part.isdigit():
            out.append(int(part))
    return out


def sacct_disabled(stdout: str, stderr: str) -> bool:
    return "accounting storage is disabled" in (stdout + stderr).lower()


def parse_sacct(stdout: str) -> list[TaskState]:
    """`sacct --parsable2 --noheader --duplicates --format=SACCT_FORMAT`: the job's (or each array
    task's) own line; step lines (`ID.batch`, `ID.extern`, `ID.0`) are skipped. State may read
    `CANCELLED by 1000`. With --duplicates every job that ever had the id is listed: Identity picks
    fleetops' own."""
    out = []
    for n, row in _lines("sacct", stdout, SACCT_FORMAT.split(",")):
        if "." in row["JobID"]:
            continue
        m = re.fullmatch(r"([0-9]+)(?:_([0-9]+|\[[0-9,%-]+\]))?", row["JobID"])
        if not m:
            raise SlurmParseError(f"sacct line {n}: job id {row['JobID']!r}")
        code, sig = _exit(row["ExitCode"])
        task = m.group(2)
        tasks = _tasks_of(task.strip("[]")) if task else [0]
        for t in tasks:
            out.append(
                TaskState(
                    task=t,
                    state=row["State"].split()[0],
                    job_id=row["JobID"],
                    nodes=row["NodeList"],
                    exit_code=code,
                    signal=sig,
                    elapsed=row["Elapsed"],
                    source="sacct",
                    user=row["User"],
                    name=row["JobName"],
                    submit=row["Submit"],
                )
            )
    return out


def merge(*sources: list[TaskState], tasks: int) -> dict[int, TaskState | None]:
    """Each task's state from the first source that knows it (callers pass squeue, then sacct: the
    controller's view of live and recently ended jobs first, then accounting)."""
    out: dict[int, TaskState | None] = {t: None for t in range(tasks)}
    for source in sources:
        for st in source:
            if st.task in out and out[st.task] is None:
                out[st.task] = st
    return out


def overall(words: list[str]) -> str:
    """The job's word from its tasks': running if any runs, then pending, unknown, cancelled, killed
    (a signal the job's own exit file records), failed, else succeeded."""
    for word in ("running", "pending", "unknown", "cancelled", "killed", "failed"):
        if word in words:
            return word
    return "succeeded" if words else "unknown"
