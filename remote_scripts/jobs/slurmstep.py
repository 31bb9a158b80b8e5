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
from .records import cause_name

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
    import signal
    import subprocess

    from ..core.failpoints import load_failpoints
    from ..core.launch import relaunch, shown
    from ..core.statetrust import trusted_stat

    load_failpoints()
    try:  # the job dir it was given: in the state dir the bootstrap checked there, and ours alone
        trusted_stat(os.path.dirname(job_dir), want_dir=True)
        if trusted_stat(job_dir, want_dir=True) is None:
            raise NodeError(f"{job_dir} does not exist", kind="no_job")
        job = read_json(os.path.join(job_dir, "job.json")) or {}
    except NodeError as exc:
        print(f"fleetops: slurm step refused: {exc}", flush=True)
        return 2
    task = int(os.environ.get("SLURM_ARRAY_TASK_ID") or 0)
    if job.get("kind") == "extract":
        argv = relaunch("extract", os.path.join(job_dir, f"request-{task}.json"))
    else:
        argv = list(job["argv"])
    env = dict(
        os.environ,
        FLEETOPS_JOB_ID=str(job.get("id")),
        FLEETOPS_SHARD=str(task),
        PYTHONUNBUFFERED="1",
    )
    slurm_id = (
        f"{os.environ['SLURM_ARRAY_JOB_ID']}_{task}"
        if os.environ.get("SLURM_ARRAY_JOB_ID")
        else os.environ.get("SLURM_JOB_ID")
    )
    print(
        f"fleetops: slurm job {slurm_id} task {task} on {os.environ.get('SLURMD_NODENAME')}: "
        f"{shown(argv)[:4]}",
        flush=True,
    )
    try:  # a requeued task's earlier run recorded its end: this run's end is not known yet
        os.unlink(os.path.join(job_dir, f"exit-{task}.json"))
    except FileNotFoundError:
        pass
    failpoint("slurm.step.start")  # a test swaps what the step would run from here
    got: list[int] = []
    child = subprocess.Popen(argv, env=env, cwd=job.get("cwd") or job_dir, stdin=subprocess.DEVNULL)

    def forward(s: int, frame: object) -> None:
        got.append(s)
        child.send_signal(s)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, forward)
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    ended = {
        "exit_code": code if code >= 0 else None,
        "signal": -code if code < 0 else (got[0] if got else None),
        "ended": now_iso(),
        "ended_ts": time.time(),
        "task": task,
    }
    if code:  # the job's own one-line cause, when it wrote one (extract_hidden_states.record_cause)
        try:
            said = (read_json(os.path.join(job_dir, cause_name(str(task)))) or {}).get("cause")
        except (NodeError, OSError, AttributeError):
            said = None
        if isinstance(said, str) and said:
            ended["job_cause"] = said[:500]
    write_json_atomic(os.path.join(job_dir, f"exit-{task}.json"), ended, point="slurm.exit")
    return code if code >= 0 else 128 - code


def batch_script(job_dir: str) -> tuple[bytes, list[str]]:
    """The batch script's bytes and its arguments (argv words after the script's name)."""
    from ..core.launch import relaunch

    argv = relaunch(STEP, job_dir)
    at = argv.index("-c")
    flags = "".join(f[1:] for f in argv[1:at])  # "-I", "-S" -> "-IS": a #! line passes one argument
    return f"#!{argv[0]} -{flags}\n{argv[at + 1]}".encode(), argv[at + 2 :]
