"""What `extract` checks before launching, in one exec: the playbook's fast checks, the GPUs, the running job."""

from __future__ import annotations

from ..checks import checks
from ..jobs.jobs import running_job
from . import gpu


def preflight(req: dict) -> dict:
    """What `extract` checks before launching, in the same exec: the playbook's fast checks and the GPUs."""
    verify = checks.verify(req) if req.get("checks") or req.get("requires") else {"ok": True, "items": []}
    running = running_job(req["state_dir"])
    public = {k: v for k, v in running.items() if k != "env"} if running else None
    return {"ok": True, "verify": verify, "gpu": gpu.snapshot(req["state_dir"]), "running_job": public}
