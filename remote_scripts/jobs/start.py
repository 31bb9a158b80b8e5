"""Launching a job (stdlib only): under jobs/launch.lock the running check and the launch are one
step per node; the job's record is written, then its keeper started in a new session, and the launch
waits until the job's process is on record (or its keeper refused)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ..core.atomicio import atomic_write, write_json_atomic
from ..core.bootstrap import EXIT_REFUSED
from ..core.drainmark import refuse_if_drained
from ..core.failpoints import failpoint
from ..core.launch import relaunch
from ..core.launch import shown as shown_argv
from ..core.nodeio import NodeError, now_iso
from ..core.registry import node_op
from ..core.statetrust import read_json
from .keeper import end_record, record_end
from .launchlock import LaunchLock
from .liveness import job_state, running_job
from .procscan import tag_index
from .records import (
    LOG,
    SECRET_ENV,
    all_jobs,
    drop_secrets,
    expand,
    jobs_dir,
    new_job_dir,
    public,
    set_current,
)


def _leftovers(state_dir: str) -> tuple[str, list[int]] | None:
    """An ended job whose processes still live (tagged): a new job beside them would share the
    GPUs."""
    index = tag_index()
    for job in all_jobs(state_dir):
        job_dir = os.path.join(jobs_dir(state_dir), job["id"])
        if index.get(job_dir) and os.path.exists(os.path.join(job_dir, "exit.json")):
            return job["id"], sorted(index[job_dir])
    return None


@node_op("job_start", writes=True)
def job_start(req: dict) -> dict:
    with LaunchLock(req["state_dir"]):
        return _job_start(req)


def _job_start(req: dict) -> dict:
    state_dir = os.path.abspath(req["state_dir"])
    spec = req["job"]
    refuse_if_drained(state_dir, f"launching job {spec['name']!r}")
    _refuse_if_busy(state_dir)
    # inside the launch lock: a test widens the window between check and launch here
    failpoint("job.launch")
    job_id, job_dir = new_job_dir(jobs_dir(state_dir), spec["name"])
    spec = expand(spec, {"state_dir": state_dir, "job_dir": job_dir, "python": sys.executable})
    # before anything is written: refused here if not bootstrapped
    keeper_argv = relaunch("wrap", job_dir)
    argv = _command(spec, state_dir, job_dir, keeper_argv)
    job = _job_record(req, spec, job_id, job_dir, argv)
    write_json_atomic(os.path.join(job_dir, "job.json"), job)
    set_current(jobs_dir(state_dir), job_id)
    failpoint("job.keeper.launch")  # a test swaps what the keeper would run from here
    job = _await_start(job_id, job_dir, job, keeper_argv)
    return {"ok": True, "job": public(job), **job_state(job_dir, job)}


def _refuse_if_busy(state_dir: str) -> None:
    """One job at a time: refused while another runs, or an ended one left processes behind."""
    running = running_job(state_dir)
    if running:
        raise NodeError(
            f"job {running['id']} is still running on this node (pid {running.get('pid')}, since "
            f"{running.get('started')}); stop it or wait for it",
            kind="job_running",
            job=running,
        )
    left = _leftovers(state_dir)
    if left:
        raise NodeError(
            f"job {left[0]} has ended but its processes {left[1]} still run; stop them first "
            f"(fab stop --job-id {left[0]})",
            kind="job_running",
        )


def _command(spec: dict, state_dir: str, job_dir: str, keeper_argv: list[str]) -> list[str]:
    """The job's command line as recorded; an extract job's request is written beside it."""
    if spec["kind"] != "extract":
        return list(spec["argv"])
    request = {**spec["extract"], "state_dir": state_dir}
    write_json_atomic(os.path.join(job_dir, "request.json"), request)
    # What the wrapper starts (shown; it builds the real command itself: relaunch, verified
    # bytes only)
    return shown_argv([*keeper_argv[:-2], "extract", os.path.join(job_dir, "request.json")])


def _secret_env(spec: dict, job_dir: str) -> dict[str, str]:
    """The job's secret variables, written to their own file (mode 0600), never to job.json: those
    the client names (secret_env), and any it masked in shown_env."""
    env = spec.get("env", {})
    shown = spec.get("shown_env", env)
    named = set(spec.get("secret_env") or ())
    secret = {k: v for k, v in env.items() if k in named or shown.get(k) != v}
    if secret:
        atomic_write(
            os.path.join(job_dir, SECRET_ENV),
            (json.dumps(secret) + "\n").encode(),
            mode=0o600,
            point="job.secret_env",
        )
    return secret


def _job_record(req: dict, spec: dict, job_id: str, job_dir: str, argv: list[str]) -> dict:
    """job.json as the launch writes it: the processes' pids are the keeper's to fill in."""
    env = dict(spec.get("env", {}))
    secret = _secret_env(spec, job_dir)
    job = {
        "id": job_id,
        "name": spec["name"],
        "kind": spec["kind"],
        "argv": argv,
        "env": {k: v for k, v in env.items() if k not in secret},
        "secret_env_keys": sorted(secret),
        "shown_env": dict(spec.get("shown_env", env)),
        "cwd": spec.get("cwd") or job_dir,
        "log": os.path.join(job_dir, LOG),
        "started": now_iso(),
        "started_ts": time.time(),
        "operator": req.get("operator"),
        "prefix": sys.prefix,
        "pid": None,
        "pgid": None,
        "wrapper_pid": None,
        "keeper_pid": None,
        "playbook": spec.get("playbook"),
    }
    if spec["kind"] == "extract":  # what `jobs`, `fetch` and a later extract read of the run it is
        job.update(
            output=os.path.abspath(str(spec["extract"].get("output") or job_dir)),
            again=bool(spec["extract"].get("again")),
        )
    return job


def _await_start(job_id: str, job_dir: str, job: dict, keeper_argv: list[str]) -> dict:
    """Start the keeper and wait (10 s at most) until the job's process is on record, or its exit
    is; the job's record as it stands then. Raises when the keeper ends without starting it."""
    # The keeper's stdout is ours until it has started the job: a refusal of its bootstrap (exit 3)
    # is read there. Nothing else of the keeper or the job writes to it (the job writes to its log).
    keeper = subprocess.Popen(
        keeper_argv,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=job_dir,
        close_fds=True,
    )
    assert keeper.stdout is not None  # started with stdout=PIPE
    exit_path = os.path.join(job_dir, "exit.json")
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            job = read_json(os.path.join(job_dir, "job.json")) or job
            if job.get("pid") or read_json(exit_path):
                return job
            if keeper.poll() is not None and not read_json(exit_path):
                # gone without a record of the job (its own refusal, or a crash): it started nothing
                drop_secrets(job_dir)
                raise _refused_keeper(job_id, job_dir, keeper)
            time.sleep(0.02)
    finally:
        keeper.stdout.close()
    drop_secrets(job_dir)
    raise NodeError(f"job {job_id} did not start within 10 s (see {job_dir})", kind="start_failed")


def _refused_keeper(job_id: str, job_dir: str, keeper: subprocess.Popen) -> NodeError:
    """The keeper's bootstrap refused to run (the interpreter, the state dir or the agent's bytes
    changed since this agent started): its one-line answer, as the job's start failure."""
    assert keeper.stdout is not None  # started with stdout=PIPE
    try:
        answer = json.loads(keeper.stdout.read(65536) or b"{}")
    except ValueError:
        answer = {}
    if not isinstance(answer, dict):
        answer = {}
    why = answer.get("error") or f"it exited {keeper.returncode} without saying why"
    record_end(
        job_dir,
        end_record(
            keeper.returncode, job_dir, wrapper_error=f"the job's keeper did not start it: {why}"
        ),
    )
    kind = answer.get("error_kind") if keeper.returncode == EXIT_REFUSED else None
    return NodeError(
        f"job {job_id} was not started: its keeper refused to run: {why}",
        kind=str(kind or "start_failed"),
    )
