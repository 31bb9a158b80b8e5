"""The Slurm lab's teardown (fleetops/lab/slurm.py, down()) on a busy machine: processes of the
cluster that are still on their way out when the daemons stop (an agent session on the login node, a
job step's child) are waited for, within a bound, and what is left then is killed by pid before
down() judges, so a loaded machine does not turn a green module red at its teardown. A real one-node
Slurm; the stragglers are real processes that carry the cluster's SLURM_CONF, as the login node's
agent does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from polling import wait_for

from fleetops.lab.slurm import SlurmLab

pytestmark = pytest.mark.lab

SLOW_EXIT = """
import os, signal, sys, time
def leave(*_):
    # On its way out until after the last daemon (munged) is gone, and %s s more: the moment \
down() judges.
    munged = int(open(sys.argv[2]).read().split()[0])
    while os.path.exists("/proc/%%d" %% munged):
        time.sleep(0.05)
    time.sleep(%s)
    sys.exit(0)
signal.signal(signal.SIGTERM, leave)
signal.signal(signal.SIGHUP, leave)
open(sys.argv[1], "w").write("ready")
time.sleep(3600)
"""


@pytest.fixture
def cluster(slurm_tools, root_user, tmp_path) -> SlurmLab:
    slurm = SlurmLab(tmp_path / "cluster")
    slurm.up()
    yield slurm
    for pid in slurm.leftovers():  # whatever a failed assertion left: never outlives the test
        os.kill(pid, signal.SIGKILL)


def straggler(
    slurm: SlurmLab, tmp_path: Path, exit_s: float, ignore_term: bool = False
) -> subprocess.Popen:
    """A process of the cluster (SLURM_CONF in its environment, its own session, as the login node's
    agent), told to go when the teardown begins; it exits `exit_s` after the last daemon, or never
    with `ignore_term`."""
    ready = tmp_path / f"ready-{time.monotonic_ns()}"
    code = SLOW_EXIT % (exit_s, exit_s)
    if ignore_term:
        code = code.replace(
            "signal.signal(signal.SIGTERM, leave)", "signal.signal(signal.SIGTERM, signal.SIG_IGN)"
        )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(ready), str(slurm.pid_file("munged"))],
        env={**os.environ, **slurm.env},
        start_new_session=True,
    )
    wait_for(ready.exists, "the straggler started", 60)
    return proc


def test_down_waits_for_a_process_of_the_cluster_that_is_still_exiting(cluster, tmp_path):
    proc = straggler(cluster, tmp_path, exit_s=3)
    assert proc.pid in cluster.leftovers()
    os.kill(proc.pid, signal.SIGTERM)  # the session's end, just before the teardown
    started = time.monotonic()
    stopped = cluster.down()
    assert stopped == ["slurmd", "slurmctld", "munged"]
    assert proc.wait(timeout=30) == 0, "it left on its own, not killed"
    assert cluster.leftovers() == []
    assert time.monotonic() - started < 60


def test_down_kills_by_pid_what_is_left_after_its_wait_and_then_judges(cluster, tmp_path):
    proc = straggler(cluster, tmp_path, exit_s=0, ignore_term=True)
    os.kill(proc.pid, signal.SIGTERM)
    cluster.down(timeout=20)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert cluster.leftovers() == []
    assert all(cluster.running(d) is None for d in ("munged", "slurmctld", "slurmd"))
