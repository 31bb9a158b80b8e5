"""Asking Slurm about one job, on the login node (stdlib only): the commands, each a fixed argv list
with a short timeout of its own, and whose lines in squeue's answer are fleetops' own job (`ours`).

The controller is asked first (`scontrol ping`, which answers at once when slurmctld is down: squeue
itself retries for tens of seconds before it says "Unable to contact slurm controller"). An answer
with "controller" in it is a controller that cannot be reached: nothing else was asked, and nothing
may be concluded about the job from it (the client says UNKNOWN, never "not in the queue").
"""

from __future__ import annotations

import os
import pwd
import subprocess

from .slurmformat import (
    ACTIVE,
    RESTARTS_FORMAT,
    SACCT_FORMAT,
    SQUEUE_FIELDS,
    SQUEUE_FORMAT,
    restart_counts,
    split_fields,
)

WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
COMMAND_TIMEOUT_S = 60  # sbatch, srun: they may wait on a busy controller's admission
QUERY_TIMEOUT_S = 20  # squeue, sacct, scancel, scontrol: an operator waits on these
PING_TIMEOUT_S = 10


def run(argv: list[str], env: dict[str, str], timeout: float = QUERY_TIMEOUT_S) -> dict:
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return {
            "argv": argv,
            "rc": 127,
            "stdout": "",
            "stderr": f"{argv[0]}: command not found on this node",
        }
    except subprocess.TimeoutExpired:
        return {
            "argv": argv,
            "rc": 124,
            "stdout": "",
            "stderr": f"{argv[0]} did not answer in {timeout:.0f}s",
        }
    return {"argv": argv, "rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


def scheduler_env(req: dict) -> dict[str, str]:
    """Only SLURM_* variables (SLURM_CONF, ...) from the inventory reach the query commands."""
    return {
        k: str(v) for k, v in (req.get("scheduler_env") or {}).items() if k.startswith("SLURM_")
    }


def login() -> str:
    """The login user's name, as squeue's %u prints the owner of the jobs this user submits."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def rows(stdout: str) -> list[dict]:
    """squeue's lines (SQUEUE_FORMAT), those that have every field."""
    return [r for r in (split_fields(line, SQUEUE_FIELDS) for line in stdout.splitlines()) if r]


def ours(job: dict, stdout: str, restarts: str = "") -> tuple[list[dict], list[dict]]:
    """squeue's lines for the job's id: (fleetops' own job's, another job's that has the id now).
    Ours: the user, name and submit time job.json recorded (a job.json of an older fleetops has no
    user: the name decides). A requeue gives the job a new, later submit time: such a line is ours
    when Slurm counts a restart for it (`restarts`: RESTARTS_FORMAT's output)."""
    user, name, submit = job.get("slurm_user"), job.get("name"), job.get("slurm_submit")
    counts = restart_counts(restarts)
    mine: list[dict] = []
    others: list[dict] = []
    for row in rows(stdout):
        same_submit = (
            not submit
            or row["submit"] == submit
            or (counts.get(row["id"], 0) > 0 and row["submit"] > str(submit))
        )
        own = row["name"] == name and (not user or row["user"] == user) and same_submit
        (mine if own else others).append(row)
    return mine, others


def _needs_restarts(job: dict, stdout: str) -> bool:
    """A line of the job's user and name that waits in the queue, or whose submit time moved (a
    requeue)."""
    user, name, submit = job.get("slurm_user"), job.get("name"), job.get("slurm_submit")
    return any(
        r["name"] == name
        and (not user or r["user"] == user)
        and (r["state"] in WAITING or (submit and r["submit"] != submit))
        for r in rows(stdout)
    )


def controller_down(ping: dict) -> bool:
    """`scontrol ping` exits 1 with "... is DOWN" when no controller answers (and times out when its
    host does not); 127 (no scontrol) is left for squeue to report."""
    return ping["rc"] not in (0, 127)


def ping(env: dict[str, str]) -> dict:
    return run(["scontrol", "ping"], env, timeout=PING_TIMEOUT_S)


def query(job: dict, env: dict[str, str], full: bool = True) -> dict:
    """What Slurm says of the job: {"controller": ping} alone when the controller cannot be reached;
    else squeue (every task of an array), restart counts when a task waits in the queue or was
    requeued, and with `full` sacct."""
    sid = job.get("slurm_job_id")
    if not sid:
        return {}
    answer = ping(env)
    if controller_down(answer):
        return {"controller": answer}
    out = {
        "squeue": run(
            [
                "squeue",
                "--noheader",
                "--states=all",
                "--array",
                f"--format={SQUEUE_FORMAT}",
                f"--jobs={sid}",
            ],
            env,
        )
    }
    if out["squeue"]["rc"] == 0 and _needs_restarts(job, out["squeue"]["stdout"]):
        out["restarts"] = run(
            [
                "squeue",
                "--noheader",
                "--states=all",
                "--array",
                f"--Format={RESTARTS_FORMAT}",
                f"--jobs={sid}",
            ],
            env,
        )
    if full:
        out["sacct"] = run(
            [
                "sacct",
                "--parsable2",
                "--noheader",
                "--duplicates",
                f"--format={SACCT_FORMAT}",
                f"--jobs={sid}",
            ],
            env,
        )
    return out


def active(job: dict, answer: dict) -> bool | None:
    """Whether squeue lists fleetops' own job still in the queue; None when Slurm could not be
    asked."""
    listed = answer.get("squeue")
    if not listed or listed["rc"] != 0:
        return None
    restarts = (answer.get("restarts") or {}).get("stdout", "")
    return any(r["state"] in ACTIVE for r in ours(job, listed["stdout"], restarts)[0])


def submit_time(job: dict, env: dict[str, str]) -> str | None:
    """Right after sbatch: the submit time squeue gives the new job (its user and name checked), for
    job.json."""
    listed = query(job, env, full=False).get("squeue")
    mine = (
        ours({**job, "slurm_submit": None}, listed["stdout"])[0]
        if listed and listed["rc"] == 0
        else []
    )
    return mine[0]["submit"] if mine else None
