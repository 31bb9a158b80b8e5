"""Slurm's answers, parsed (pure functions, no network): `sbatch --parsable`, `squeue --array --format=...`,
`sacct --parsable2`, `scontrol -o show job`, and how their job states map onto fleetops' job words.

The node agent (remote_scripts/slurm.py) runs the commands with fixed argv lists and hands back their raw
stdout/stderr/exit status; everything is decided here, on the client, so the parsers are tested on output
recorded from a real Slurm (tests/fixtures/slurm/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The squeue format the agent asks for; the field names below follow it, in order.
SQUEUE_FORMAT = "%i|%A|%a|%F|%K|%T|%r|%N|%M|%l|%b|%P|%j"
SQUEUE_FIELDS = ("id", "job_id", "account", "array_job_id", "array_task", "state", "reason", "nodes", "elapsed",
                 "time_limit", "gres", "partition", "name")
SACCT_FORMAT = "JobID,JobName,State,ExitCode,NodeList,Elapsed,Start,End"

PARTITION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
ACCOUNT = PARTITION
GRES = re.compile(r"[A-Za-z0-9_]+(?::[A-Za-z0-9_.-]+)*:[0-9]{1,4}|[A-Za-z0-9_]+")  # gpu:1, gpu:h200:8, gpu
# Slurm's --time forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; or UNLIMITED.
TIME_LIMIT = re.compile(r"[0-9]{1,6}(?::[0-9]{1,2}){0,2}|[0-9]{1,4}-[0-9]{1,2}(?::[0-9]{1,2}){0,2}|UNLIMITED")

RUNNING = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"})
PENDING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "STOPPED", "RESV_DEL_HOLD"})
FAILED = frozenset({"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED",
                    "REVOKED", "SPECIAL_EXIT"})


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
    source: str = ""  # squeue, sacct, scontrol, exit-file
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def word(self) -> str:
        return state_word(self.state)


def state_word(slurm_state: str) -> str:
    """Slurm's state → fleetops' job word: pending, running, succeeded, failed, killed (cancelled)."""
    base = slurm_state.split()[0].rstrip("+").upper() if slurm_state else ""
    if base in RUNNING:
        return "running"
    if base in PENDING:
        return "pending"
    if base == "COMPLETED":
        return "succeeded"
    if base == "CANCELLED":
        return "killed"
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


def parse_squeue(stdout: str) -> list[TaskState]:
    """Lines of `squeue --noheader --array --format=SQUEUE_FORMAT`; each array task on its own line."""
    out = []
    for n, line in enumerate(stdout.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != len(SQUEUE_FIELDS):
            raise SlurmParseError(f"squeue line {n} has {len(parts)} fields, expected {len(SQUEUE_FIELDS)}: "
                                  f"{line[:200]!r}")
        row = dict(zip(SQUEUE_FIELDS, parts))
        task = int(row["array_task"]) if row["array_task"].isdigit() else 0
        out.append(TaskState(task=task, state=row["state"], job_id=row["id"], reason=row["reason"],
                             nodes=row["nodes"], elapsed=row["elapsed"], source="squeue",
                             extra={k: row[k] for k in ("job_id", "array_job_id", "time_limit", "gres", "partition",
                                                        "name")}))
    return out


def _exit(text: str) -> tuple[int | None, int | None]:
    """Slurm's ExitCode `CODE:SIGNAL`."""
    m = re.fullmatch(r"([0-9]+):([0-9]+)", text.strip())
    if not m:
        return None, None
    code, sig = int(m.group(1)), int(m.group(2))
    return code, (sig or None)


def _tasks_of(array_task: str) -> list[int]:
    """scontrol's ArrayTaskId: `3`, or a pending range `0-1`, `0-7%2`, `1,3,5-6`."""
    out: list[int] = []
    for part in array_task.split("%")[0].split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        elif part.isdigit():
            out.append(int(part))
    return out


def parse_scontrol(stdout: str) -> list[TaskState]:
    """`scontrol -o show job ID`: one record per line (`Key=Value` words); a pending array is one record whose
    ArrayTaskId is a range, expanded here to one TaskState per task."""
    out = []
    for n, line in enumerate(stdout.splitlines(), 1):
        if not line.strip():
            continue
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if "JobId" not in fields or "JobState" not in fields:
            raise SlurmParseError(f"scontrol line {n} is not a job record: {line[:200]!r}")
        code, sig = _exit(fields.get("ExitCode", ""))
        tasks = _tasks_of(fields["ArrayTaskId"]) if "ArrayTaskId" in fields else [0]
        for task in tasks:
            job_id = f"{fields['ArrayJobId']}_{task}" if "ArrayJobId" in fields else fields["JobId"]
            out.append(TaskState(task=task, state=fields["JobState"], job_id=job_id,
                                 reason=fields.get("Reason", ""), nodes=fields.get("NodeList", ""),
                                 exit_code=code, signal=sig, elapsed=fields.get("RunTime", ""), source="scontrol",
                                 extra={k: fields.get(k, "") for k in ("StdOut", "TresPerNode", "Partition",
                                                                       "TimeLimit", "BatchHost")}))
    return out


def sacct_disabled(stdout: str, stderr: str) -> bool:
    return "accounting storage is disabled" in (stdout + stderr).lower()


def parse_sacct(stdout: str) -> list[TaskState]:
    """`sacct --parsable2 --noheader --format=SACCT_FORMAT`: the job's (or each array task's) own line; step
    lines (`ID.batch`, `ID.extern`, `ID.0`) are skipped. State may read `CANCELLED by 1000`."""
    out = []
    names = SACCT_FORMAT.split(",")
    for n, line in enumerate(stdout.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != len(names):
            raise SlurmParseError(f"sacct line {n} has {len(parts)} fields, expected {len(names)}: {line[:200]!r}")
        row = dict(zip(names, parts))
        if "." in row["JobID"]:
            continue
        m = re.fullmatch(r"([0-9]+)(?:_([0-9]+|\[[0-9,%-]+\]))?", row["JobID"])
        if not m:
            raise SlurmParseError(f"sacct line {n}: job id {row['JobID']!r}")
        code, sig = _exit(row["ExitCode"])
        task = m.group(2)
        tasks = _tasks_of(task.strip("[]")) if task else [0]
        for t in tasks:
            out.append(TaskState(task=t, state=row["State"].split()[0], job_id=row["JobID"], nodes=row["NodeList"],
                                 exit_code=code, signal=sig, elapsed=row["Elapsed"], source="sacct"))
    return out


def merge(*sources: list[TaskState], tasks: int) -> dict[int, TaskState | None]:
    """Each task's state from the first source that knows it (callers pass squeue, sacct, scontrol, in that
    order: live first, then accounting, then the controller's memory of recent jobs)."""
    out: dict[int, TaskState | None] = {t: None for t in range(tasks)}
    for source in sources:
        for st in source:
            if st.task in out and out[st.task] is None:
                out[st.task] = st
    return out


def overall(words: list[str]) -> str:
    """The job's word from its tasks': running if any runs, then pending, then killed/failed, else succeeded."""
    for word in ("running", "pending", "unknown", "killed", "failed"):
        if word in words:
            return word
    return "succeeded" if words else "unknown"
