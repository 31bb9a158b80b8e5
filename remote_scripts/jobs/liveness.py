"""A job's state (stdlib only): running while any process carrying its tag lives, else what its exit
record says, with what went wrong around it (its wrapper gone, a full disk); the job running on this
node."""

from __future__ import annotations

import os
import time

from ..core.failpoints import failpoint
from ..core.nodeio import NodeError
from ..core.statetrust import read_json
from .procscan import process_alive, tag_index, tagged_pids
from .records import all_jobs, drop_secrets, jobs_dir, load_job

# less free than this on the job dir's filesystem at the end: reported as full
DISK_FULL_BYTES = 64 * 1024


def _supervisors_alive(job_dir: str, job: dict) -> list[int]:
    """The keeper and the wrapper, when alive and still ours (their command line names the job
    dir)."""
    return [
        int(p)
        for p in (job.get("keeper_pid"), job.get("wrapper_pid"))
        if p and process_alive(p, job_dir)
    ]


def disk_full(path: str) -> dict | None:
    """The filesystem holding `path` is (almost) full: its free bytes, else None."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    return {"path": path, "free_bytes": free} if free < DISK_FULL_BYTES else None


def _end_cause(ended: dict) -> str:
    """What went wrong around an ended job, from its exit record ("" if nothing did)."""
    causes = []
    # the job's own words, one line (extract_hidden_states.py)
    if isinstance(ended.get("job_cause"), str):
        causes.append(ended["job_cause"])
    if ended.get("wrapper_error"):
        causes.append(ended["wrapper_error"])
    space = ended.get("no_space")
    # The job's own ENOSPC, from its log's last lines (keeper.no_space), unless the job said it in
    # its own words.
    if isinstance(space, dict) and not ended.get("job_cause"):
        where = f" writing {space['path']}" if space.get("path") else ""
        causes.append(
            f"no space left on device{where} (the log says: {space.get('line', '')!r}); free "
            "space there and re-run"
        )
    if ended.get("disk_full"):
        full = ended["disk_full"]
        causes.append(
            f"the job's filesystem was full when it ended ({full['free_bytes']} bytes free on "
            f"{full['path']}): writes to its log or output failed with ENOSPC (No space left on "
            f"device); free space there and re-run"
        )
    if ended.get("wrapper_killed"):
        causes.append(ended["wrapper_killed"])
    return "; ".join(causes)


def job_state(job_dir: str, job: dict, index: dict[str, list[int]] | None = None) -> dict:
    """The job's state from its exit record and its own processes (found by their tag; `index`: one
    scan of /proc made for many jobs). `running` while any tagged process lives, whatever happened
    to the wrapper; `left` names processes still alive after the job's main process ended; `cause`
    says what went wrong around the job (its wrapper gone, a full disk)."""
    ended = read_json(os.path.join(job_dir, "exit.json"))
    failpoint("job.state.read")  # a test ends the job and its wrapper here
    now = time.time()
    if index is not None:
        tagged = sorted(index.get(os.path.abspath(job_dir), []))
    else:
        tagged = tagged_pids(job_dir)
    if not ended and not tagged:
        ended = _await_exit_record(job_dir, job)
    runtime: float | None
    if ended:
        state, runtime, extra = _ended(ended, job, tagged, now)
    elif tagged:
        state, runtime, extra = _running(job_dir, job, tagged, now)
    else:
        state, runtime, extra = _untagged(job_dir, job, now)
    if state not in ("running", "starting"):
        drop_secrets(job_dir)
    return {
        "state": state,
        "exit": ended,
        "runtime_s": round(runtime, 1) if runtime is not None else None,
        "tagged": tagged,
        **extra,
    }


def _await_exit_record(job_dir: str, job: dict) -> dict | None:
    """No exit record and no tagged process: the exit record, once a supervisor still alive has
    written it."""
    path = os.path.join(job_dir, "exit.json")
    if _supervisors_alive(job_dir, job):
        # The job is done and its wrapper is writing exit.json: give it a moment, then read again.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and _supervisors_alive(job_dir, job):
            time.sleep(0.05)
            ended = read_json(path)
            if ended:
                return ended
    # Read once more, now that the job and its supervisors were seen gone: the wrapper writes
    # exit.json before it exits, so a record written after the first read (or the loop's last)
    # is there by now. Without this read, a job that ended in that window was called "lost".
    return read_json(path)


def _ended(ended: dict, job: dict, tagged: list[int], now: float) -> tuple[str, float, dict]:
    """An exit record: killed, succeeded or failed; processes left behind; what went wrong."""
    if ended.get("signal"):
        state = "killed"
    else:
        state = "succeeded" if ended.get("exit_code") == 0 else "failed"
    extra: dict = {}
    if tagged:
        extra["left"] = tagged
    cause = _end_cause(ended)
    if cause:
        extra["cause"] = cause
    return state, ended.get("ended_ts", now) - job.get("started_ts", now), extra


def _running(job_dir: str, job: dict, tagged: list[int], now: float) -> tuple[str, float, dict]:
    """No exit record, tagged processes alive: running, though maybe with nothing left to record
    its exit."""
    extra: dict = {}
    if job.get("pid") and not _supervisors_alive(job_dir, job):
        extra["cause"] = (
            f"its wrapper (pid {job.get('wrapper_pid')}) and keeper (pid "
            f"{job.get('keeper_pid')}) are gone: the job's processes {tagged} run on, but "
            "nothing will record its exit status"
        )
    return "running", now - job.get("started_ts", now), extra


def _untagged(job_dir: str, job: dict, now: float) -> tuple[str, float | None, dict]:
    """No exit record, no tagged process: starting (or just started) while its supervisors live
    or its wrapper is not yet launched; lost otherwise."""
    since = now - job.get("started_ts", now)
    launching = job.get("wrapper_pid") is None and since < 10
    if launching or _supervisors_alive(job_dir, job):
        return ("running" if job.get("pid") else "starting"), since, {}
    full = disk_full(job_dir)
    if not full:
        return "lost", None, {}
    cause = (
        f"the job's filesystem is full ({full['free_bytes']} bytes free on {job_dir}): "
        "ENOSPC (No space left on device) kept its wrapper from recording the exit "
        "status; free space there"
    )
    return "lost", None, {"cause": cause}


def running_job(state_dir: str) -> dict | None:
    """The job running on this node: the current one, or any other whose tagged processes still
    live."""
    try:
        job_dir, job = load_job(state_dir, None)
    except NodeError:
        job = None
    if job is not None:
        st = job_state(job_dir, job)
        if st["state"] in ("running", "starting"):
            return {**job, **st}
    running_dirs = set(tag_index())
    for other in all_jobs(state_dir):
        other_dir = os.path.join(jobs_dir(state_dir), other["id"])
        if other_dir in running_dirs and (job is None or other["id"] != job["id"]):
            st = job_state(other_dir, other)
            if st["state"] in ("running", "starting"):
                return {**other, **st}
    return None


def live_job_ids(state_dir: str) -> list[str]:
    """Ids of the jobs under state_dir that have a live tagged process (running, or ended with
    leftovers)."""
    base = jobs_dir(state_dir)
    return sorted({os.path.basename(d) for d in tag_index() if os.path.dirname(d) == base})
