"""The output-directory lock of an extraction (remote_scripts/jobs/outputlock.py), with real
processes on a real directory: of runs that start at once exactly one takes it; a lock whose process
is gone is stale only on the host that took it (there it is taken over); a lock of another host
(another boot, or a name that is not this host's) is never judged here and is refused naming that
host and job; a lock is released only by its holder."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
from pathlib import Path

from remote_scripts.core.procfs import start_ticks
from remote_scripts.jobs import outputlock as ol

REPO = Path(__file__).resolve().parent.parent
RACERS = 8


def _race(output: str, job: str, go, results) -> None:
    go.wait()
    try:
        ol.acquire(output, job)
        results.put((job, "took"))
        go2 = multiprocessing.Event()
        go2.wait(0.3)  # hold it while the others try
    except ol.OutputBusy as busy:
        results.put((job, str(busy)))


def test_of_runs_started_at_once_exactly_one_takes_the_output(tmp_path):
    ctx = multiprocessing.get_context("fork")
    go, results = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_race, args=(str(tmp_path), f"job-{i}", go, results))
        for i in range(RACERS)
    ]
    for p in procs:
        p.start()
    go.set()
    got = [results.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    took = [job for job, said in got if said == "took"]
    assert len(took) == 1, got
    refused = [said for job, said in got if said != "took"]
    assert all(f"job {took[0]} (pid " in said and "on this host" in said for said in refused), (
        refused
    )


def test_a_lock_whose_process_is_gone_is_taken_over_on_its_own_host(tmp_path):
    # A real process takes the lock and is SIGKILLed (as the OOM killer ends a run): its lock stays
    # behind.
    code = (
        "import os, sys; sys.path.insert(0, sys.argv[2]); from remote_scripts.jobs import "
        "outputlock as ol; ol.acquire(sys.argv[1], 'killed-1'); os.kill(os.getpid(), 9)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), str(REPO)], capture_output=True
    )
    assert proc.returncode == -9, proc.stderr
    left = json.loads((tmp_path / ol.LOCK).read_text())
    assert left["job"] == "killed-1" and left["host"] == socket.gethostname(), left
    assert ol.judge(left) == "stale" and ol.held(str(tmp_path)) is None
    path = ol.acquire(str(tmp_path), "next-2")
    assert json.loads(Path(path).read_text())["job"] == "next-2"
    ol.release(path)
    assert not (tmp_path / ol.LOCK).exists()


def test_another_hosts_lock_is_refused_naming_it_and_never_judged_stale_here(tmp_path):
    other = {**ol.me("elsewhere-3", os.getpid()), "host": "lab09", "boot_id": "0" * 32, "pid": 1}
    (tmp_path / ol.LOCK).write_text(json.dumps(other))
    assert ol.judge(other) == "elsewhere"
    holder = ol.held(str(tmp_path))
    assert holder is not None and holder["judged"] == "elsewhere"
    try:
        ol.acquire(str(tmp_path), "mine-4")
    except ol.OutputBusy as busy:
        assert str(busy).startswith(
            f"job elsewhere-3 (pid 1 on host lab09, since {other['at']}) holds "
        ), busy
    else:
        raise AssertionError("another host's lock was taken")
    # This host's own name, booted since: no process of that boot lives, so it is stale here.
    rebooted = {**other, "host": socket.gethostname()}
    assert ol.judge(rebooted) == "stale"
    # A pid namespace other than ours on this boot (a container): its pids are not ours to judge.
    assert ol.judge({**ol.me("c-5", os.getpid()), "pid_ns": "pid:[1]"}) == "elsewhere"


def test_a_lock_is_released_only_by_its_holder(tmp_path):
    path = ol.acquire(str(tmp_path), "mine-6")
    mine = (tmp_path / ol.LOCK).read_text()
    theirs = {**json.loads(mine), "pid": os.getppid(), "pid_started": start_ticks(os.getppid())}
    (tmp_path / ol.LOCK).write_text(json.dumps(theirs))
    ol.release(path)  # not ours any more: left alone
    assert json.loads((tmp_path / ol.LOCK).read_text()) == theirs
    assert ol.held(str(tmp_path))["judged"] == "live"


def _take_and_give_back(output: str, rounds: int, stop) -> None:
    for i in range(rounds):
        if stop.is_set():
            return
        try:
            ol.release(ol.acquire(output, f"job-{os.getpid()}-{i}"))
        except ol.OutputBusy:
            pass


def test_a_lock_is_never_seen_without_its_holder(tmp_path):
    """A reader that finds the lock finds who holds it: between a create and its write a racer would
    read an empty lock and call a live run's lock damaged."""
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    takers = [
        ctx.Process(target=_take_and_give_back, args=(str(tmp_path), 400, stop)) for _ in range(2)
    ]
    for p in takers:
        p.start()
    seen = empty = 0
    try:
        while any(p.is_alive() for p in takers) and seen < 3000:
            holder = ol._read(str(tmp_path / ol.LOCK))
            if holder is not None:
                seen += 1
                empty += not holder
    finally:
        stop.set()
        for p in takers:
            p.join(timeout=30)
    assert seen > 50, f"the lock was seen only {seen} times: the test looked at nothing"
    assert empty == 0, f"{empty} of {seen} readings found the lock without a holder"
    # no temp file left
    assert sorted(os.listdir(tmp_path)) in ([], [ol.TAKEOVER]), os.listdir(tmp_path)
