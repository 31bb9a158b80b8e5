"""The `drain` and `undrain` ops: a node taken out of service and put back (stdlib only). The marker
is core/drainmark.py's; on a host the inventory names as a Slurm node (`slurm_node`), Slurm is told
too (`scontrol update nodename=X state=drain reason=...`, `state=resume`), so the scheduler places
nothing there either."""

from __future__ import annotations

import os

from ..core import drainmark
from ..core.nodeio import NodeError
from ..core.registry import node_op
from ..jobs.liveness import running_job
from ..jobs.slurm import node_state


def _slurm(req: dict, drain: bool, reason: str) -> dict | None:
    node = req.get("slurm_node")
    if not node:
        return None
    return node_state(str(node), drain, reason, req.get("scheduler_env") or {})


@node_op("drain", writes=True)
def drain(req: dict) -> dict:
    reason = str(req.get("reason") or "").strip()
    if not reason or "\n" in reason:
        raise NodeError(
            "drain needs a reason on one line (--reason 'Xid 79 on GPU 3')", kind="bad_request"
        )
    state_dir = os.path.abspath(req["state_dir"])
    marker = drainmark.mark(
        state_dir, str(req.get("operator") or "?"), reason, str(req.get("host") or "?")
    )
    running = running_job(state_dir)
    job = {k: running.get(k) for k in ("id", "name", "started")} if running else None
    return {"ok": True, "drain": marker, "running_job": job, "slurm": _slurm(req, True, reason)}


@node_op("undrain", writes=True)
def undrain(req: dict) -> dict:
    state_dir = os.path.abspath(req["state_dir"])
    old = drainmark.clear(state_dir)
    return {"ok": True, "was": old, "slurm": _slurm(req, False, "")}
