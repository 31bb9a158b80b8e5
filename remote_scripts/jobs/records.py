"""The job record store (stdlib only), one for both kinds of job: a directory per job under <state_dir>/jobs
(SSH jobs) or <state_dir>/slurm (Slurm jobs), each with its job.json, and current.json naming the latest. Records
are written atomically (write_json_atomic), so a corrupt one is truly corrupt, never one being written: it is
moved aside (reported), not fatal forever."""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Callable

from ..core.nodeio import QUARANTINED, NodeError, ensure_dir, read_json, write_json_atomic
from .procscan import tagged_pids

LOG = "output.log"
KNOWN_IDS_SHOWN = 10
# Secret env values (the playbook's secret_env, the inventory's {secret: ...}) travel to the wrapper in this
# 0600 file, never in job.json; the wrapper deletes it as soon as the job's process has them.
SECRET_ENV = "secret-env.json"
JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,120}")


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




def new_job_dir(base: str, name: str) -> tuple[str, str]:
    """A new job's id (its name, the UTC time, 4 random hex digits) and its directory under `base`, created."""
    job_id = f"{name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"
    job_dir = os.path.join(base, job_id)
    ensure_dir(job_dir)
    return job_id, job_dir


def set_current(base: str, job_id: str) -> None:
    write_json_atomic(os.path.join(base, "current.json"), {"id": job_id})


def find_record(base: str, job_id: str | None, newest: Callable[[], list[str]],
                none_yet: str) -> tuple[str, str, dict | None, dict | None]:
    """The record asked for, else the one current.json names, else the newest (`newest()`: ids, newest first;
    `none_yet`: the refusal when there is none): (id, job dir, record or None, and where a corrupt record was
    just moved, else None)."""
    if not job_id:
        current = read_json(os.path.join(base, "current.json"), on_corrupt="quarantine")
        latest = (current or {}).get("id")
        if not isinstance(latest, str) or not JOB_ID.fullmatch(latest) or \
                not os.path.lexists(os.path.join(base, latest, "job.json")):
            # no pointer (or a corrupt one, moved aside), or its job's record is gone: the newest readable job
            known = newest()
            if not known:
                raise NodeError(none_yet, kind="no_job")
            latest = known[0]
        job_id = latest
    if not JOB_ID.fullmatch(job_id):
        raise NodeError(f"bad job id {job_id!r}", kind="no_job")
    job_dir = os.path.join(base, job_id)
    before = len(QUARANTINED)
    job = read_json(os.path.join(job_dir, "job.json"), on_corrupt="quarantine")
    moved = QUARANTINED[-1] if job is None and len(QUARANTINED) > before else None
    return job_id, job_dir, job, moved


def load_job(state_dir: str, job_id: str | None) -> tuple[str, dict]:
    """The job asked for, else the latest one (find_record); a corrupt record is reported with what is left."""
    job_id, job_dir, job, moved = find_record(jobs_dir(state_dir), job_id,
                                              lambda: [j["id"] for j in all_jobs(state_dir)],
                                              "no job has been started on this node")
    if moved is not None:
        raise _quarantined_job(job_id, job_dir, moved)
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
    kept = f"its log {log} ({file_size(log)} bytes)" if os.path.exists(log) else f"no log ({log} is missing)"
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


def drop_secrets(job_dir: str) -> bool:
    """Remove the job's secret env file (the wrapper does it once the job's process has the values; this is
    the fallback for a wrapper that died first). True if one was there."""
    try:
        os.unlink(os.path.join(job_dir, SECRET_ENV))
        return True
    except FileNotFoundError:
        return False




def newest_ids(base: str) -> list[str]:
    """The job ids under `base` with a job.json, newest first by the record's time (ids start with the job's
    name, so they do not sort by time across names), without reading the records."""
    found = []
    try:
        names = os.listdir(base)
    except OSError:
        return []
    for name in names:
        if JOB_ID.fullmatch(name) and name != "current.json":
            try:
                found.append((os.lstat(os.path.join(base, name, "job.json")).st_mtime, name))
            except OSError:
                continue
    return [name for _, name in sorted(found, reverse=True)]


def public(job: dict) -> dict:
    """The record as it may be shown: without its environment."""
    return {k: v for k, v in job.items() if k != "env"}


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0




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



