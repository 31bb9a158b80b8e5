"""What `extract` checks before launching, in one exec: the playbook's fast checks, the GPUs, the running job,
whether the node is drained, and whether the job's output already holds every sample."""

from __future__ import annotations

import os
import stat
import sys

from ..checks import checks
from ..core import drainmark
from ..jobs.jobs import expand, running_job
from ..jobs.outputs import completion
from . import gpu


def preflight(req: dict) -> dict:
    """What `extract` checks before launching, in the same exec: the playbook's fast checks and the GPUs."""
    verify = checks.verify(req) if req.get("checks") or req.get("requires") else {"ok": True, "items": []}
    running = running_job(req["state_dir"])
    public = {k: v for k, v in running.items() if k != "env"} if running else None
    return {"ok": True, "verify": verify, "gpu": gpu.snapshot(req["state_dir"]), "running_job": public,
            "drain": drainmark.read(req["state_dir"]), "complete": _complete(req), "dataset": _dataset(req)}


def _filled(req: dict) -> dict | None:
    extract = req.get("extract")
    if not isinstance(extract, dict):
        return None
    filled = expand(extract, {"state_dir": os.path.abspath(req["state_dir"]), "python": sys.executable})
    return filled if isinstance(filled, dict) else None


def _dataset(req: dict) -> dict | None:
    """Why the extract job's dataset cannot be read here ({path, error}), else None: the job would load its
    model only to fail on its first read."""
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
    """The extract job's output, when it already holds every sample of this very extraction (jobs/outputs.py).
    An output under {job_dir} is new for every job: never complete beforehand."""
    extract = req.get("extract")
    if not isinstance(extract, dict) or extract.get("again") or "{job_dir}" in str(extract.get("output")):
        return None
    filled = _filled(req)
    return completion(filled) if filled is not None else None
