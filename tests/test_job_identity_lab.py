"""`stop` signals only processes it proves are the job's, against a real lab node.

After an SSH job has ended, its recorded process group number is free: the kernel may give it to any
process of any user. Here another user (uid 65534) gets exactly that number as the pid (and so the
process group) of a `setsid sleep 600` (the pid is placed with /proc/sys/kernel/ns_last_pid), and
`stop` must leave it alone: a process is signalled only when, at that moment, it runs as the login
uid and carries the job's tag, or belongs to the job's group while the keeper that leads it still
lives."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO, fab_json
from polling import wait_for

pytestmark = [
    pytest.mark.lab,
    pytest.mark.root("placing a pid with ns_last_pid and setpriv need root"),
]
NOBODY = 65534
JOBS = str(REPO / "tests" / "playbooks" / "jobs.yaml")
NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")


def uid_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def place_at(pid: int, attempts: int = 200) -> subprocess.Popen | None:
    """uid 65534's `setsid sleep 600` as process `pid` (its own session and group, so its pgid is
    `pid` too), or None when other processes of the machine kept taking the number first."""
    for _ in range(attempts):
        if Path(f"/proc/{pid}").exists():
            return None  # taken by someone else meanwhile
        NS_LAST_PID.write_text(str(pid - 1))
        proc = subprocess.Popen(
            [
                "setpriv",
                f"--reuid={NOBODY}",
                f"--regid={NOBODY}",
                "--clear-groups",
                "setsid",
                "sleep",
                "600",
            ],
            stdin=subprocess.DEVNULL,
        )
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


def ended_job(lab) -> dict:
    rc, doc = fab_json(lab.root, "-H", "lab01", "extract", "--job", "envecho", "--playbook", JOBS)
    assert rc == 0, doc
    job_dir = Path(doc["results"][0]["data"]["job"]["log"]).parent
    wait_for(lambda: (job_dir / "exit.json").exists(), "the job's end", timeout=120)
    job = json.loads((job_dir / "job.json").read_text())
    wait_for(
        lambda: not any(alive(int(job[k])) for k in ("keeper_pid", "wrapper_pid", "pid")),
        "the job's keeper, wrapper and process to be gone",
        timeout=60,
    )
    # and reaped by whoever adopted the keeper (init), so that its number, the job's pgid, is free
    # again
    wait_for(
        lambda: not Path(f"/proc/{job['pgid']}").exists(),
        "the job's keeper to be reaped",
        timeout=180,
        every=0.2,
    )
    return job


def test_a_recorded_pgid_reused_by_another_users_process_survives_stop(lab):
    for _ in range(5):  # a busy machine may hand the freed number to one of its own processes first
        job = ended_job(lab)
        other = place_at(int(job["pgid"]))
        if other is not None:
            break
    else:
        pytest.fail(
            "could not place a process at a freed job's "
            "pgid in 5 tries (the machine took the numbers)"
        )
    try:
        pgid = int(job["pgid"])
        # the premise, from /proc
        wait_for(
            lambda: os.getpgid(other.pid) == pgid and uid_of(other.pid) == NOBODY,
            "uid 65534's process to lead the group numbered as the job's was",
        )
        rc, doc = fab_json(lab.root, "-H", "lab01", "stop", "--job-id", job["id"], "--grace", "2")
        (result,) = doc["results"]
        time.sleep(0.5)
        assert alive(other.pid) and uid_of(other.pid) == NOBODY, result
        assert rc == 0 and str(other.pid) not in result["msg"], result
        assert "nothing to stop" in result["msg"], result["msg"]
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()


UNTAGGED = json.dumps(
    {
        "name": "identity-jobs",
        "jobs": {
            "untagged": {
                "kind": "command",
                "preflight": [],
                "gpu_gate": False,
                "command": [
                    "{python}",
                    "-c",
                    "import subprocess, time\nkid = subprocess.Popen(['env', '-i', 'sleep', "
                    "'300'])\nprint(f'child {kid.pid}', flush=True)\ntime.sleep(300)\n",
                ],
            }
        },
    }
)


def test_a_process_that_dropped_the_tag_but_stayed_in_the_group_is_stopped_while_the_keeper_lives(
    lab,
):
    """The other proof: while the keeper that leads the job's process group lives, the group is the
    job's, so a child that dropped its whole environment (env -i: no tag) is still stopped."""
    book = lab.root / "identity-jobs.yaml"
    book.write_text(UNTAGGED)
    rc, doc = fab_json(
        lab.root, "-H", "lab01", "extract", "--job", "untagged", "--playbook", str(book)
    )
    assert rc == 0, doc
    job = doc["results"][0]["data"]["job"]
    log = Path(job["log"])
    child = int(
        wait_for(
            lambda: re.search(r"child (\d+)", log.read_text() if log.exists() else ""),
            "the job's untagged child",
        ).group(1)
    )
    wait_for(
        lambda: (
            alive(child) and b"FLEETOPS_JOB_DIR=" not in Path(f"/proc/{child}/environ").read_bytes()
        ),
        "the child to run without the job's tag",
    )
    assert os.getpgid(child) == job["pgid"] and alive(job["keeper_pid"])  # the premise, from /proc
    rc, doc = fab_json(lab.root, "-H", "lab01", "stop", "--grace", "5")
    assert rc == 0 and doc["results"][0]["status"] == "changed", doc
    wait_for(lambda: not alive(child), "the untagged child to be stopped", timeout=30)
