"""The tests' own view of a real Slurm (its commands run here, not through fleetops) and the
competing job that makes ours wait: what the modules that run jobs through sbatch check against."""

from __future__ import annotations

import os
import subprocess

from polling import proc_state, wait_for

from fleetops.lab.slurm import SlurmLab


def sh(slurm: SlurmLab, *argv: str) -> subprocess.CompletedProcess:
    """A Slurm command as the test's own independent view (not through fleetops)."""
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=60, env={**os.environ, **slurm.env}
    )


def squeue(slurm: SlurmLab, sid: str) -> list[tuple[str, ...]]:
    """(job id, state, reason) of each task of job `sid` Slurm still lists."""
    out = sh(slurm, "squeue", "--noheader", "--array", "--format=%i|%T|%r", f"--jobs={sid}").stdout
    return [tuple(line.split("|")) for line in out.splitlines() if line.strip()]


def alive(pid: int) -> bool:
    """A process of the job, seen from /proc (slurmd runs the steps on this machine): running, not
    gone nor a zombie waiting to be collected."""
    return proc_state(pid) not in ("gone", "Z")


def hold_every_gpu(slurm: SlurmLab, log_name: str) -> str:
    """Another user's job asking for both of the cluster's GPUs for ten minutes, so a job of ours
    submitted now must wait in the queue; its Slurm job id (the test scancels it)."""
    blocker = sh(
        slurm,
        "sbatch",
        "--parsable",
        "--gres=gpu:2",
        "--partition=gpu",
        "--job-name=blocker",
        f"--output={slurm.root / log_name}",
        "--wrap",
        "sleep 600",
    )
    assert blocker.returncode == 0, blocker.stderr
    return blocker.stdout.strip()


def wait_pending_for_gpus(slurm: SlurmLab, sid: str, what: str) -> None:
    """Until Slurm's own queue holds job `sid` PENDING for want of resources (the GPUs another
    job holds)."""
    wait_for(lambda: squeue(slurm, sid) == [(sid, "PENDING", "Resources")], what, 60)
