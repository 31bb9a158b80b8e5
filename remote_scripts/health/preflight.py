"""What `extract` checks before launching, in one exec: the playbook's fast checks, the GPUs, the running job,
whether the node is drained, and whether the job's output already holds every sample."""

from __future__ import annotations

import os
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
    answer = {"ok": True, "verify": verify, "gpu": gpu.snapshot(req["state_dir"]), "running_job": public,
              "drain": drainmark.read(req["state_dir"]), "complete": _complete(req)}
    if verify.get("warnings"):  # an import path let pass (--allow-insecure-venv): the answer's own, as every op's
        answer["warnings"] = verify.pop("warnings")
    return answer


def _complete(req: dict) -> dict | None:
    """The extract job's output, when it already holds every sample of this very extraction (jobs/outputs.py).
    An output under {job_dir} is new for every job: never complete beforehand."""
    extract = req.get("extract")
    if not isinstance(extract, dict) or "{job_dir}" in str(extract.get("output")):
        return None
    state_dir = os.path.abspath(req["state_dir"])
    filled = expand(extract, {"state_dir": state_dir, "python": sys.executable})
    return completion(filled) if isinstance(filled, dict) else None
