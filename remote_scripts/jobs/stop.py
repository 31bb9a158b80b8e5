"""Stopping a job (stdlib only): SIGTERM, then SIGKILL after the grace, to every process proven the
job's at that moment (its tag, or its group while its keeper lives), through a pidfd where there is
one."""

from __future__ import annotations

import json
import os
import signal
import time

from ..core.atomicio import atomic_write
from ..core.nodeio import now_iso
from ..core.procfs import start_ticks, stat_fields, uids
from ..core.registry import node_op
from ..core.statetrust import read_json
from .keeper import record_end
from .liveness import job_state
from .procscan import group_members, process_alive, tagged_pids
from .records import STOP_ASKED, load_job


def _keeper_alive(job_dir: str, job: dict) -> bool:
    """The job's keeper still runs: its recorded pid with the start time recorded at launch (for a
    job recorded without one: a command line that names the job dir), under the login uid. While it
    lives, the process group it leads (the job's pgid) is the job's: a pgid is not given to another
    process while its group exists."""
    pid = job.get("keeper_pid")
    if not pid or uids(pid) != (os.getuid(), os.getuid()):
        return False
    if job.get("keeper_started") is not None:
        fields = stat_fields(pid)
        return (
            fields is not None
            and fields[0] not in ("Z", "X")
            and start_ticks(pid) == job["keeper_started"]
        )
    return process_alive(pid, job_dir)


def _group(job_dir: str, job: dict) -> int | None:
    """The job's process group, only while its keeper lives (after that, its number may be
    anyone's)."""
    pgid = int(job["pgid"]) if job.get("pgid") else None
    return pgid if pgid and pgid == job.get("keeper_pid") and _keeper_alive(job_dir, job) else None


def _members(job_dir: str, job: dict) -> list[int]:
    """The job's live processes: every process of the login uid carrying its tag, and while its
    keeper lives, the members of its process group (a process that dropped its environment, env -i,
    but not its group)."""
    pgid = _group(job_dir, job)
    group = (
        [p for p in group_members(pgid) if uids(p) == (os.getuid(), os.getuid())] if pgid else []
    )
    return sorted(set(group) | set(tagged_pids(job_dir)))


def _has_tag(pid: int, job_dir: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return False
    return f"FLEETOPS_JOB_DIR={os.path.abspath(job_dir)}".encode() in env.split(b"\0")


def _proven(pid: int, job_dir: str, job: dict) -> bool:
    """`pid` is the job's, now: a live process of the login uid (real and effective) that carries
    the job's tag, or a member of the job's process group while its keeper lives."""
    if uids(pid) != (os.getuid(), os.getuid()):
        return False
    fields = stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    if _has_tag(pid, job_dir):
        return True
    pgid = _group(job_dir, job)
    return pgid is not None and int(fields[2]) == pgid


def _pidfd(pid: int) -> int | None:
    """A descriptor that names this very process (Linux 5.3+, Python 3.9+): a signal sent through it
    reaches it or nothing, never a later process given the same pid. None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _signal_all(job_dir: str, job: dict, pids: list[int], sig: int) -> list[int]:
    """Signal each process proven the job's at that moment (checked after its pidfd is taken: the
    signal goes to the process that was checked, or, if it has ended since, to none). The keeper
    last: while it lives its group is provably the job's. Returns the pids signalled."""
    keeper = job.get("keeper_pid")
    sent = []
    for pid in sorted(pids, key=lambda p: p == keeper):
        fd = _pidfd(pid)
        try:
            if not _proven(pid, job_dir, job):
                continue
            if fd is not None:
                signal.pidfd_send_signal(fd, sig)
            # no pidfd: the check above was made just now; a pid reused in between is the residual
            # risk
            else:
                os.kill(pid, sig)
            sent.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
        finally:
            if fd is not None:
                os.close(fd)
    return sent


def _note_stop_asked(job_dir: str) -> None:
    """Say on the node, before the first signal, that fleetops' `stop` ends this job: its wrapper
    (or keeper) records the end that follows as `by: stop`, so `status` reports it stopped, not
    killed. A write that fails (a full disk) leaves the record as the signal made it; the stop goes
    on."""
    try:
        atomic_write(
            os.path.join(job_dir, STOP_ASKED),
            (json.dumps({"at": now_iso(), "ts": time.time()}) + "\n").encode(),
            mode=0o600,
            point="job.stop",
        )
    except OSError:
        pass


@node_op("job_stop", writes=True)
def job_stop(req: dict) -> dict:
    """Stop the job: SIGTERM to each of its processes (its tagged ones, one that left the group with
    setsid included, and its group while the keeper lives), SIGKILL after the grace; then no process
    of the job may be left. A process is signalled only when it is proven the job's at that moment
    (_proven): a recorded pgid or pid that now names someone else's process is never touched."""
    job_dir, job = load_job(req["state_dir"], req.get("job_id"))
    st = job_state(job_dir, job)
    pgid = int(job["pgid"]) if job.get("pgid") else None
    group = _group(job_dir, job)  # the recorded pgid, while the keeper that leads it lives
    group_before = set(group_members(group)) if group else set()
    if st["state"] not in ("running", "starting"):
        return _stop_ended(job_dir, job, st, pgid, group_before)
    grace = float(req.get("grace_s", 10))
    first = _members(job_dir, job)
    outside = sorted(set(first) - group_before)
    _note_stop_asked(job_dir)
    _signal_all(job_dir, job, first, signal.SIGTERM)
    _wait_gone(job_dir, job, grace, 0.1)
    escalated = bool(_members(job_dir, job))
    if escalated:
        _signal_all(job_dir, job, _members(job_dir, job), signal.SIGKILL)
        _wait_gone(job_dir, job, 5, 0.05)
    _ensure_exit_record(job_dir)
    left = _members(job_dir, job)
    return {
        "ok": not left,
        "changed": True,
        "job_id": job["id"],
        "pgid": pgid,
        "escalated": escalated,
        "left": left,
        "outside_group": outside,
        **job_state(job_dir, job),
        "msg": _stopped_msg(job["id"], escalated, left, outside),
    }


def _wait_gone(job_dir: str, job: dict, seconds: float, step: float) -> None:
    """Wait up to `seconds` for every process of the job to be gone."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _members(job_dir, job):
        time.sleep(step)


def _stop_ended(
    job_dir: str, job: dict, st: dict, pgid: int | None, group_before: set[int]
) -> dict:
    """The job has ended: nothing to stop, but processes it left behind (e.g. its main process was
    SIGKILLed) are killed."""
    left = _members(job_dir, job)
    if not left:
        return {
            "ok": True,
            "changed": False,
            "job_id": job["id"],
            **st,
            "msg": f"job {job['id']} is not running ({st['state']}); nothing to stop",
        }
    killed = _signal_all(job_dir, job, left, signal.SIGKILL)
    _wait_gone(job_dir, job, 5, 0.05)
    remaining = _members(job_dir, job)
    where = "in its group" if killed and set(killed) <= group_before else "(tagged with it)"
    msg = (
        f"job {job['id']} had ended ({st['state']}) but left {len(killed)} processes {where}: "
        f"killed {killed}"
    )
    if remaining:
        msg += f"; still there: {remaining}"
    return {
        "ok": not remaining,
        "changed": bool(killed),
        "job_id": job["id"],
        "pgid": pgid,
        **st,
        "left": remaining,
        "msg": msg,
    }


def _ensure_exit_record(job_dir: str) -> None:
    """The wrapper writes exit.json when it sees the job end (unless it was killed too): wait a
    moment for it, else record the stop's own end."""
    exit_path = os.path.join(job_dir, "exit.json")
    for _ in range(50):
        if read_json(exit_path):
            return
        time.sleep(0.02)
    if read_json(exit_path):
        return
    record_end(
        job_dir,
        {
            "exit_code": None,
            "signal": int(signal.SIGKILL),
            "ended": now_iso(),
            "ended_ts": time.time(),
            "by": "stop",
        },
    )


def _stopped_msg(job_id: str, escalated: bool, left: list[int], outside: list[int]) -> str:
    how = "SIGTERM, then SIGKILL after the grace period" if escalated else "SIGTERM"
    msg = f"stopped job {job_id} with {how}"
    if left:
        msg += f"; processes of the job still alive: {left}"
    else:
        msg += "; no process of its group is left"
    if outside:
        msg += (
            f"; also ended {len(outside)} processes outside its group, found by their "
            f"FLEETOPS_JOB_DIR tag: {outside}"
        )
    return msg
