"""Long jobs on the node that outlive the SSH session: start (detached, own session), status, tail by byte
offset, logs, stop (the whole process group). Stdlib only.

Layout: <state_dir>/jobs/<id>/{job.json, request.json, output.log, exit.json}; jobs/current.json names the
latest job. Two small processes stand behind the job: the keeper (`agent.pyz wrap <job_dir>`, session leader
and child subreaper) and the wrapper it forks (the job's parent), which waits for the job and writes exit.json
however it ends (exit code or signal). If the wrapper is killed the job is re-parented to the keeper, which
collects and records its exit status instead; exit.json is written into space reserved at launch
(exit.reserve), so a full disk cannot lose it.

Every process of the job carries FLEETOPS_JOB_DIR=<job_dir> (and FLEETOPS_JOB_ID) in its environment: whether a
job runs is decided by scanning /proc/*/environ of this user's processes for that tag, not by the wrapper or the
process group, and `stop` kills every tagged process (a child that left the group with setsid included). Only a
process that drops its whole environment (env -i) escapes the tag. Launching is atomic per node: the running
check and the launch happen under jobs/launch.lock.
"""

from __future__ import annotations

import ctypes
import fcntl
import io
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time

from ..core.bootstrap import EXIT_REFUSED
from ..core.launch import relaunch
from ..core.launch import shown as shown_argv
from ..core.nodeio import (
    QUARANTINED,
    NodeError,
    atomic_write,
    ensure_dir,
    failpoint,
    load_failpoints,
    now_iso,
    open_state_file,
    pid_alive,
    read_json,
    trusted_stat,
    write_json_atomic,
)
from ..core.procfs import start_ticks, stat_fields, uids

LOG = "output.log"
TAIL_CHUNK = 256 * 1024
LONG_LINE = 16 * 1024  # a log line longer than this is shown cut: its first and last LINE_KEEP bytes
LINE_KEEP = 4096
LINE_SCAN = 64 * 1024 * 1024  # how far one tail poll reads for the end of a long line
KNOWN_IDS_SHOWN = 10
# Secret env values (the playbook's secret_env, the inventory's {secret: ...}) travel to the wrapper in this
# 0600 file, never in job.json; the wrapper deletes it as soon as the job's process has them.
SECRET_ENV = "secret-env.json"
RESERVE = "exit.reserve"  # space for exit.json taken at launch, overwritten in place at the end
RESERVE_BYTES = 8192
LAUNCH_LOCK = "launch.lock"
LAUNCH_LOCK_WAIT_S = 60.0
DEFAULT_TAIL_LINES = 20
COUNT_LINES_MAX = 64 * 1024 * 1024  # skipped lines are counted up to this many bytes
JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,120}")
DISK_FULL_BYTES = 64 * 1024  # less free than this on the job dir's filesystem at the end: reported as full


def jobs_dir(state_dir: str) -> str:
    return os.path.join(os.path.abspath(state_dir), "jobs")


def expand(value: object, mapping: dict[str, str]) -> object:
    """Fill {state_dir}, {job_dir} and {python} in job values (plain text substitution; nothing is evaluated)."""
    if isinstance(value, str):
        for key, sub in mapping.items():
            value = value.replace("{" + key + "}", sub)
        return value
    if isinstance(value, list):
        return [expand(v, mapping) for v in value]
    if isinstance(value, dict):
        return {k: expand(v, mapping) for k, v in value.items()}
    return value


def _process_alive(pid: int | None, marker: str) -> bool:
    if not pid or not pid_alive(int(pid)):
        return False
    fields = stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return marker.encode() in f.read()
    except OSError:
        return False


def tagged_pids(job_dir: str) -> list[int]:
    """Live (not zombie) processes of this user whose environment carries the job's tag: the job's own
    processes wherever they are (another process group, a new session), found without the wrapper."""
    me = os.getpid()
    return sorted(p for p in _tag_index().get(os.path.abspath(job_dir), []) if p != me)


def _supervisors_alive(job_dir: str, job: dict) -> list[int]:
    """The keeper and the wrapper, when alive and still ours (their command line names the job dir)."""
    return [int(p) for p in (job.get("keeper_pid"), job.get("wrapper_pid")) if p and _process_alive(p, job_dir)]


def _disk_full(path: str) -> dict | None:
    """The filesystem holding `path` is (almost) full: its free bytes, else None."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    return {"path": path, "free_bytes": free} if free < DISK_FULL_BYTES else None


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(entry)
        if fields is None:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def load_job(state_dir: str, job_id: str | None) -> tuple[str, dict]:
    """The job asked for, else the latest one. Its records are written atomically (write_json_atomic), so a
    corrupt one is truly corrupt, never one being written: it is moved aside (reported), not fatal forever."""
    base = jobs_dir(state_dir)
    if not job_id:
        current = read_json(os.path.join(base, "current.json"), on_corrupt="quarantine")
        latest = (current or {}).get("id")
        if not isinstance(latest, str) or not JOB_ID.fullmatch(latest) or \
                not os.path.lexists(os.path.join(base, latest, "job.json")):
            # no pointer (or a corrupt one, moved aside), or its job's record is gone: the newest readable job
            newest = all_jobs(state_dir)
            if not newest:
                raise NodeError("no job has been started on this node", kind="no_job")
            latest = newest[0]["id"]
        job_id = latest
    if not JOB_ID.fullmatch(job_id):
        raise NodeError(f"bad job id {job_id!r}", kind="no_job")
    job_dir = os.path.join(base, job_id)
    before = len(QUARANTINED)
    job = read_json(os.path.join(job_dir, "job.json"), on_corrupt="quarantine")
    if job is None and len(QUARANTINED) > before:
        raise _quarantined_job(job_id, job_dir, QUARANTINED[-1])
    if job is None:
        known = [j["id"] for j in all_jobs(state_dir)]
        shown = ", ".join(known[:KNOWN_IDS_SHOWN]) + (f" (and {len(known) - KNOWN_IDS_SHOWN} older)"
                                                       if len(known) > KNOWN_IDS_SHOWN else "")
        raise NodeError(f"no job {job_id!r} on this node; its jobs, newest first: {shown}" if known else
                        f"no job {job_id!r} on this node; it has no jobs", kind="no_job", known=known)
    return job_dir, job


def _quarantined_job(job_id: str, job_dir: str, moved: dict) -> NodeError:
    """The answer about a job whose record was corrupt (just moved aside): which job, where its record went,
    and what of it is still there; the node's other jobs and new ones are unaffected."""
    log = os.path.join(job_dir, LOG)
    kept = f"its log {log} ({_size(log)} bytes)" if os.path.exists(log) else f"no log ({log} is missing)"
    pids = tagged_pids(job_dir)
    left = f"; its processes {pids} still run" if pids else ""
    return NodeError(f"job {job_id}'s record was corrupt ({moved['why']}) and is quarantined: moved to "
                     f"{moved['moved_to']}; kept: {kept} and its directory {job_dir}{left}; the node's other "
                     f"jobs are unaffected (fab jobs)", kind="corrupt_state", job_id=job_id, path=moved["path"],
                     moved_to=moved["moved_to"], log=log, left=pids)


def all_jobs(state_dir: str) -> list[dict]:
    """Every job with a readable job.json, newest first (a corrupt one is moved aside and reported, not fatal)."""
    base = jobs_dir(state_dir)
    try:
        names = os.listdir(base)
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(base, name, "job.json")
        entry = os.path.join(base, name)
        if not JOB_ID.fullmatch(name) or os.path.islink(entry) or not os.path.isdir(entry):
            continue
        try:
            job = read_json(path, on_corrupt="quarantine")
        except (NodeError, OSError):
            continue
        if job and job.get("id") == name:
            found.append(job)
    return sorted(found, key=lambda j: (j.get("started_ts") or 0, j["id"]), reverse=True)


def _drop_secrets(job_dir: str) -> bool:
    """Remove the job's secret env file (the wrapper does it once the job's process has the values; this is
    the fallback for a wrapper that died first). True if one was there."""
    try:
        os.unlink(os.path.join(job_dir, SECRET_ENV))
        return True
    except FileNotFoundError:
        return False


def job_state(job_dir: str, job: dict, index: dict[str, list[int]] | None = None) -> dict:
    """The job's state from its exit record and its own processes (found by their tag; `index`: one scan of
    /proc made for many jobs). `running` while any tagged process lives, whatever happened to the wrapper;
    `left` names processes still alive after the job's main process ended; `cause` says what went wrong around
    the job (its wrapper gone, a full disk)."""
    ended = read_json(os.path.join(job_dir, "exit.json"))
    failpoint("job.state.read")  # a test ends the job and its wrapper here
    now = time.time()
    tagged = sorted(index.get(os.path.abspath(job_dir), [])) if index is not None else tagged_pids(job_dir)
    out: dict = {"tagged": tagged}
    if not ended and not tagged and _supervisors_alive(job_dir, job):
        # The job is done and its wrapper is writing exit.json: give it a moment, then read again.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not ended and _supervisors_alive(job_dir, job):
            time.sleep(0.05)
            ended = read_json(os.path.join(job_dir, "exit.json"))
    if not ended and not tagged:
        # Read once more, now that the job and its supervisors were seen gone: the wrapper writes exit.json
        # before it exits, so a record written after the first read (or the loop's last) is there by now.
        # Without this read, a job that ended in that window was called "lost".
        ended = read_json(os.path.join(job_dir, "exit.json"))
    if ended:
        if ended.get("signal"):
            state = "killed"
        else:
            state = "succeeded" if ended.get("exit_code") == 0 else "failed"
        runtime = ended.get("ended_ts", now) - job.get("started_ts", now)
        if tagged:
            out["left"] = tagged
        causes = []
        if ended.get("wrapper_error"):
            causes.append(ended["wrapper_error"])
        if ended.get("disk_full"):
            full = ended["disk_full"]
            causes.append(f"the job's filesystem was full when it ended ({full['free_bytes']} bytes free on "
                          f"{full['path']}): writes to its log or output failed with ENOSPC (No space left on "
                          f"device); free space there and re-run")
        if ended.get("wrapper_killed"):
            causes.append(ended["wrapper_killed"])
        if causes:
            out["cause"] = "; ".join(causes)
    elif tagged:
        state, runtime = "running", now - job.get("started_ts", now)
        if job.get("pid") and not _supervisors_alive(job_dir, job):
            out["cause"] = (f"its wrapper (pid {job.get('wrapper_pid')}) and keeper (pid {job.get('keeper_pid')}) "
                            f"are gone: the job's processes {tagged} run on, but nothing will record its exit "
                            f"status")
    elif _supervisors_alive(job_dir, job) or (job.get("wrapper_pid") is None
                                              and now - job.get("started_ts", now) < 10):
        state, runtime = "starting" if not job.get("pid") else "running", now - job.get("started_ts", now)
    else:
        state, runtime = "lost", None
        full = _disk_full(job_dir)
        if full:
            out["cause"] = (f"the job's filesystem is full ({full['free_bytes']} bytes free on {job_dir}): "
                            f"ENOSPC (No space left on device) kept its wrapper from recording the exit status; "
                            f"free space there")
    if state not in ("running", "starting"):
        _drop_secrets(job_dir)
    return {"state": state, "exit": ended, "runtime_s": round(runtime, 1) if runtime is not None else None, **out}


def running_job(state_dir: str) -> dict | None:
    """The job running on this node: the current one, or any other whose tagged processes still live."""
    try:
        job_dir, job = load_job(state_dir, None)
    except NodeError:
        job = None
    if job is not None:
        st = job_state(job_dir, job)
        if st["state"] in ("running", "starting"):
            return {**job, **st}
    running_dirs = set(_tag_index())
    for other in all_jobs(state_dir):
        other_dir = os.path.join(jobs_dir(state_dir), other["id"])
        if other_dir in running_dirs and (job is None or other["id"] != job["id"]):
            st = job_state(other_dir, other)
            if st["state"] in ("running", "starting"):
                return {**other, **st}
    return None


def live_job_ids(state_dir: str) -> list[str]:
    """Ids of the jobs under state_dir that have a live tagged process (running, or ended with leftovers)."""
    base = jobs_dir(state_dir)
    return sorted({os.path.basename(d) for d in _tag_index() if os.path.dirname(d) == base})


def _tag_index() -> dict[str, list[int]]:
    """Every job dir named by a live process's tag → its pids (one pass over /proc)."""
    uid = os.getuid()
    out: dict[str, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        for var in env.split(b"\0"):
            if var.startswith(b"FLEETOPS_JOB_DIR="):
                fields = stat_fields(entry)
                if fields is not None and fields[0] not in ("Z", "X"):
                    out.setdefault(var.split(b"=", 1)[1].decode("utf-8", "replace"), []).append(int(entry))
                break
    return out


def _last_match(path: str, pattern: str | None) -> str | None:
    if not pattern:
        return None
    rx = re.compile(pattern)
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 65536))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    return next((ln for ln in reversed(lines) if rx.search(ln)), None)


# ---------------------------------------------------------------- operations
class _LaunchLock:
    """jobs/launch.lock (flock): the running check and the launch of one job are one step per node, so two
    `extract` at the same moment launch one job and refuse the other."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(jobs_dir(state_dir), LAUNCH_LOCK)
        self.fd = -1

    def __enter__(self) -> _LaunchLock:
        ensure_dir(os.path.dirname(self.path))
        self.fd = open_state_file(self.path, os.O_RDWR | os.O_CREAT)
        deadline = time.monotonic() + LAUNCH_LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    raise NodeError(f"another launch held {self.path} for {LAUNCH_LOCK_WAIT_S:.0f} s; run again",
                                    kind="locked") from None
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # releases the flock


def _leftovers(state_dir: str) -> tuple[str, list[int]] | None:
    """An ended job whose processes still live (tagged): a new job beside them would share the GPUs."""
    index = _tag_index()
    for job in all_jobs(state_dir):
        job_dir = os.path.join(jobs_dir(state_dir), job["id"])
        if index.get(job_dir) and os.path.exists(os.path.join(job_dir, "exit.json")):
            return job["id"], sorted(index[job_dir])
    return None


def job_start(req: dict) -> dict:
    with _LaunchLock(req["state_dir"]):
        return _job_start(req)


def _job_start(req: dict) -> dict:
    state_dir = os.path.abspath(req["state_dir"])
    spec = req["job"]
    running = running_job(state_dir)
    if running:
        raise NodeError(f"job {running['id']} is still running on this node (pid {running.get('pid')}, since "
                        f"{running.get('started')}); stop it or wait for it", kind="job_running", job=running)
    left = _leftovers(state_dir)
    if left:
        raise NodeError(f"job {left[0]} has ended but its processes {left[1]} still run; stop them first "
                        f"(fab stop --job-id {left[0]})", kind="job_running")
    failpoint("job.launch")  # inside the launch lock: a test widens the window between check and launch here
    job_id = f"{spec['name']}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"
    job_dir = os.path.join(jobs_dir(state_dir), job_id)
    ensure_dir(job_dir)
    spec = expand(spec, {"state_dir": state_dir, "job_dir": job_dir, "python": sys.executable})
    keeper_argv = relaunch("wrap", job_dir)  # before anything is written: refused here if not bootstrapped
    if spec["kind"] == "extract":
        request = {**spec["extract"], "state_dir": state_dir}
        write_json_atomic(os.path.join(job_dir, "request.json"), request)
        # What the wrapper starts (shown; it builds the real command itself: relaunch, verified bytes only)
        argv = shown_argv([*keeper_argv[:-2], "extract", os.path.join(job_dir, "request.json")])
    else:
        argv = list(spec["argv"])
    env = dict(spec.get("env", {}))
    shown = dict(spec.get("shown_env", env))
    # Secret keys: those the client names (secret_env), and any it masked in shown_env.
    named = set(spec.get("secret_env") or ())
    secret = {k: v for k, v in env.items() if k in named or shown.get(k) != v}
    if secret:
        atomic_write(os.path.join(job_dir, SECRET_ENV), (json.dumps(secret) + "\n").encode(), mode=0o600,
                     point="job.secret_env")
    job = {"id": job_id, "name": spec["name"], "kind": spec["kind"], "argv": argv,
           "env": {k: v for k, v in env.items() if k not in secret}, "secret_env_keys": sorted(secret),
           "shown_env": shown, "cwd": spec.get("cwd") or job_dir,
           "log": os.path.join(job_dir, LOG), "started": now_iso(), "started_ts": time.time(),
           "operator": req.get("operator"), "pid": None, "pgid": None, "wrapper_pid": None, "keeper_pid": None}
    write_json_atomic(os.path.join(job_dir, "job.json"), job)
    write_json_atomic(os.path.join(jobs_dir(state_dir), "current.json"), {"id": job_id})
    failpoint("job.keeper.launch")  # a test swaps what the keeper would run from here
    # The keeper's stdout is ours until it has started the job: a refusal of its bootstrap (exit 3) is read
    # there. Nothing else of the keeper or the job writes to it (the job writes to its log).
    keeper = subprocess.Popen(keeper_argv, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, cwd=job_dir, close_fds=True)
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            job = read_json(os.path.join(job_dir, "job.json")) or job
            if job.get("pid") or read_json(os.path.join(job_dir, "exit.json")):
                break
            if keeper.poll() is not None and not read_json(os.path.join(job_dir, "exit.json")):
                # gone without a record of the job (its own refusal, or a crash): it started nothing
                _drop_secrets(job_dir)
                raise _refused_keeper(job_id, job_dir, keeper)
            time.sleep(0.02)
        else:
            _drop_secrets(job_dir)
            raise NodeError(f"job {job_id} did not start within 10 s (see {job_dir})", kind="start_failed")
    finally:
        keeper.stdout.close()
    public = {k: v for k, v in job.items() if k != "env"}
    return {"ok": True, "job": public, **job_state(job_dir, job)}


def _refused_keeper(job_id: str, job_dir: str, keeper: subprocess.Popen) -> NodeError:
    """The keeper's bootstrap refused to run (the interpreter, the state dir or the agent's bytes changed since
    this agent started): its one-line answer, as the job's start failure."""
    from ..core import wirejson

    try:
        answer = wirejson.loads(keeper.stdout.read(65536) or b"{}")
    except ValueError:
        answer = {}
    if not isinstance(answer, dict):
        answer = {}
    why = answer.get("error") or f"it exited {keeper.returncode} without saying why"
    _record_end(job_dir, _end_record(keeper.returncode, job_dir, wrapper_error=f"the job's keeper did not start "
                                     f"it: {why}"))
    kind = answer.get("error_kind") if keeper.returncode == EXIT_REFUSED else None
    return NodeError(f"job {job_id} was not started: its keeper refused to run: {why}", kind=str(kind or
                                                                                                "start_failed"))


def job_status(req: dict) -> dict:
    job_dir, job = load_job(req["state_dir"], req.get("job_id"))
    st = job_state(job_dir, job)
    public = {k: v for k, v in job.items() if k != "env"}
    return {"ok": True, "job": public, **st, "log_bytes": _size(job["log"]),
            "last_progress": _last_match(job["log"], req.get("progress_pattern"))}


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _tree_bytes(path: str, budget: int = 20000) -> int | None:
    """Bytes of the regular files under path (symlinks not followed); None past `budget` entries."""
    total = 0
    seen = 0
    for root, dirs, files in os.walk(path):
        for name in files:
            seen += 1
            if seen > budget:
                return None
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if not os.path.islink(os.path.join(root, name)):
                total += st.st_size
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
    return total


def output_dir(job_dir: str, job: dict) -> str | None:
    """Where an extract job writes its samples and manifest (request.json's output), else None."""
    if job.get("kind") != "extract":
        return None
    try:
        request = read_json(os.path.join(job_dir, "request.json")) or {}
    except NodeError:
        return None
    out = request.get("output")
    return os.path.abspath(out) if isinstance(out, str) and out else None


def jobs_list(req: dict) -> dict:
    """Every job on the node, newest first: id, name, state, started, runtime, exit, output sizes."""
    state_dir = req["state_dir"]
    rows = []
    limit = int(req.get("limit") or 0)
    jobs = all_jobs(state_dir)
    index = _tag_index()
    for job in jobs[:limit] if limit else jobs:
        job_dir = os.path.join(jobs_dir(state_dir), job["id"])
        st = job_state(job_dir, job, index)
        out = output_dir(job_dir, job)
        rows.append({"id": job["id"], "name": job.get("name"), "kind": job.get("kind"), "started": job.get("started"),
                     "started_ts": job.get("started_ts"), "operator": job.get("operator"), **st,
                     "log": job.get("log"), "log_bytes": _size(job.get("log") or ""),
                     "output": out, "output_bytes": _tree_bytes(out) if out and os.path.isdir(out) else None})
    current = read_json(os.path.join(jobs_dir(state_dir), "current.json"), on_corrupt="quarantine") if rows else None
    latest = (current or {}).get("id") or (jobs[0]["id"] if jobs else None)
    return {"ok": True, "jobs": rows, "total": len(jobs), "latest": latest,
            "jobs_dir": jobs_dir(state_dir)}


def job_tail(req: dict) -> dict:
    """Bytes of the log from `offset`, whole lines only (until the job has ended), waiting up to wait_s
    for something new: one exec per poll, no line split across two answers; a line over LONG_LINE comes cut
    (_tail_read), so no line, however long, holds back the ones after it."""
    job_dir, job = load_job(req["state_dir"], req.get("job_id"))
    start: dict = {}
    if req.get("offset") is None:  # attaching: where to start
        start = attach_offset(job, req.get("last_lines"), bool(req.get("from_start")))
        offset = start["offset"]
    else:
        offset = int(req["offset"])
    deadline = time.monotonic() + float(req.get("wait_s", 5))
    while True:
        st = job_state(job_dir, job)
        ended = st["state"] not in ("running", "starting")
        size = _size(job["log"])
        if size > offset:
            with open(job["log"], "rb") as f:
                data, next_offset = _tail_read(f, offset, size, ended)
            if data:
                return {"ok": True, "job_id": job["id"], "data": data.decode("utf-8", "replace"),
                        "offset": offset, "next_offset": next_offset, **start, **st}
        if ended and _size(job["log"]) <= offset:
            return {"ok": True, "job_id": job["id"], "data": "", "offset": offset, "next_offset": offset, **start,
                    **st}
        if time.monotonic() >= deadline:
            return {"ok": True, "job_id": job["id"], "data": "", "offset": offset, "next_offset": offset, **start,
                    **st}
        time.sleep(0.1)


def _tail_read(f: io.BufferedReader, offset: int, size: int, ended: bool) -> tuple[bytes, int]:
    """What tail sends from `offset`: whole lines (the last one too once the job has ended), each line over
    LONG_LINE cut to its first and last LINE_KEEP bytes around a marker; and the offset after them. Empty
    while the only line there is still being written."""
    if offset > 0:
        f.seek(offset - 1)
        if f.read(1) != b"\n":  # the rest of a line cut by the answer before
            return _long_line(f, offset, size, ended, continued=True)
    f.seek(offset)
    data = f.read(min(size - offset, TAIL_CHUNK))
    more = len(data) < size - offset
    cut = data.rfind(b"\n") + 1
    if cut and (not ended or more):
        data = data[:cut]
    elif not cut and (not ended or more):
        if len(data) < TAIL_CHUNK:
            return b"", offset  # a line still being written
        return _long_line(f, offset, size, ended)  # one line longer than a whole chunk
    return b"".join(_cut_line(line) for line in data.splitlines(keepends=True)), offset + len(data)


def _cut_line(line: bytes, length: int | None = None, end: bytes | None = None, goes_on: bool = False) -> bytes:
    """line as tail shows it: whole up to LONG_LINE bytes, else its head and end around what was left out.
    `length`/`end`: the line's length and last bytes, when `line` holds only its start; `goes_on`: it has no
    end yet (the rest comes with a later answer)."""
    body = line[:-1] if line.endswith(b"\n") else line
    length = len(body) if length is None else length
    if length <= LONG_LINE:
        return line
    tail = body[-LINE_KEEP:] if end is None else end
    head = body[:LINE_KEEP]
    left = length - len(head) - len(tail)
    marker = (f" … [{left:,} bytes not shown; this line goes on] … " if goes_on else
              f" … [{left:,} bytes of this {length:,}-byte line not shown] … ")
    return head + marker.encode() + tail + b"\n"


def _long_line(f: io.BufferedReader, offset: int, size: int, ended: bool, continued: bool = False) -> tuple[bytes, int]:
    """A line too long for one chunk, from `offset` to its newline (looked for up to LINE_SCAN bytes on): its
    head and end, cut. A line still being written, or longer than LINE_SCAN, is cut where the reading stops
    and goes on at the next poll (`continued`: only its end is shown then)."""
    pos, stop, newline = offset, min(size, offset + LINE_SCAN), -1
    while pos < stop:
        f.seek(pos)
        block = f.read(min(1 << 20, stop - pos))
        if not block:
            break
        found = block.find(b"\n")
        if found >= 0:
            newline = pos + found
            break
        pos += len(block)
    end = newline if newline >= 0 else pos
    if newline < 0 and not ended and end - offset < TAIL_CHUNK:
        return b"", offset  # wait for more of it, as for any line being written
    f.seek(max(offset, end - LINE_KEEP))
    tail = f.read(end - max(offset, end - LINE_KEEP))
    next_offset = newline + 1 if newline >= 0 else end
    if continued:
        left = end - offset - len(tail)
        gap = f"{left:,} more bytes of the line cut above not shown] … " if left else "the line cut above goes on] "
        return f"… [{gap}".encode() + tail + b"\n", next_offset
    f.seek(offset)
    head = f.read(LINE_KEEP)
    return _cut_line(head, length=end - offset, end=tail, goes_on=newline < 0 and not (ended and end >= size)), \
        next_offset


def attach_offset(job: dict, last_lines: object, from_start: bool) -> dict:
    """Where a tail attaching to the job starts: the last N whole lines (default 20), or byte 0 with from_start
    (an explicit --from-start, or the client's own `extract tail` that launched the job and has shown nothing of
    it yet). Says what it skipped."""
    size = _size(job["log"])
    want = None if from_start else (int(last_lines) if last_lines is not None else DEFAULT_TAIL_LINES)
    if want is None or size == 0:
        return {"offset": 0, "skipped_bytes": 0, "skipped_lines": 0}
    with open(job["log"], "rb") as f:
        back = min(size, max(TAIL_CHUNK, 4096 * (want + 1)))
        f.seek(size - back)
        chunk = f.read(back)
    at_file_start = back == size
    end = chunk.rfind(b"\n") + 1  # whole lines only: a line still being written comes with the next poll
    idx = end - 1
    for _ in range(want):
        if idx < 0:
            break
        idx = chunk.rfind(b"\n", 0, idx)
    if idx >= 0:
        first = idx + 1
    elif at_file_start:
        first = 0
    else:  # fewer than N whole lines in the chunk: start at its first whole line
        first = chunk.find(b"\n") + 1
    offset = size - back + first
    skipped = _count_lines(job["log"], offset) if offset <= COUNT_LINES_MAX else None
    return {"offset": offset, "skipped_bytes": offset, "skipped_lines": skipped}


def _count_lines(path: str, upto: int) -> int:
    count = 0
    with open(path, "rb") as f:
        while upto > 0:
            block = f.read(min(upto, 1 << 20))
            if not block:
                break
            count += block.count(b"\n")
            upto -= len(block)
    return count


def job_logs(req: dict) -> dict:
    job_dir, job = load_job(req["state_dir"], req.get("job_id"))
    n = int(req.get("lines", 50))
    try:
        with open(job["log"], "rb") as f:
            start = max(0, _size(job["log"]) - 1024 * 1024)
            f.seek(max(0, start - 1))
            data = f.read()
    except OSError:
        data, start = b"", 0
    first = b""
    if start > 0:  # data[0] is the byte before the window: is its first line whole?
        piece, newline, rest = data[1:].partition(b"\n")
        if data[:1] == b"\n":
            data = data[1:]
        else:  # the window starts inside a (long) line: its end, marked as such
            first = "… [this line starts earlier in the log] … ".encode() + piece[-LINE_KEEP:] + newline
            data = rest
    text = (first + b"".join(_cut_line(line) for line in data.splitlines(keepends=True))).decode("utf-8", "replace")
    lines = text.splitlines()[-n:]
    return {"ok": True, "job_id": job["id"], "lines": lines, "log": job["log"], **job_state(job_dir, job)}


def _keeper_alive(job_dir: str, job: dict) -> bool:
    """The job's keeper still runs: its recorded pid with the start time recorded at launch (for a job recorded
    without one: a command line that names the job dir), under the login uid. While it lives, the process group
    it leads (the job's pgid) is the job's: a pgid is not given to another process while its group exists."""
    pid = job.get("keeper_pid")
    if not pid or uids(pid) != (os.getuid(), os.getuid()):
        return False
    if job.get("keeper_started") is not None:
        fields = stat_fields(pid)
        return fields is not None and fields[0] not in ("Z", "X") and start_ticks(pid) == job["keeper_started"]
    return _process_alive(pid, job_dir)


def _group(job_dir: str, job: dict) -> int | None:
    """The job's process group, only while its keeper lives (after that, its number may be anyone's)."""
    pgid = int(job["pgid"]) if job.get("pgid") else None
    return pgid if pgid and pgid == job.get("keeper_pid") and _keeper_alive(job_dir, job) else None


def _members(job_dir: str, job: dict) -> list[int]:
    """The job's live processes: every process of the login uid carrying its tag, and while its keeper lives,
    the members of its process group (a process that dropped its environment, env -i, but not its group)."""
    pgid = _group(job_dir, job)
    group = [p for p in group_members(pgid) if uids(p) == (os.getuid(), os.getuid())] if pgid else []
    return sorted(set(group) | set(tagged_pids(job_dir)))


def _has_tag(pid: int, job_dir: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return False
    return f"FLEETOPS_JOB_DIR={os.path.abspath(job_dir)}".encode() in env.split(b"\0")


def _proven(pid: int, job_dir: str, job: dict) -> bool:
    """`pid` is the job's, now: a live process of the login uid (real and effective) that carries the job's tag,
    or a member of the job's process group while its keeper lives."""
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
    """A descriptor that names this very process (Linux 5.3+, Python 3.9+): a signal sent through it reaches
    it or nothing, never a later process given the same pid. None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _signal_all(job_dir: str, job: dict, pids: list[int], sig: int) -> list[int]:
    """Signal each process proven the job's at that moment (checked after its pidfd is taken: the signal goes
    to the process that was checked, or, if it has ended since, to none). The keeper last: while it lives its
    group is provably the job's. Returns the pids signalled."""
    keeper = job.get("keeper_pid")
    sent = []
    for pid in sorted(pids, key=lambda p: p == keeper):
        fd = _pidfd(pid)
        try:
            if not _proven(pid, job_dir, job):
                continue
            if fd is not None:
                signal.pidfd_send_signal(fd, sig)
            else:  # no pidfd: the check above was made just now; a pid reused in between is the residual risk
                os.kill(pid, sig)
            sent.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
        finally:
            if fd is not None:
                os.close(fd)
    return sent


def job_stop(req: dict) -> dict:
    """Stop the job: SIGTERM to each of its processes (its tagged ones, one that left the group with setsid
    included, and its group while the keeper lives), SIGKILL after the grace; then no process of the job may be
    left. A process is signalled only when it is proven the job's at that moment (_proven): a recorded pgid or
    pid that now names someone else's process is never touched."""
    job_dir, job = load_job(req["state_dir"], req.get("job_id"))
    st = job_state(job_dir, job)
    pgid = int(job["pgid"]) if job.get("pgid") else None
    group_before = set(group_members(pgid)) if _group(job_dir, job) else set()
    if st["state"] not in ("running", "starting"):
        left = _members(job_dir, job)
        if left:  # the job ended but left processes behind (e.g. its main process was SIGKILLed)
            left = _signal_all(job_dir, job, left, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and _members(job_dir, job):
                time.sleep(0.05)
            remaining = _members(job_dir, job)
            where = "in its group" if left and set(left) <= group_before else "(tagged with it)"
            return {"ok": not remaining, "changed": bool(left), "job_id": job["id"], "pgid": pgid, **st,
                    "left": remaining,
                    "msg": f"job {job['id']} had ended ({st['state']}) but left {len(left)} processes {where}: "
                           f"killed {left}" + (f"; still there: {remaining}" if remaining else "")}
        return {"ok": True, "changed": False, "job_id": job["id"], **st,
                "msg": f"job {job['id']} is not running ({st['state']}); nothing to stop"}
    grace = float(req.get("grace_s", 10))
    first = _members(job_dir, job)
    outside = sorted(set(first) - group_before)
    _signal_all(job_dir, job, first, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _members(job_dir, job):
        time.sleep(0.1)
    escalated = bool(_members(job_dir, job))
    if escalated:
        _signal_all(job_dir, job, _members(job_dir, job), signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _members(job_dir, job):
            time.sleep(0.05)
    exit_path = os.path.join(job_dir, "exit.json")
    for _ in range(50):  # the wrapper writes exit.json when it sees the job end (unless it was killed too)
        if read_json(exit_path):
            break
        time.sleep(0.02)
    if not read_json(exit_path):
        _record_end(job_dir, {"exit_code": None, "signal": int(signal.SIGKILL), "ended": now_iso(),
                              "ended_ts": time.time(), "by": "stop"})
    left = _members(job_dir, job)
    how = "SIGTERM, then SIGKILL after the grace period" if escalated else "SIGTERM"
    also = (f"; also ended {len(outside)} processes outside its group, found by their FLEETOPS_JOB_DIR tag: "
            f"{outside}" if outside else "")
    return {"ok": not left, "changed": True, "job_id": job["id"], "pgid": pgid, "escalated": escalated, "left": left,
            "outside_group": outside, **job_state(job_dir, job), "msg": f"stopped job {job['id']} with {how}"
            + (f"; processes of the job still alive: {left}" if left else "; no process of its group is left")
            + also}


# ---------------------------------------------------------------- the keeper and the wrapper
def _record_end(job_dir: str, result: dict) -> None:
    """Write exit.json into the space reserved at launch (overwritten in place, then renamed: no new block is
    needed, so a full disk cannot lose the record); without a reserve, an ordinary atomic write."""
    data = (json.dumps(result) + "\n").encode()
    reserve = os.path.join(job_dir, RESERVE)
    final = os.path.join(job_dir, "exit.json")
    if len(data) <= RESERVE_BYTES:
        try:
            fd = os.open(reserve, os.O_WRONLY | os.O_NOFOLLOW)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                os.write(fd, data.ljust(RESERVE_BYTES, b" "))  # JSON allows trailing white space
                os.fsync(fd)
            finally:
                os.close(fd)
            os.chmod(reserve, 0o600)
            os.replace(reserve, final)
            return
    atomic_write(final, data, mode=0o600, point="job.exit")


def _end_record(code: int | None, job_dir: str, **extra: object) -> dict:
    result: dict = {"exit_code": code if code is not None and code >= 0 else None,
                    "signal": -code if code is not None and code < 0 else None, "ended": now_iso(),
                    "ended_ts": time.time()}
    full = _disk_full(job_dir)
    if full:
        result["disk_full"] = full
    result.update({k: v for k, v in extra.items() if v})
    return result


def _status_code(status: int) -> int:
    """A waitpid status as Popen's returncode: the exit code, or minus the signal."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def wrap_main(job_dir: str) -> int:
    """The keeper: session leader and child subreaper. It reserves space for exit.json, forks the wrapper (the
    job's parent) and reaps whatever is re-parented to it. If the wrapper dies before recording the job's
    end, the job becomes the keeper's child and the keeper records its true exit status."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    load_failpoints()
    try:  # the job dir it was given: in the state dir the bootstrap checked, and ours alone
        trusted_stat(os.path.dirname(job_dir), want_dir=True)
        if trusted_stat(job_dir, want_dir=True) is None:
            raise NodeError(f"{job_dir} does not exist", kind="no_job")
    except NodeError as exc:
        print(f"fleetops keeper: {exc}", file=sys.stderr)
        return 2
    try:  # PR_SET_CHILD_SUBREAPER: orphans of the job come to us, not to init
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    try:
        fd = os.open(os.path.join(job_dir, RESERVE), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, b" " * RESERVE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        reason = f"cannot reserve space for exit.json in {job_dir}: {exc.strerror or exc}"
        try:
            _record_end(job_dir, _end_record(127, job_dir, wrapper_error=reason))
        except OSError:
            pass
        return 127
    wrapper = os.fork()
    if wrapper == 0:
        code = 1
        try:
            code = _wrapper(job_dir)
        finally:
            os._exit(code)
    job_pid: int | None = None
    exit_path = os.path.join(job_dir, "exit.json")
    wrapper_status: int | None = None
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == wrapper:
            wrapper_status = status
            if os.path.exists(exit_path):
                return 0  # the wrapper recorded the end; the job's leftovers (if any) go to init
            continue
        if job_pid is None:
            try:
                job_pid = (read_json(os.path.join(job_dir, "job.json")) or {}).get("pid")
            except NodeError:
                job_pid = None
        if pid == job_pid and not os.path.exists(exit_path):
            # The wrapper died first: the job was re-parented to us and its status is ours to record.
            how = (f"signal {os.WTERMSIG(wrapper_status)}" if wrapper_status is not None and
                   os.WIFSIGNALED(wrapper_status) else "an unknown cause" if wrapper_status is None else
                   f"exit {os.WEXITSTATUS(wrapper_status)}")
            _record_end(job_dir, _end_record(_status_code(status), job_dir, by="keeper",
                                             wrapper_killed=f"its wrapper (pid {wrapper}) died first ({how}); the "
                                             f"exit status was collected by its keeper (pid {os.getpid()})"))
            return 0
    if not os.path.exists(exit_path):
        _record_end(job_dir, _end_record(None, job_dir, wrapper_error=f"its wrapper (pid {wrapper}) died before the "
                                         "job's end could be collected; exit status unknown"))
    return 0


def _wrapper(job_dir: str) -> int:
    job_path = os.path.join(job_dir, "job.json")
    job = read_json(job_path) or {}
    secret_path = os.path.join(job_dir, SECRET_ENV)
    secret: dict = {}
    if job.get("secret_env_keys"):
        try:
            secret = read_json(secret_path) or {}
        except NodeError:
            secret = {}
    env = {**os.environ, **job.get("env", {}), **secret, "FLEETOPS_JOB_ID": job.get("id", ""),
           "FLEETOPS_JOB_DIR": os.path.abspath(job_dir), "PYTHONUNBUFFERED": "1"}
    try:  # held open for the job's life; never through a symlink (its mode is the job's umask's)
        log = os.fdopen(os.open(os.path.join(job_dir, LOG), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                                | os.O_CLOEXEC, 0o666), "ab", buffering=0)
    except OSError as exc:
        _record_end(job_dir, _end_record(127, job_dir, wrapper_error=f"cannot open the job's log: {exc}"))
        return 127
    with log:
        try:
            if secret.keys() != set(job.get("secret_env_keys") or ()):
                raise OSError(f"the secret environment values ({SECRET_ENV}) are missing")
            # An extract runs the agent's own code: through the bootstrap, with the bytes this process was
            # verified against (job.json shows the command; it is never run from there).
            argv = relaunch("extract", os.path.join(job_dir, "request.json")) if job.get("kind") == "extract" \
                else job["argv"]
            failpoint("job.wrapper.start")  # a test swaps what the job would run from here
            child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     env=env, cwd=job.get("cwd") or job_dir,
                                     preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL)
                                                         for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)])
        except OSError as exc:
            _drop_secrets(job_dir)
            reason = f"fleetops: cannot start {job.get('argv')}: {exc}"
            try:
                log.write((reason + "\n").encode())
            except OSError as write_exc:
                reason += f" (and the log could not be written: {write_exc.strerror or write_exc})"
            _record_end(job_dir, _end_record(127, job_dir, wrapper_error=reason))
            return 127
        _drop_secrets(job_dir)  # the job's process has them now: nothing secret stays on the node's disk
        del secret, env
        keeper = os.getppid()
        job.update(pid=child.pid, pgid=os.getpgid(0), wrapper_pid=os.getpid(), keeper_pid=keeper,
                   keeper_started=start_ticks(keeper), pid_started=start_ticks(child.pid))
        try:
            write_json_atomic(job_path, job)
        except OSError as exc:  # e.g. ENOSPC: without its pid on record the job cannot be followed; end it
            child.kill()
            child.wait()
            _record_end(job_dir, _end_record(127, job_dir, wrapper_error=f"cannot record the job's pid in "
                                             f"{job_path}: {exc.strerror or exc}; the job was stopped"))
            return 127
        code = child.wait()
    _record_end(job_dir, _end_record(code, job_dir))
    return 0

