"""What the status ops answer about jobs (stdlib only): one job's state and progress, every job on the node."""

from __future__ import annotations

import os

from ..core import drainmark
from ..core.kernel import kernel_log
from ..core.nodeio import NodeError, read_json
from .liveness import job_state
from .procscan import tag_index
from .records import all_jobs, file_size, jobs_dir, load_job, output_dir, public
from .tail import last_match


def job_status(req: dict) -> dict:
    drain = drainmark.read(req["state_dir"])  # shown beside the job: a drained node runs nothing new
    try:
        job_dir, job = load_job(req["state_dir"], req.get("job_id"))
    except NodeError as exc:
        raise NodeError(str(exc), kind=exc.kind, **{**exc.details, "drain": drain}) from None
    st = job_state(job_dir, job)
    out = {"ok": True, "job": public(job), **st, "log_bytes": file_size(job["log"]),
           "last_progress": last_match(job["log"], req.get("progress_pattern")), "drain": drain}
    if st["state"] == "lost" or (st.get("exit") or {}).get("signal") == 9:
        try:  # SIGKILL or gone: the OOM killer's lines, if any (the client matches them to the job)
            out["kernel"] = kernel_log()
        except OSError as exc:
            out["kernel"] = {"error": f"the kernel log could not be read: {exc}", "error_kind": "kernel_log_unreadable"}
    return out




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




def jobs_list(req: dict) -> dict:
    """Every job on the node, newest first: id, name, state, started, runtime, exit, output sizes."""
    state_dir = req["state_dir"]
    rows = []
    limit = int(req.get("limit") or 0)
    jobs = all_jobs(state_dir)
    index = tag_index()
    for job in jobs[:limit] if limit else jobs:
        job_dir = os.path.join(jobs_dir(state_dir), job["id"])
        st = job_state(job_dir, job, index)
        out = output_dir(job_dir, job)
        rows.append({"id": job["id"], "name": job.get("name"), "kind": job.get("kind"), "started": job.get("started"),
                     "started_ts": job.get("started_ts"), "operator": job.get("operator"), **st,
                     "log": job.get("log"), "log_bytes": file_size(job.get("log") or ""),
                     "output": out, "output_bytes": _tree_bytes(out) if out and os.path.isdir(out) else None})
    current = read_json(os.path.join(jobs_dir(state_dir), "current.json"), on_corrupt="quarantine") if rows else None
    latest = (current or {}).get("id") or (jobs[0]["id"] if jobs else None)
    return {"ok": True, "jobs": rows, "total": len(jobs), "latest": latest,
            "jobs_dir": jobs_dir(state_dir)}




