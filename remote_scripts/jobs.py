"""Long jobs on the node that outlive the SSH session: start (detached, own session), status, tail by byte
offset, logs, stop (the whole process group). Stdlib only.

Layout: <state_dir>/jobs/<id>/{job.json, request.json, output.log, exit.json}; jobs/current.json names the
latest job. A small wrapper process (`agent.pyz wrap <job_dir>`) is the session leader: it starts the job,
waits for it and writes exit.json however the job ends (exit code or signal). If the wrapper itself is
killed (SIGKILL to the whole group), exit.json is missing and the job reads as "lost" unless `stop` wrote it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time

from .nodeio import NodeError, atomic_write, ensure_dir, now_iso, pid_alive, read_json, write_json_atomic
from .procfs import stat_fields

LOG = "output.log"
TAIL_CHUNK = 256 * 1024
KNOWN_IDS_SHOWN = 10
# Secret env values (the playbook's secret_env, the inventory's {secret: ...}) travel to the wrapper in this
# 0600 file, never in job.json; the wrapper deletes it as soon as the job's process has them.
SECRET_ENV = "secret-env.json"


def jobs_dir(state_dir: str) -> str:
    return os.path.join(os.path.abspath(state_dir), "jobs")


def _expand(value: object, mapping: dict[str, str]) -> object:
    """Fill {state_dir}, {job_dir} and {python} in job values (plain text substitution; nothing is evaluated)."""
    if isinstance(value, str):
        for key, sub in mapping.items():
            value = value.replace("{" + key + "}", sub)
        return value
    if isinstance(value, list):
        return [_expand(v, mapping) for v in value]
    if isinstance(value, dict):
        return {k: _expand(v, mapping) for k, v in value.items()}
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
    base = jobs_dir(state_dir)
    if not job_id:
        current = read_json(os.path.join(base, "current.json"))
        if not current:
            raise NodeError("no job has been started on this node", kind="no_job")
        job_id = current["id"]
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,120}", job_id):
        raise NodeError(f"bad job id {job_id!r}", kind="no_job")
    job_dir = os.path.join(base, job_id)
    job = read_json(os.path.join(job_dir, "job.json"))
    if job is None:
        known = [j["id"] for j in _all_jobs(state_dir)]
        shown = ", ".join(known[:KNOWN_IDS_SHOWN]) + (f" (and {len(known) - KNOWN_IDS_SHOWN} older)"
                                                       if len(known) > KNOWN_IDS_SHOWN else "")
        raise NodeError(f"no job {job_id!r} on this node; its jobs, newest first: {shown}" if known else
                        f"no job {job_id!r} on this node; it has no jobs", kind="no_job", known=known)
    return job_dir, job


def _all_jobs(state_dir: str) -> list[dict]:
    """Every job with a readable job.json, newest first (a corrupt one is skipped, not fatal)."""
    base = jobs_dir(state_dir)
    try:
        names = os.listdir(base)
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(base, name, "job.json")
        entry = os.path.join(base, name)
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,120}", name) or os.path.islink(entry) or not os.path.isdir(entry):
            continue
        try:
            job = read_json(path)
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


def job_state(job_dir: str, job: dict) -> dict:
    ended = read_json(os.path.join(job_dir, "exit.json"))
    now = time.time()
    if ended:
        if ended.get("signal"):
            state = "killed"
        else:
            state = "succeeded" if ended.get("exit_code") == 0 else "failed"
        runtime = ended.get("ended_ts", now) - job.get("started_ts", now)
    elif _process_alive(job.get("wrapper_pid"), job_dir):
        state, runtime = "running", now - job.get("started_ts", now)
    elif job.get("wrapper_pid") is None and now - job.get("started_ts", now) < 10:
        state, runtime = "starting", now - job.get("started_ts", now)
    else:
        state, runtime = "lost", None
    if state not in ("running", "starting"):
        _drop_secrets(job_dir)
    return {"state": state, "exit": ended, "runtime_s": round(runtime, 1) if runtime is not None else None}


def _running_job(state_dir: str) -> dict | None:
    try:
        job_dir, job = load_job(state_dir, None)
    except NodeError:
        return None
    st = job_state(job_dir, job)
    return {**job, **st} if st["state"] in ("running", "starting") else None


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
def job_start(req: dict) -> dict:
    state_dir = os.path.abspath(req["state_dir"])
    spec = req["job"]
    running = _running_job(state_dir)
    if running:
        raise NodeError(f"job {running['id']} is still running on this node (pid {running.get('pid')}, since "
                        f"{running.get('started')}); stop it or wait for it", kind="job_running", job=running)
    job_id = f"{spec['name']}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"
    job_dir = os.path.join(jobs_dir(state_dir), job_id)
    ensure_dir(job_dir)
    spec = _expand(spec, {"state_dir": state_dir, "job_dir": job_dir, "python": sys.executable})
    agent = os.path.abspath(sys.argv[0])
    if spec["kind"] == "extract":
        request = {**spec["extract"], "state_dir": state_dir}
        write_json_atomic(os.path.join(job_dir, "request.json"), request)
        argv = [sys.executable, agent, "extract", os.path.join(job_dir, "request.json")]
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
           "operator": req.get("operator"), "pid": None, "pgid": None, "wrapper_pid": None}
    write_json_atomic(os.path.join(job_dir, "job.json"), job)
    write_json_atomic(os.path.join(jobs_dir(state_dir), "current.json"), {"id": job_id})
    subprocess.Popen([sys.executable, agent, "wrap", job_dir], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=job_dir, close_fds=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        job = read_json(os.path.join(job_dir, "job.json")) or job
        if job.get("pid") or read_json(os.path.join(job_dir, "exit.json")):
            break
        time.sleep(0.02)
    else:
        _drop_secrets(job_dir)
        raise NodeError(f"job {job_id} did not start within 10 s (see {job_dir})", kind="start_failed")
    public = {k: v for k, v in job.items() if k != "env"}
    return {"ok": True, "job": public, **job_state(job_dir, job)}


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
    jobs = _all_jobs(state_dir)
    for job in jobs[:limit] if limit else jobs:
        job_dir = os.path.join(jobs_dir(state_dir), job["id"])
        st = job_state(job_dir, job)
        out = output_dir(job_dir, job)
        rows.append({"id": job["id"], "name": job.get("name"), "kind": job.get("kind"), "started": job.get("started"),
                     "started_ts": job.get("started_ts"), "operator": job.get("operator"), **st,
                     "log": job.get("log"), "log_bytes": _size(job.get("log") or ""),
                     "output": out, "output_bytes": _tree_bytes(out) if out and os.path.isdir(out) else None})
    current = read_json(os.path.join(jobs_dir(state_dir), "current.json")) if rows else None
    return {"ok": True, "jobs": rows, "total": len(jobs), "latest": (current or {}).get("id"),
            "jobs_dir": jobs_dir(state_dir)}


def job_tail(req: dict) -> dict:
    """Bytes of the log from `offset`, whole lines only (until the job has ended), waiting up to wait_s
    for something new: one exec per poll, no line split across two answers."""
    job_dir, job = load_job(req["state_dir"], req.get("job_id"))
    offset = int(req.get("offset", 0))
    deadline = time.monotonic() + float(req.get("wait_s", 5))
    while True:
        st = job_state(job_dir, job)
        ended = st["state"] not in ("running", "starting")
        size = _size(job["log"])
        if size > offset:
            with open(job["log"], "rb") as f:
                f.seek(offset)
                data = f.read(min(size - offset, TAIL_CHUNK))
            if not ended or len(data) < size - offset:
                cut = data.rfind(b"\n") + 1
                data = data[:cut]
            if data:
                return {"ok": True, "job_id": job["id"], "data": data.decode("utf-8", "replace"),
                        "offset": offset, "next_offset": offset + len(data), **st}
        if ended and _size(job["log"]) <= offset:
            return {"ok": True, "job_id": job["id"], "data": "", "offset": offset, "next_offset": offset, **st}
        if time.monotonic() >= deadline:
            return {"ok": True, "job_id": job["id"], "data": "", "offset": offset, "next_offset": offset, **st}
        time.sleep(0.1)


def job_logs(req: dict) -> dict:
    job_dir, job = load_job(req["state_dir"], req.get("job_id"))
    n = int(req.get("lines", 50))
    try:
        with open(job["log"], "rb") as f:
            f.seek(max(0, _size(job["log"]) - 1024 * 1024))
            lines = f.read().decode("utf-8", "replace").splitlines()[-n:]
    except OSError:
        lines = []
    return {"ok": True, "job_id": job["id"], "lines": lines, "log": job["log"], **job_state(job_dir, job)}


def job_stop(req: dict) -> dict:
    job_dir, job = load_job(req["state_dir"], req.get("job_id"))
    st = job_state(job_dir, job)
    if st["state"] not in ("running", "starting"):
        left = group_members(int(job["pgid"])) if job.get("pgid") else []
        if left:  # the job ended but left children behind in its group (e.g. its main process was SIGKILLed)
            os.killpg(int(job["pgid"]), signal.SIGKILL)
            time.sleep(0.2)
            remaining = group_members(int(job["pgid"]))
            return {"ok": not remaining, "changed": True, "job_id": job["id"], "pgid": int(job["pgid"]), **st,
                    "left": remaining,
                    "msg": f"job {job['id']} had ended ({st['state']}) but left {len(left)} processes in its group: "
                           f"killed {left}" + (f"; still there: {remaining}" if remaining else "")}
        return {"ok": True, "changed": False, "job_id": job["id"], **st,
                "msg": f"job {job['id']} is not running ({st['state']}); nothing to stop"}
    pgid = int(job["pgid"])
    grace = float(req.get("grace_s", 10))
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group_members(pgid):
        time.sleep(0.1)
    escalated = bool(group_members(pgid))
    if escalated:
        os.killpg(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and group_members(pgid):
            time.sleep(0.05)
    exit_path = os.path.join(job_dir, "exit.json")
    for _ in range(50):  # the wrapper writes exit.json when it sees the job end (unless it was killed too)
        if read_json(exit_path):
            break
        time.sleep(0.02)
    if not read_json(exit_path):
        write_json_atomic(exit_path, {"exit_code": None, "signal": int(signal.SIGKILL), "ended": now_iso(),
                                      "ended_ts": time.time(), "by": "stop"})
    left = group_members(pgid)
    how = "SIGTERM, then SIGKILL after the grace period" if escalated else "SIGTERM"
    return {"ok": not left, "changed": True, "job_id": job["id"], "pgid": pgid, "escalated": escalated, "left": left,
            **job_state(job_dir, job), "msg": f"stopped job {job['id']} with {how}"
            + (f"; processes still in its group: {left}" if left else "; no process of its group is left")}


# ---------------------------------------------------------------- the wrapper (session leader)
def wrap_main(job_dir: str) -> int:
    job_path = os.path.join(job_dir, "job.json")
    job = read_json(job_path) or {}
    # The whole group gets `stop`'s SIGTERM; the wrapper stays to record how the job ended.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    secret_path = os.path.join(job_dir, SECRET_ENV)
    secret: dict = {}
    if job.get("secret_env_keys"):
        try:
            secret = read_json(secret_path) or {}
        except NodeError:
            secret = {}
    env = {**os.environ, **job.get("env", {}), **secret, "FLEETOPS_JOB_ID": job.get("id", ""),
           "PYTHONUNBUFFERED": "1"}
    with open(os.path.join(job_dir, LOG), "ab", buffering=0) as log:
        try:
            if secret.keys() != set(job.get("secret_env_keys") or ()):
                raise OSError(f"the secret environment values ({SECRET_ENV}) are missing")
            child = subprocess.Popen(job["argv"], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     env=env, cwd=job.get("cwd") or job_dir,
                                     preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL)
                                                         for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)])
        except OSError as exc:
            _drop_secrets(job_dir)
            log.write(f"fleetops: cannot start {job.get('argv')}: {exc}\n".encode())
            write_json_atomic(os.path.join(job_dir, "exit.json"), {"exit_code": 127, "signal": None,
                                                                   "ended": now_iso(), "ended_ts": time.time()})
            return 127
        _drop_secrets(job_dir)  # the job's process has them now: nothing secret stays on the node's disk
        del secret, env
        job.update(pid=child.pid, pgid=os.getpgid(0), wrapper_pid=os.getpid())
        write_json_atomic(job_path, job)
        code = child.wait()
    result = {"exit_code": code if code >= 0 else None, "signal": -code if code < 0 else None,
              "ended": now_iso(), "ended_ts": time.time()}
    atomic_write(os.path.join(job_dir, "exit.json"), (json.dumps(result) + "\n").encode(), mode=0o600,
                 point="job.exit")
    return 0


def preflight(req: dict) -> dict:
    """What `extract` checks before launching, in the same exec: the playbook's fast checks and the GPUs."""
    from . import checks, gpu

    verify = checks.verify(req) if req.get("checks") or req.get("requires") else {"ok": True, "items": []}
    running = _running_job(req["state_dir"])
    public = {k: v for k, v in running.items() if k != "env"} if running else None
    return {"ok": True, "verify": verify, "gpu": gpu.snapshot(req["state_dir"]), "running_job": public}
