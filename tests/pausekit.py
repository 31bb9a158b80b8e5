"""A `fab` run started in the background and held on the node at a named failpoint: the lab tests
that interrupt, cut or race a run at a known moment (a SIGINT while every agent holds the lock, a
link cut mid-patch, a second run meeting the lock) do it here, so the moment is proven by the
node's own hit file and no test guesses it with a sleep.

The failpoint's `pause` action holds the agent until the test deletes the hit file (which names
the agent's pid), at most `seconds`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from conftest import REPO
from faultkit import arm, disarm, hit_file
from polling import DEADLINE_S, wait_for

from fleetops.lab import Node

# fab's live status lines off: a test that reads its output reads the plain lines a pipe gets
NO_LIVE = {"FLEETOPS_NO_LIVE": "1"}


def start_fab(project: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python -m fabric ARGS` in the background, stdout and stderr piped apart, as the operator's
    shell starts it (the test's environment, with this checkout on PYTHONPATH)."""
    return subprocess.Popen(
        [sys.executable, "-m", "fabric", *args],
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def arm_pause(nodes: Sequence[Node], point: str, seconds: float, skip: int = 0) -> list[Path]:
    """Each node's next agent pauses at `point` (on its hit number skip+1); their hit files. A hit
    file an earlier run left is removed first: only this run's agent may make it appear."""
    hits = []
    for node in nodes:
        hit = hit_file(node, point)
        hit.unlink(missing_ok=True)
        arm(node, {point: {"action": "pause", "seconds": seconds, "skip": skip}})
        hits.append(hit)
    return hits


@contextmanager
def running_fab(
    project: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen]:
    """start_fab, killed (and reaped) on the way out if the test left it running, so a failed test
    leaves no fab behind to hold a node's lock."""
    proc = start_fab(project, *args, env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@contextmanager
def fab_paused_at(
    project: Path,
    nodes: Sequence[Node],
    point: str,
    args: Sequence[str],
    seconds: float,
    skip: int = 0,
    env: dict[str, str] | None = None,
    timeout: float = DEADLINE_S,
    what: str = "",
) -> Iterator[subprocess.Popen]:
    """`fab ARGS` started with every one of `nodes` armed to pause at `point`; yields it once each
    of them is held there, still running (a fab that ended first fails the test with its output).
    On the way out a fab still running is killed and the nodes are disarmed, whatever the test did,
    so a failed test leaves no paused run for the next one."""
    hits = arm_pause(nodes, point, seconds, skip)
    try:
        with running_fab(project, *args, env=env) as proc:
            wait_for(
                lambda: all(hit.exists() for hit in hits) or proc.poll() is not None,
                what or f"every node's agent to pause at {point}",
                timeout,
            )
            assert proc.poll() is None, proc.communicate()
            yield proc
    finally:
        for node in nodes:
            disarm(node)


@contextmanager
def patch_holding_the_lock(project: Path, node: Node) -> Iterator[tuple[subprocess.Popen, int]]:
    """`fab -H NODE patch --json` held on the node inside its lock, the file not yet written; yields
    it and the pid of the agent that holds the lock. The failpoint is disarmed at once, so any
    later run meets the lock itself, not the pause. The agent goes on when the test deletes
    hit_file(node, "lock.acquired"), at the latest after 300 s."""
    with fab_paused_at(
        project,
        [node],
        "lock.acquired",
        ["-H", node.name, "patch", "--json"],
        seconds=300,
        what=f"{node.name}'s agent to take the lock",
    ) as proc:
        disarm(node)
        yield proc, int(hit_file(node, "lock.acquired").read_text())
