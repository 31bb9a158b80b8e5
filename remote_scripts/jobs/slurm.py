"""Jobs through Slurm, run on the cluster's login node (stdlib only): submit with `sbatch` (a job
array when the job is split into shards), read `squeue`/`sacct` (explicit formats, the job's name
last; never `scontrol -o`, whose free-text fields can carry any key: fleetops/plans/slurm.py), the
job's output files, and `scancel`.

A Slurm id is fleetops' job only while squeue's user, name and submit time are the ones job.json
recorded at submission (`_ours`): a controller that forgot its jobs, or ids wrapping at MaxJobId,
hands the same id to another job, maybe another user's. Such an id is never cancelled, never counted
as "still in the queue"; the cancel itself goes out as `scancel --user=<login> --name=<name> <id>`,
so Slurm refuses it for any other job.

Every command is a fixed argv list; values from the playbook or inventory travel as single argv
words (`--partition=gpu`) or in the environment, never through a shell. The batch script is fixed
text (slurmstep.batch_script: the verifying bootstrap, no user data in it), written to the job's
directory; its arguments (agent path, job directory) are argv words after the script name. The node
returns the commands' raw output; the client parses it (fleetops/plans/slurm.py).

Layout: <state_dir>/slurm/<id>/{job.json, request-<task>.json, batch.py, task-<task>.log,
exit-<task>.json}; slurm/current.json names the latest job. The job's environment (secrets included)
goes to sbatch's own environment (Slurm exports it to the job, as `sbatch` always does); fleetops
writes no secret to disk. Slurm itself keeps that environment on the controller while the job
exists: StateSaveLocation/hash.N/job.ID/ environment (mode 0600, owned by SlurmUser).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

from ..core.atomicio import atomic_write, ensure_dir, write_json_atomic
from ..core.drainmark import refuse_if_drained
from ..core.nodeio import NodeError, now_iso
from ..core.registry import node_op
from ..core.statetrust import open_state_file, read_json
from .outputlock import describe, held
from .outputs import completion
from .records import (
    expand,
    file_size,
    find_slurm_record,
    new_job_dir,
    newest_ids,
    public,
    set_current,
)
from .shards import write_rows
from .slurmquery import (
    COMMAND_TIMEOUT_S,
    active,
    controller_down,
    login,
    ours,
    ping,
    query,
    run,
    scheduler_env,
    submit_time,
)
from .slurmstep import batch_script
from .tail import Masker, attach_offset, last_match

TAIL_CHUNK = 256 * 1024


def slurm_dir(state_dir: str) -> str:
    return os.path.join(os.path.abspath(state_dir), "slurm")


def _load(state_dir: str, job_id: str | None) -> tuple[str, dict]:
    """The job asked for, else the latest (records.find_slurm_record); a corrupt record is moved
    aside and reported."""
    job_id, job_dir, job = find_slurm_record(
        state_dir,
        job_id,
        "no Slurm job has been submitted from this login node by fleetops",
        kept=" (the Slurm job itself is not touched: squeue/scancel by its id)",
    )
    if job is None:
        known = newest_ids(slurm_dir(state_dir))
        raise NodeError(
            f"no Slurm job {job_id!r} here; fleetops' jobs on this login node: "
            f"{', '.join(known[:10]) or 'none'}",
            kind="no_job",
            known=known,
        )
    return job_dir, job


def _shard_requests(extract: dict, shards: int, state_dir: str) -> list[dict]:
    """Shard i of N: the contiguous rows [i*n//N, (i+1)*n//N) of the dataset (blank lines skipped,
    as the extraction does), written once to <output>/shards/ (stable, so a resubmission resumes
    each shard); each shard writes its own output folder."""
    with open(extract["dataset"], "rb") as f:
        lines = [ln for ln in f.read().decode("utf-8").splitlines() if ln.strip()]
    out = []
    shard_dir = os.path.join(extract["output"], "shards")
    ensure_dir(shard_dir)
    for i in range(shards):
        start, end = i * len(lines) // shards, (i + 1) * len(lines) // shards
        path = os.path.join(shard_dir, f"dataset-{i}-of-{shards}.jsonl")
        write_rows(path, lines[start:end], "slurm.shard")
        out.append(
            {
                **extract,
                "dataset": path,
                "output": os.path.join(shard_dir, f"output-{i}-of-{shards}"),
                "state_dir": state_dir,
                "shard": {
                    "index": i,
                    "of": shards,
                    "start": start,
                    "end": end,
                    "dataset": extract["dataset"],
                },
            }
        )
    return out


def submit(req: dict) -> dict:
    """Under this login node's submit lock: refuse while fleetops' latest job here is still in the
    queue (two `extract` at once submit one job) or while the controller cannot be reached (then
    nobody can tell), else sbatch the new one."""
    state_dir = os.path.abspath(req["state_dir"])
    ensure_dir(slurm_dir(state_dir))
    fd = open_state_file(os.path.join(slurm_dir(state_dir), "submit.lock"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        refuse_if_drained(state_dir, "submitting a job")
        env = scheduler_env(req)
        answer = ping(env)
        if controller_down(answer):
            raise NodeError(
                "Slurm's controller cannot be reached from this login node (scontrol ping: "
                f"{(answer['stdout'] + answer['stderr']).strip()[:300]}); nothing submitted",
                kind="slurm_controller",
                ping=answer,
            )
        try:
            _, current = _load(state_dir, None)
        except NodeError:
            current = None
        if current and current.get("slurm_job_id"):
            listed = query(current, env, full=False)
            if active(current, listed):
                raise NodeError(
                    f"job {current['id']} (Slurm job "
                    f"{current['slurm_job_id']}) is still in the Slurm "
                    "queue; stop it (fab stop) or wait for it",
                    kind="job_running",
                    job={k: current.get(k) for k in ("id", "slurm_job_id", "started")},
                    squeue=listed["squeue"]["stdout"][-2000:],
                )
        return _submit(req, state_dir)
    finally:
        os.close(fd)


def _requests(spec: dict, shards: int, state_dir: str) -> list[dict]:
    if spec["kind"] != "extract":
        return []
    base = {**spec["extract"], "state_dir": state_dir}
    return _shard_requests(base, shards, state_dir) if shards > 1 else [base]


def _finished(spec: dict, shards: int, state_dir: str) -> tuple[list[dict] | None, str | None]:
    """(each task's finished output when every one already holds all its samples
    (outputs.completion), else None; the shards folder when this call made it). A finished job is
    not submitted: it would load the model only to write nothing. An output under {job_dir} is new
    for every job; `again` redoes every sample."""
    pre = expand(spec, {"state_dir": state_dir, "python": sys.executable})
    extract = pre.get("extract") or {}
    output = str(extract.get("output") or "")
    if pre["kind"] != "extract" or not output or "{job_dir}" in output:
        return None, None
    shard_dir = os.path.join(output, "shards")
    made = shard_dir if shards > 1 and not os.path.isdir(shard_dir) else None
    if extract.get("again"):
        return None, made
    done = [completion(r) for r in _requests(pre, shards, state_dir)]
    return ([d for d in done if d] if all(done) else None), made


def _dataset_unread(spec: dict, state_dir: str) -> dict | None:
    """Why the extract job's dataset cannot be read here (the login node shares it with the compute
    nodes)."""
    pre = expand(spec, {"state_dir": state_dir, "python": sys.executable})
    path = str((pre.get("extract") or {}).get("dataset") or "")
    if pre["kind"] != "extract" or not path or "{job_dir}" in path:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return {"path": path, "error": exc.strerror or str(exc)}
    os.close(fd)
    return None


def _output_busy(spec: dict, shards: int, state_dir: str) -> dict | None:
    """The first of the job's outputs another run writes now (outputlock.py), on any host sharing
    it."""
    pre = expand(spec, {"state_dir": state_dir, "python": sys.executable})
    output = str((pre.get("extract") or {}).get("output") or "")
    if pre["kind"] != "extract" or not output or "{job_dir}" in output:
        return None
    for request in _requests(pre, shards, state_dir):
        holder = held(str(request.get("output") or ""))
        if holder:
            return holder
    return None


def _submit(req: dict, state_dir: str) -> dict:
    spec = req["job"]
    opts = req.get("slurm") or {}
    shards = _shard_count(spec, opts)
    done, made_shard_dir = _finished(spec, shards, state_dir)
    if done is not None:
        return {"ok": True, "complete": done, "shards": shards, "job": None}
    _refuse_unready(spec, shards, state_dir)
    job_id, job_dir = new_job_dir(slurm_dir(state_dir), spec["name"])
    spec = expand(spec, {"state_dir": state_dir, "job_dir": job_dir, "python": sys.executable})
    for i, request in enumerate(_requests(spec, shards, state_dir)):
        write_json_atomic(os.path.join(job_dir, f"request-{i}.json"), request)
    script = os.path.join(job_dir, "batch.py")
    text, script_args = batch_script(job_dir)
    atomic_write(script, text, mode=0o700, point="slurm.script")
    argv = [*_sbatch_argv(spec["name"], job_dir, shards, opts), script, *script_args]
    job = _job_record(req, spec, job_id, job_dir, shards, argv)
    write_json_atomic(os.path.join(job_dir, "job.json"), job)
    env = {**{k: str(v) for k, v in (spec.get("env") or {}).items()}, **scheduler_env(req)}
    result = run(argv, env, timeout=COMMAND_TIMEOUT_S)
    match = re.match(r"\s*([0-9]+)(?:;\S+)?\s*$", result["stdout"])
    if result["rc"] != 0 or not match:
        return _refused_by_sbatch(job, job_dir, made_shard_dir, result)
    job["slurm_job_id"] = match.group(1)
    job["slurm_submit"] = submit_time(job, scheduler_env(req))
    write_json_atomic(os.path.join(job_dir, "job.json"), job)
    set_current(slurm_dir(state_dir), job_id)
    return {"ok": True, "job": job, "sbatch": result}


def _shard_count(spec: dict, opts: dict) -> int:
    """The number of array tasks asked for: 1 to 1000, more than one only for an extract job."""
    shards = int(opts.get("shards") or 1)
    if shards < 1 or shards > 1000:
        raise NodeError(f"shards must be 1 to 1000, got {shards}", kind="bad_request")
    if shards > 1 and spec["kind"] != "extract":
        raise NodeError("only an extract job can be split into shards", kind="bad_request")
    return shards


def _refuse_unready(spec: dict, shards: int, state_dir: str) -> None:
    """Nothing is submitted that would fail on the allocated node at once: a dataset this login
    node cannot read, an output another run writes now."""
    unread = _dataset_unread(spec, state_dir)
    if unread:
        raise NodeError(
            f"its dataset {unread['path']} cannot be read "
            f"on this login node: {unread['error']}; nothing "
            "submitted: put it there (or point the playbook's dataset: at it), then extract again",
            kind="no_dataset",
            dataset=unread,
        )
    busy = _output_busy(spec, shards, state_dir)
    if busy:
        raise NodeError(
            f"its output is in use: {describe(busy)}; "
            "nothing submitted: extract again once that run "
            "has ended",
            kind="output_busy",
            holder=busy,
        )


# The playbook's slurm: options passed on to sbatch as they are, and the flag each one becomes.
_SBATCH_FLAGS = (
    ("partition", "--partition"),
    ("account", "--account"),
    ("time_limit", "--time"),
    ("gres", "--gres"),
)


def _sbatch_argv(name: str, job_dir: str, shards: int, opts: dict) -> list[str]:
    """sbatch's command line up to the batch script: one log per array task."""
    log = "task-%a.log" if shards > 1 else "task-0.log"
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={name}",
        f"--chdir={job_dir}",
        f"--output={os.path.join(job_dir, log)}",
    ]
    argv += [f"{flag}={opts[key]}" for key, flag in _SBATCH_FLAGS if opts.get(key)]
    if shards > 1:
        argv.append(f"--array=0-{shards - 1}")
    return argv


def _job_record(
    req: dict, spec: dict, job_id: str, job_dir: str, shards: int, argv: list[str]
) -> dict:
    """job.json as written before sbatch runs: Slurm's id and submit time come once it accepts."""
    return {
        "id": job_id,
        "name": spec["name"],
        "kind": spec["kind"],
        "scheduler": "slurm",
        "argv": spec.get("argv"),
        "cwd": spec.get("cwd") or job_dir,
        "shards": shards,
        "sbatch_argv": argv,
        "shown_env": spec.get("shown_env", {}),
        "logs": [os.path.join(job_dir, f"task-{i}.log") for i in range(shards)],
        "started": now_iso(),
        "started_ts": time.time(),
        "operator": req.get("operator"),
        "slurm_job_id": None,
        "slurm_user": login(),
        "slurm_submit": None,
        "playbook": spec.get("playbook"),
    }


def _refused_by_sbatch(job: dict, job_dir: str, made_shard_dir: str | None, result: dict) -> dict:
    """sbatch refused the job: nothing of a job Slurm never accepted stays behind (no record to
    list, no batch script)."""
    shutil.rmtree(job_dir, ignore_errors=True)
    if made_shard_dir:
        shutil.rmtree(made_shard_dir, ignore_errors=True)
    job["submit_failed"] = {k: result[k] for k in ("rc", "stderr")}
    said = (result["stderr"] or result["stdout"]).strip()[-600:]
    return {
        "ok": False,
        "error_kind": "sbatch",
        "job": public(job),
        "sbatch": result,
        "removed": job_dir,
        "error": f"sbatch refused the job (exit {result['rc']}): {said}; nothing was left behind "
        f"({job_dir} removed)",
    }


def _exits(job_dir: str, shards: int) -> dict[str, dict]:
    out = {}
    for i in range(shards):
        ended = read_json(os.path.join(job_dir, f"exit-{i}.json"), on_corrupt="quarantine")
        if ended:
            out[str(i)] = ended
    return out


def status(req: dict) -> dict:
    job_dir, job = _load(req["state_dir"], req.get("job_id"))
    shards = int(job.get("shards") or 1)
    return {
        "ok": True,
        "job": public(job),
        "query": query(job, scheduler_env(req)),
        "exits": _exits(job_dir, shards),
        "log_bytes": [file_size(p) for p in job["logs"]],
        "last_progress": [last_match(p, req.get("progress_pattern")) for p in job["logs"]],
        "now_ts": time.time(),
    }


def tail(req: dict) -> dict:
    """From each task's log, the bytes after its offset (whole lines only while the job can still
    write), waiting up to wait_s for something new; with the scheduler's view of the job in the same
    answer. Attaching (no offsets yet): each task starts at its last N whole lines (last_lines,
    default 20) or at byte 0 with from_start, the same rule as an SSH job's tail
    (tail.attach_offset); `skipped` says per task what was left out."""
    job_dir, job = _load(req["state_dir"], req.get("job_id"))
    shards = int(job.get("shards") or 1)
    skipped: list[dict] = []
    if req.get("offsets") is None:
        skipped = [
            attach_offset({"log": path}, req.get("last_lines"), bool(req.get("from_start")))
            for path in job["logs"][:shards]
        ]
        offsets = [s["offset"] for s in skipped]
    else:
        offsets = [int(x) for x in req["offsets"]][:shards]
    offsets += [0] * (shards - len(offsets))
    env = scheduler_env(req)
    mask = Masker(req.get("mask"))  # whole lines only: no secret is cut before it is masked
    deadline = time.monotonic() + float(req.get("wait_s", 2))
    while True:
        exits = _exits(job_dir, shards)
        data = []
        for i, path in enumerate(job["logs"]):
            size = file_size(path)
            chunk = b""
            if size > offsets[i]:
                with open(path, "rb") as f:
                    f.seek(offsets[i])
                    chunk = f.read(min(size - offsets[i], TAIL_CHUNK))
                if str(i) not in exits or len(chunk) < size - offsets[i]:
                    chunk = chunk[: chunk.rfind(b"\n") + 1]
            data.append(chunk)
        if any(data) or time.monotonic() >= deadline:
            return {
                "ok": True,
                "job": public(job),
                "offsets": offsets,
                "skipped": skipped,
                "data": [mask(d).decode("utf-8", "replace") for d in data],
                "next_offsets": [o + len(d) for o, d in zip(offsets, data)],
                "exits": exits,
                "query": query(job, env),
                "now_ts": time.time(),
            }
        time.sleep(0.2)


def logs(req: dict) -> dict:
    job_dir, job = _load(req["state_dir"], req.get("job_id"))
    n = int(req.get("lines", 50))
    mask = Masker(req.get("mask"))
    out: list[list[str]] = []
    for path in job["logs"]:
        try:
            with open(path, "rb") as f:
                start = max(0, file_size(path) - 1024 * 1024)
                f.seek(start)
                data = f.read()
        except OSError:
            out.append([])
            continue
        # the window starts inside a line: left out whole, so no secret in it is shown in part
        if start > 0:
            data = data.partition(b"\n")[2]
        out.append(mask(data).decode("utf-8", "replace").splitlines()[-n:])
    return {
        "ok": True,
        "job": public(job),
        "lines": out,
        "exits": _exits(job_dir, int(job.get("shards") or 1)),
        "query": query(job, scheduler_env(req)),
    }


def cancel(req: dict) -> dict:
    """`scancel --user=<login> --name=<name> ID` (every task of an array) when squeue lists
    fleetops' own job still in the queue, then wait up to grace_s until squeue lists it in a final
    state (the cancel confirmed by the job's own state; job.json records that fleetops cancelled
    it). An id that now names another job (it was reused) is never cancelled: the answer says whose
    it is. A controller that cannot be reached: nothing is cancelled and the answer says so
    (`controller`)."""
    job_dir, job = _load(req["state_dir"], req.get("job_id"))
    env = scheduler_env(req)
    sid = job.get("slurm_job_id")
    shards = int(job.get("shards") or 1)
    if not sid:
        return {
            "ok": True,
            "changed": False,
            "job": public(job),
            "query": {},
            "exits": {},
            "msg": f"job {job['id']} was never accepted by sbatch; nothing to cancel",
        }
    before = query(job, env, full=False)
    if "controller" in before:
        return {
            "ok": True,
            "changed": False,
            "job": public(job),
            "before": before,
            "scancel": None,
            "query": before,
            "exits": _exits(job_dir, shards),
            "now_ts": time.time(),
        }
    listed = bool(active(job, before))
    others = (
        ours(job, before["squeue"]["stdout"], (before.get("restarts") or {}).get("stdout", ""))[1]
        if before["squeue"]["rc"] == 0
        else []
    )
    result = None
    if listed:
        argv = [
            "scancel",
            f"--user={job.get('slurm_user') or login()}",
            f"--name={job['name']}",
            sid,
        ]
        # recorded before scancel: a tail polling meanwhile sees CANCELLED only with fleetops'
        # record beside it
        job["cancelled_by"] = {"operator": req.get("operator"), "at": now_iso(), "ts": time.time()}
        write_json_atomic(os.path.join(job_dir, "job.json"), job)
        result = run(argv, env)
        if result["rc"] != 0:  # nothing was cancelled: the record is taken back
            del job["cancelled_by"]
            write_json_atomic(os.path.join(job_dir, "job.json"), job)
        deadline = time.monotonic() + float(req.get("grace_s", 30)) + 30
        while result["rc"] == 0 and time.monotonic() < deadline:
            seen = query(job, env, full=False)
            if "controller" in seen or active(job, seen) is False:
                break  # confirmed, or nothing can be: the controller went away (the answer says so)
            time.sleep(0.3)
    return {
        "ok": True,
        "changed": listed,
        "job": public(job),
        "before": before,
        "scancel": result,
        "reused_by": others,
        "query": query(job, env),
        "exits": _exits(job_dir, shards),
        "now_ts": time.time(),
    }


def allocation(req: dict) -> dict:
    """Where the latest (or named) job runs: squeue's node list, for `gpu`/`diagnose` on a login
    node."""
    job_dir, job = _load(req["state_dir"], req.get("job_id"))
    return {"ok": True, "job": public(job), "query": query(job, scheduler_env(req))}


def gpu(req: dict) -> dict:
    """The GPUs of the allocation of fleetops' latest (or named) job, read on its node: the agent's
    own `gpu` op run as an extra step inside the job (`srun --jobid=ID --overlap`), so it sees what
    the job was given."""
    job_dir, job = _load(req["state_dir"], req.get("job_id"))
    env = scheduler_env(req)
    seen = query(job, env, full=False)
    listed = seen.get("squeue") or {"rc": 1, "stdout": ""}
    restarts = (seen.get("restarts") or {}).get("stdout", "")
    running = (
        [r for r in ours(job, listed["stdout"], restarts)[0] if r["state"] == "RUNNING"]
        if listed["rc"] == 0
        else []
    )
    if not running:
        return {
            "ok": True,
            "job": public(job),
            "query": seen if "controller" in seen else query(job, env),
            "inside": None,
            "why": "Slurm's controller cannot be reached, so its allocation is not known"
            if "controller" in seen
            else "no task of the job is running, so it has no allocation to look into",
        }
    own_id, node = running[0]["job_id"], running[0]["nodes"]
    from ..core.launch import relaunch, shown

    # the agent itself, through the bootstrap, on the job's node: it serves the one request on its
    # stdin
    argv = [
        "srun",
        f"--jobid={own_id}",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        *relaunch(),
    ]
    request = json.dumps(
        {"protocol": req.get("protocol"), "op": "gpu", "state_dir": req["state_dir"]}
    )
    try:
        proc = subprocess.run(
            argv,
            input=request,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            env={**os.environ, **env},
        )
        result: dict[str, Any] = {
            "argv": shown(argv),
            "rc": proc.returncode,
            "stdout": proc.stdout,
            "stderr": proc.stderr,
        }
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        result = {"argv": shown(argv), "rc": 127, "stdout": "", "stderr": f"srun: {exc}"}
    inside = None
    lines = result["stdout"].strip().splitlines()
    if result["rc"] == 0 and lines:
        try:
            inside = json.loads(lines[-1])
        except ValueError:
            inside = None
    return {
        "ok": True,
        "job": public(job),
        "query": query(job, env),
        "srun": result,
        "inside": inside,
        "node": node,
        "task_job_id": own_id,
    }


ACTIONS = {
    "gpu": gpu,
    "submit": submit,
    "status": status,
    "tail": tail,
    "logs": logs,
    "cancel": cancel,
    "allocation": allocation,
}


def node_state(node: str, drain: bool, reason: str, slurm_env: dict) -> dict:
    """This host's own node in Slurm drained (with the reason) or resumed, by `scontrol update`;
    then what Slurm says of the node (sinfo: state, reason)."""
    env = scheduler_env({"scheduler_env": slurm_env})
    argv = ["scontrol", "update", f"nodename={node}", "state=drain" if drain else "state=resume"]
    if drain:
        argv.append(f"reason={reason}")
    done = run(argv, env)
    shown = run(["sinfo", "--noheader", f"--nodes={node}", "--format=%T|%E"], env)
    state, _, why = shown["stdout"].strip().partition("|") if shown["rc"] == 0 else ("", "", "")
    return {"node": node, "command": done, "state": state, "reason": why, "sinfo": shown}


@node_op("slurm", writes=True)
def slurm(req: dict) -> dict:
    action = ACTIONS.get(str(req.get("action")))
    if action is None:
        raise NodeError(
            f"unknown slurm action {req.get('action')!r} (known: {', '.join(ACTIONS)})",
            kind="bad_request",
        )
    return action(req)


def record_view(req: dict, job_dir: str, job: dict, ask: bool = True) -> dict:
    """One of fleetops' Slurm jobs as the job store's readers (jobs, diagnose) need it: the exit
    files its tasks wrote and, while one is missing (and `ask`), squeue/sacct's lines for its id
    (the client reads them as `status` does)."""
    exits = _exits(job_dir, int(job.get("shards") or 1))
    done = len(exits) >= int(job.get("shards") or 1)
    return {"exits": exits, "query": {} if done or not ask else query(job, scheduler_env(req))}
