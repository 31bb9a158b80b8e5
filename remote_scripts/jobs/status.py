"""What the status ops answer about jobs (stdlib only): one job's state and progress, every job on
the node."""

from __future__ import annotations

import os
import time

from ..core import drainmark
from ..core.kernel import kernel_log
from ..core.nodeio import NodeError
from ..core.registry import node_op
from ..core.statetrust import read_json
from .liveness import job_state
from .outputs import read_manifest, written_by
from .procscan import tag_index
from .records import (
    every_job,
    file_size,
    find_job,
    is_slurm,
    jobs_dir,
    load_job,
    log_paths,
    output_dir,
    public,
    record_dir,
    slurm_records_dir,
)
from .tail import last_match


@node_op("job_status", writes=False)
def job_status(req: dict) -> dict:
    # shown beside the job: a drained node runs nothing new
    drain = drainmark.read(req["state_dir"])
    try:
        job_dir, job = load_job(req["state_dir"], req.get("job_id"))
    except NodeError as exc:
        raise NodeError(str(exc), kind=exc.kind, **{**exc.details, "drain": drain}) from None
    st = job_state(job_dir, job)
    out = {
        "ok": True,
        "job": public(job),
        **st,
        "log_bytes": file_size(job["log"]),
        "last_progress": last_match(job["log"], req.get("progress_pattern")),
        "drain": drain,
    }
    if st["state"] == "lost" or (st.get("exit") or {}).get("signal") == 9:
        try:  # SIGKILL or gone: the OOM killer's lines, if any (the client matches them to the job)
            out["kernel"] = kernel_log()
        except OSError as exc:
            out["kernel"] = {
                "error": f"the kernel log could not be read: {exc}",
                "error_kind": "kernel_log_unreadable",
            }
    return out


def _job_output(
    job_dir: str, job: dict, out: str | None, manifests: dict[str, dict | None]
) -> dict:
    """What of its output the job wrote (its samples the manifests still name, and their bytes):
    never the directory's size, which every run on that output shares. A Slurm job's shards each
    have their own."""
    if not out:
        return {"output_bytes": None, "output_samples": None}
    outputs = [out]
    if is_slurm(job) and int(job.get("shards") or 1) > 1:
        outputs = []
        for task in range(int(job.get("shards") or 1)):
            try:
                request = read_json(os.path.join(job_dir, f"request-{task}.json")) or {}
            except NodeError:
                continue
            if isinstance(request.get("output"), str):
                outputs.append(request["output"])
    samples = size = 0
    for path in outputs:
        if path not in manifests:
            try:
                manifests[path] = read_manifest(path)
            except (OSError, ValueError):
                manifests[path] = None
        part = written_by(path, job["id"], manifests[path])
        if part is not None:
            samples += part["samples"]
            size += part["bytes"]
    return {"output_bytes": size, "output_samples": samples}


# the newest Slurm jobs without every exit file that squeue/sacct are asked about
SLURM_QUERIES = 20


def _slurm_row(req: dict, job_dir: str, job: dict, asked: list[int]) -> dict:
    """A Slurm job's row: its record (the client reads its state from squeue/sacct's lines and the
    exit files, as `status` does); squeue/sacct are asked about the newest SLURM_QUERIES jobs still
    without an exit file."""
    from .slurm import record_view

    shards = int(job.get("shards") or 1)
    view = record_view(req, job_dir, job, ask=asked[0] < SLURM_QUERIES)
    asked[0] += 1 if view["query"] else 0
    logs = log_paths(job)
    return {
        "record": public(job),
        "slurm_job_id": job.get("slurm_job_id"),
        "shards": shards,
        "logs": logs,
        "log": logs[0] if logs else None,
        "log_bytes": sum(file_size(p) for p in logs),
        **view,
    }


@node_op("jobs_list", writes=False)
def jobs_list(req: dict) -> dict:
    """Every job of the node's store (SSH and Slurm), newest first: id, name, state, started,
    runtime, exit, output sizes. A Slurm job's state is the client's to read (its row carries
    squeue/sacct's lines)."""
    state_dir = req["state_dir"]
    rows = []
    limit = int(req.get("limit") or 0)
    jobs = every_job(state_dir)
    index = tag_index()
    asked = [0]
    manifests: dict[str, dict | None] = {}
    for job in jobs[:limit] if limit else jobs:
        job_dir = record_dir(state_dir, job)
        row = {
            "id": job["id"],
            "name": job.get("name"),
            "kind": job.get("kind"),
            "started": job.get("started"),
            "started_ts": job.get("started_ts"),
            "operator": job.get("operator"),
            "scheduler": job.get("scheduler") or "ssh",
        }
        if is_slurm(job):
            row.update(_slurm_row(req, job_dir, job, asked))
        else:
            row.update(
                **job_state(job_dir, job, index),
                log=job.get("log"),
                log_bytes=file_size(job.get("log") or ""),
            )
        out = output_dir(job_dir, job)
        row.update(output=out, **_job_output(job_dir, job, out, manifests))
        rows.append(row)
    latest = None
    if jobs:
        try:
            latest = find_job(state_dir, None)[1]["id"]
        except NodeError:
            latest = jobs[0]["id"]
    return {
        "ok": True,
        "jobs": rows,
        "total": len(jobs),
        "latest": latest,
        "jobs_dir": jobs_dir(state_dir),
        "slurm_dir": slurm_records_dir(state_dir),
        "now_ts": time.time(),
    }
