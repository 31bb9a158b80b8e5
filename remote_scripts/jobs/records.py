"""The job record store (stdlib only), one for both kinds of job: a directory per job under
<state_dir>/jobs (SSH jobs) or <state_dir>/slurm (Slurm jobs), each with its job.json, and
current.json naming the latest. Records are written atomically (write_json_atomic), so a corrupt one
is truly corrupt, never one being written: it is moved aside (reported), not fatal forever."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

from ..core.atomicio import ensure_dir, write_json_atomic
from ..core.nodeio import NodeError
from ..core.statetrust import QUARANTINED, read_json
from .procscan import tagged_pids

# typing.TYPE_CHECKING without importing typing: the agent's start-up imports only what it runs
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, overload

LOG = "output.log"
KNOWN_IDS_SHOWN = 10
# Secret env values (the playbook's secret_env, the inventory's {secret: ...}) travel to the wrapper
# in this 0600 file, never in job.json; the wrapper deletes it as soon as the job's process has
# them.
SECRET_ENV = "secret-env.json"
CAUSE = "cause.json"  # the job's own one-line cause of a failure (the extraction driver writes it)


def cause_name(task: str = "") -> str:
    """cause.json, or a Slurm task's cause-N.json."""
    return f"cause-{task}.json" if task else CAUSE


def job_cause(job_dir: str, task: str = "") -> str | None:
    """The one line a failed job wrote about why (cause_name's file), if it wrote one."""
    try:
        said = (read_json(os.path.join(job_dir, cause_name(task))) or {}).get("cause")
    except (NodeError, OSError, AttributeError):
        return None
    return said if isinstance(said, str) and said else None


# written by `stop` before its first signal: the end that follows is fleetops' own
STOP_ASKED = "stop.json"
JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,120}")


def jobs_dir(state_dir: str) -> str:
    return os.path.join(os.path.abspath(state_dir), "jobs")


def slurm_records_dir(state_dir: str) -> str:
    """Where the Slurm jobs' records are (the same as slurm.slurm_dir: the store has the one
    layout)."""
    return os.path.join(os.path.abspath(state_dir), "slurm")


def is_slurm(job: dict) -> bool:
    return job.get("scheduler") == "slurm"


def record_dir(state_dir: str, job: dict) -> str:
    """The job's own directory, in the part of the store its kind lives in."""
    return os.path.join(
        slurm_records_dir(state_dir) if is_slurm(job) else jobs_dir(state_dir), job["id"]
    )


def log_paths(job: dict) -> list[str]:
    """Every log the job writes: an SSH job's one output.log, each task's of a Slurm job."""
    if is_slurm(job):
        return [str(p) for p in job.get("logs") or []]
    return [str(job["log"])] if job.get("log") else []


# A job spec stays a dict, its text stays text: the overloads let callers index what they passed in.
if TYPE_CHECKING:

    @overload
    def expand(value: str, mapping: dict[str, str]) -> str: ...
    @overload
    def expand(value: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]: ...
    @overload
    def expand(value: list[Any], mapping: dict[str, str]) -> list[Any]: ...
    @overload
    def expand(value: object, mapping: dict[str, str]) -> object: ...


def expand(value: object, mapping: dict[str, str]) -> object:
    """Fill {state_dir}, {job_dir} and {python} in job values (plain text substitution; nothing is
    evaluated)."""
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
    """A new job's id (its name, the UTC time, 4 random hex digits) and its directory under `base`,
    created."""
    job_id = f"{name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.urandom(2).hex()}"
    job_dir = os.path.join(base, job_id)
    ensure_dir(job_dir)
    return job_id, job_dir


def set_current(base: str, job_id: str) -> None:
    write_json_atomic(os.path.join(base, "current.json"), {"id": job_id})


def find_record(
    base: str, job_id: str | None, newest: Callable[[], list[str]], none_yet: str
) -> tuple[str, str, dict | None, dict | None]:
    """The record asked for, else the one current.json names, else the newest (`newest()`: ids,
    newest first; `none_yet`: the refusal when there is none): (id, job dir, record or None, and
    where a corrupt record was just moved, else None)."""
    if not job_id:
        current = read_json(os.path.join(base, "current.json"), on_corrupt="quarantine")
        latest = (current or {}).get("id")
        if (
            not isinstance(latest, str)
            or not JOB_ID.fullmatch(latest)
            or not os.path.lexists(os.path.join(base, latest, "job.json"))
        ):
            # no pointer (or a corrupt one, moved aside), or its job's record is gone: the newest
            # readable job
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
    """The job asked for, else the latest one (find_record); a corrupt record is reported with what
    is left."""
    job_id, job_dir, job, moved = find_record(
        jobs_dir(state_dir),
        job_id,
        lambda: [j["id"] for j in all_jobs(state_dir)],
        "no job has been started on this node",
    )
    if moved is not None:
        raise _quarantined_job(job_id, job_dir, moved)
    if job is None and os.path.lexists(
        os.path.join(slurm_records_dir(state_dir), job_id, "job.json")
    ):
        raise NodeError(
            f"job {job_id} is a Slurm job: the inventory "
            "does not mark this host `scheduler: slurm`, "
            "so this reads SSH jobs only; add it to the host and run again (`jobs`, `fetch` and "
            "`diagnose` read both kinds)",
            kind="no_job",
        )
    if job is None:
        known = [j["id"] for j in all_jobs(state_dir)]
        shown = ", ".join(known[:KNOWN_IDS_SHOWN]) + (
            f" (and {len(known) - KNOWN_IDS_SHOWN} older)" if len(known) > KNOWN_IDS_SHOWN else ""
        )
        raise NodeError(
            f"no job {job_id!r} on this node; its jobs, newest first: {shown}"
            if known
            else f"no job {job_id!r} on this node; it has no jobs",
            kind="no_job",
            known=known,
        )
    return job_dir, job


def _quarantined_job(job_id: str, job_dir: str, moved: dict) -> NodeError:
    """The answer about a job whose record was corrupt (just moved aside): which job, where its
    record went, and what of it is still there; the node's other jobs and new ones are
    unaffected."""
    log = os.path.join(job_dir, LOG)
    kept = (
        f"its log {log} ({file_size(log)} bytes)"
        if os.path.exists(log)
        else f"no log ({log} is missing)"
    )
    pids = tagged_pids(job_dir)
    left = f"; its processes {pids} still run" if pids else ""
    return NodeError(
        f"job {job_id}'s record was corrupt ({moved['why']}) and is quarantined: moved to "
        f"{moved['moved_to']}; kept: {kept} and its directory {job_dir}{left}; the node's other "
        f"jobs are unaffected (fab jobs)",
        kind="corrupt_state",
        job_id=job_id,
        path=moved["path"],
        moved_to=moved["moved_to"],
        log=log,
        left=pids,
    )


def all_jobs(state_dir: str) -> list[dict]:
    """Every SSH job with a readable job.json, newest first (a corrupt one is moved aside and
    reported, not fatal)."""
    return _records(jobs_dir(state_dir))


def every_job(state_dir: str) -> list[dict]:
    """Every job of the store, SSH and Slurm alike, newest first: what `jobs`, `fetch` and
    `diagnose` read."""
    found = _records(jobs_dir(state_dir)) + [
        j for j in _records(slurm_records_dir(state_dir)) if is_slurm(j)
    ]
    return sorted(found, key=lambda j: (j.get("started_ts") or 0, j["id"]), reverse=True)


def find_job(state_dir: str, job_id: str | None) -> tuple[str, dict]:
    """Any job of the store by its id (SSH or Slurm), else the newer of the two kinds' latest: (job
    dir, record). A corrupt record is moved aside and reported (load_job's refusals); an unknown id
    is refused with the ids of both kinds."""
    if job_id:
        if not JOB_ID.fullmatch(job_id):
            raise NodeError(f"bad job id {job_id!r}", kind="no_job")
        if os.path.lexists(os.path.join(jobs_dir(state_dir), job_id, "job.json")):
            return load_job(state_dir, job_id)
        if os.path.lexists(os.path.join(slurm_records_dir(state_dir), job_id, "job.json")):
            return _slurm_record(state_dir, job_id)
        known = [j["id"] for j in every_job(state_dir)]
        more = (
            f" (and {len(known) - KNOWN_IDS_SHOWN} older)" if len(known) > KNOWN_IDS_SHOWN else ""
        )
        raise NodeError(
            f"no job {job_id!r} on this node; its jobs, newest first: "
            f"{', '.join(known[:KNOWN_IDS_SHOWN])}{more}"
            if known
            else f"no job {job_id!r} on this node; it has no jobs",
            kind="no_job",
            known=known,
        )
    latest = []
    for load in (lambda: load_job(state_dir, None), lambda: _slurm_record(state_dir, None)):
        try:
            latest.append(load())
        except NodeError as exc:
            if exc.kind != "no_job":
                raise
    if not latest:
        raise NodeError("no job has been started on this node", kind="no_job", known=[])
    return max(latest, key=lambda found: found[1].get("started_ts") or 0)


def _slurm_record(state_dir: str, job_id: str | None) -> tuple[str, dict]:
    job_id, job_dir, job = find_slurm_record(
        state_dir, job_id, "no job has been started on this node"
    )
    if job is None or not is_slurm(job):
        raise NodeError(f"no job {job_id!r} on this node", kind="no_job", known=[])
    return job_dir, job


def find_slurm_record(
    state_dir: str, job_id: str | None, none_yet: str, kept: str = ""
) -> tuple[str, str, dict | None]:
    """A Slurm job's record, the one asked for else the latest (find_record; `none_yet`: the refusal
    when there is none): (id, job dir, record or None when it has none). A corrupt record is moved
    aside and reported (`kept`: what the caller adds about what is left of the job)."""
    base = slurm_records_dir(state_dir)
    job_id, job_dir, job, moved = find_record(base, job_id, lambda: newest_ids(base), none_yet)
    if moved is not None:
        raise NodeError(
            f"Slurm job {job_id}'s record was corrupt ({moved['why']}) and is quarantined: moved "
            f"to {moved['moved_to']}; its directory {job_dir} "
            f"is kept{kept}; the other jobs are unaffected",
            kind="corrupt_state",
            job_id=job_id,
            path=moved["path"],
            moved_to=moved["moved_to"],
        )
    return job_id, job_dir, job


def _records(base: str) -> list[dict]:
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
    """Remove the job's secret env file (the wrapper does it once the job's process has the values;
    this is the fallback for a wrapper that died first). True if one was there."""
    try:
        os.unlink(os.path.join(job_dir, SECRET_ENV))
        return True
    except FileNotFoundError:
        return False


def newest_ids(base: str) -> list[str]:
    """The job ids under `base` with a job.json, newest first by the record's time (ids start with
    the job's name, so they do not sort by time across names), without reading the records."""
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
    """Where an extract job writes its samples and manifest (its request's output), else None. A
    Slurm job's shards each write under <output>/shards/: the output is the one they were cut
    from."""
    if job.get("kind") != "extract":
        return None
    try:
        request = (
            read_json(os.path.join(job_dir, "request-0.json" if is_slurm(job) else "request.json"))
            or {}
        )
    except NodeError:
        return None
    out = request.get("output")
    if isinstance(out, str) and out and is_slurm(job) and isinstance(request.get("shard"), dict):
        out = os.path.dirname(os.path.dirname(out.rstrip("/")))
    return os.path.abspath(out) if isinstance(out, str) and out else None
