"""What `extract` checks before launching, in one exec: the playbook's fast checks, the GPUs, the
running job, whether the node is drained, and whether the job's output already holds every
sample."""

from __future__ import annotations

import os
import stat
import sys
from typing import Any

from ..checks import checks
from ..core import drainmark
from ..core.registry import node_op
from ..jobs.jobs import all_jobs, expand, job_state, jobs_dir, output_dir, running_job
from ..jobs.outputlock import describe, held
from ..jobs.outputs import completion
from . import gpu


@node_op("preflight", writes=True)
def preflight(req: dict) -> dict:
    """What `extract` checks before launching, in the same exec: the playbook's fast checks and the
    GPUs."""
    verify = (
        checks.verify(req)
        if req.get("checks") or req.get("requires")
        else {"ok": True, "items": []}
    )
    running = running_job(req["state_dir"])
    public = {k: v for k, v in running.items() if k != "env"} if running else None
    answer: dict[str, Any] = {
        "ok": True,
        "verify": verify,
        "gpu": gpu.snapshot(req["state_dir"]),
        "running_job": public,
        "drain": drainmark.read(req["state_dir"]),
        "complete": _complete(req),
        "dataset": _dataset(req),
        "output_busy": _busy(req),
    }
    # an import path let pass (--allow-insecure-venv): the answer's own, as every op's
    if verify.get("warnings"):
        answer["warnings"] = verify.pop("warnings")
    return answer


def _busy(req: dict) -> dict | None:
    """Who else writes the extract job's output now (outputlock.py), on this host or another that
    shares it."""
    filled = _filled(req)
    output = filled.get("output") if filled else None
    if not isinstance(output, str) or not output or "{job_dir}" in output:
        return None
    holder = held(output)
    return {**holder, "text": describe(holder)} if holder else None


def _filled(req: dict) -> dict | None:
    extract = req.get("extract")
    if not isinstance(extract, dict):
        return None
    filled = expand(
        extract, {"state_dir": os.path.abspath(req["state_dir"]), "python": sys.executable}
    )
    return filled if isinstance(filled, dict) else None


def _dataset(req: dict) -> dict | None:
    """Why the extract job's dataset cannot be read here ({path, error}), else None: the job would
    load its model only to fail on its first read."""
    filled = _filled(req)
    path = filled.get("dataset") if filled else None
    if not isinstance(path, str) or not path or "{job_dir}" in path:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        return {"path": path, "error": exc.strerror or str(exc), "errno": exc.errno}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {"path": path, "error": "not a regular file", "errno": None}
    finally:
        os.close(fd)
    return None


def _complete(req: dict) -> dict | None:
    """The extract job's output, when it already holds every sample of this very extraction
    (jobs/outputs.py). An output under {job_dir} is new for every job: never complete beforehand."""
    extract = req.get("extract")
    if (
        not isinstance(extract, dict)
        or extract.get("again")
        or "{job_dir}" in str(extract.get("output"))
    ):
        return None
    filled = _filled(req)
    done = completion(filled) if filled is not None else None
    if done is not None:
        late = _interrupted_again(req["state_dir"], os.path.abspath(done["output"]))
        if late:
            done["interrupted"] = late
    return done


def _interrupted_again(state_dir: str, output: str) -> dict | None:
    """The newest job of this node on `output`, when it was an `extract --again` that did not
    succeed (killed before it began its new manifest): the output still looks complete, but it is
    not what was last asked for."""
    for job in all_jobs(state_dir):
        job_dir = os.path.join(jobs_dir(state_dir), job["id"])
        if (job.get("output") or output_dir(job_dir, job)) != output:
            continue
        if not job.get("again"):
            return None
        st = job_state(job_dir, job)
        if st["state"] in ("succeeded", "running", "starting"):
            return None
        ended = st.get("exit") or {}
        how = (
            f"signal {ended['signal']}"
            if ended.get("signal")
            else f"exit status {ended.get('exit_code')}"
            if ended
            else "no exit status"
        )
        return {
            "job": job["id"],
            "state": st["state"],
            "how": how,
            "again": True,
            "name": job.get("name"),
        }
    return None
