"""The Slurm batch step (stdlib only): the batch script sbatch runs on the allocated node, and the
step it starts there, which runs one task of the job and records its exit status."""

from __future__ import annotations

import os
import time

from ..core.atomicio import write_json_atomic
from ..core.failpoints import failpoint
from ..core.nodeio import NodeError, now_iso
from ..core.registry import node_role
from ..core.statetrust import read_json
from .records import job_cause

# The batch script sbatch runs on the allocated node is the verifying bootstrap itself
# (bootstrap.py's text under a `#!<python> -IS` line), with the words this agent was started with
# and `slurm-step <job_dir>`: the step checks the interpreter and the state dir there, runs only the
# agent bytes whose sha256 this agent was verified against, and step_main() (below, from those
# bytes) runs the job's task: its request by array index, its exit status recorded in
# exit-<task>.json however it ends (a scancel's SIGTERM is forwarded to the job).
STEP = "slurm-step"


@node_role("slurm-step")
def step_main(job_dir: str) -> int:
    """The batch step on the allocated node (started through the bootstrap by the batch script)."""
    from ..core.failpoints import load_failpoints
    from ..core.launch import shown

    load_failpoints()
    try:
        job = _trusted_job(job_dir)
    except NodeError as exc:
        print(f"fleetops: slurm step refused: {exc}", flush=True)
        return 2
    task = int(os.environ.get("SLURM_ARRAY_TASK_ID") or 0)
    argv = _task_argv(job, job_dir, task)
    env = dict(
        os.environ,
        FLEETOPS_JOB_ID=str(job.get("id")),
        FLEETOPS_SHARD=str(task),
        PYTHONUNBUFFERED="1",
    )
    print(
        f"fleetops: slurm job {_slurm_id(task)} task {task} on "
        f"{os.environ.get('SLURMD_NODENAME')}: {shown(argv)[:4]}",
        flush=True,
    )
    try:  # a requeued task's earlier run recorded its end: this run's end is not known yet
        os.unlink(os.path.join(job_dir, f"exit-{task}.json"))
    except FileNotFoundError:
        pass
    failpoint("slurm.step.start")  # a test swaps what the step would run from here
    code, got = _run_forwarding(argv, env, job.get("cwd") or job_dir)
    ended = {
        "exit_code": code if code >= 0 else None,
        "signal": -code if code < 0 else (got[0] if got else None),
        "ended": now_iso(),
        "ended_ts": time.time(),
        "task": task,
    }
    if code:  # the job's own one-line cause, when it wrote one (extract_hidden_states.record_cause)
        said = job_cause(job_dir, str(task))
        if said:
            ended["job_cause"] = said[:500]
    write_json_atomic(os.path.join(job_dir, f"exit-{task}.json"), ended, point="slurm.exit")
    return code if code >= 0 else 128 - code


def _trusted_job(job_dir: str) -> dict:
    """The job's record, from the job dir it was given: in the state dir the bootstrap checked
    there, and ours alone. NodeError otherwise."""
    from ..core.statetrust import trusted_stat

    trusted_stat(os.path.dirname(job_dir), want_dir=True)
    if trusted_stat(job_dir, want_dir=True) is None:
        raise NodeError(f"{job_dir} does not exist", kind="no_job")
    return read_json(os.path.join(job_dir, "job.json")) or {}


def _task_argv(job: dict, job_dir: str, task: int) -> list[str]:
    """What this task runs: an extract job's shard through the verified agent, else the job's
    command."""
    if job.get("kind") != "extract":
        return list(job["argv"])
    from ..core.launch import relaunch

    return relaunch("extract", os.path.join(job_dir, f"request-{task}.json"))


def _slurm_id(task: int) -> str | None:
    """Slurm's id of this task: <array job>_<task> in an array, else the job's."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job:
        return f"{array_job}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def _run_forwarding(argv: list[str], env: dict[str, str], cwd: str) -> tuple[int, list[int]]:
    """Run the task to its end, forwarding SIGTERM, SIGINT and SIGUSR1 (scancel's) to it: its exit
    code (negative: the signal that ended it) and the signals forwarded."""
    import signal
    import subprocess

    got: list[int] = []
    child = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL)

    def forward(s: int, frame: object) -> None:
        got.append(s)
        child.send_signal(s)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, forward)
    while True:
        try:
            return child.wait(), got
        except InterruptedError:
            continue


def batch_script(job_dir: str) -> tuple[bytes, list[str]]:
    """The batch script's bytes and its arguments (argv words after the script's name)."""
    from ..core.launch import relaunch

    argv = relaunch(STEP, job_dir)
    at = argv.index("-c")
    flags = "".join(f[1:] for f in argv[1:at])  # "-I", "-S" -> "-IS": a #! line passes one argument
    return f"#!{argv[0]} -{flags}\n{argv[at + 1]}".encode(), argv[at + 2 :]
