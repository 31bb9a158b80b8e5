"""patch and rollback as the agent serves them: first what makes a write unsafe now (stdlib only). A
drained node takes no patch; while a job of this node runs from the files the set would change,
neither writes (a worker the job starts later would import the new code beside the old: a
half-patched run), unless the request says `while_running`. A look (check mode) and a set that would
write nothing pass. The look for a running job and the write happen under the node's launch lock, so
no job starts in between."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from ..core import drainmark
from ..core.nodeio import NodeError
from ..core.protocol import WOULD_WORDS
from ..core.registry import node_op
from ..jobs.launchlock import LaunchLock
from ..jobs.liveness import running_job
from ..jobs.records import jobs_dir
from ..patch import patching


@node_op("patch", writes=True)
def patch(req: dict) -> dict:
    return _guarded(req, "patch", patching.patch)


@node_op("rollback", writes=True)
def rollback(req: dict) -> dict:
    return _guarded(req, "rollback", patching.rollback)


def _guarded(req: dict, op: str, run: Callable[[dict], dict]) -> dict:
    if req.get("check"):
        return run(req)
    state_dir = os.path.abspath(req["state_dir"])
    if op == "patch":
        drainmark.refuse_if_drained(state_dir, "patching")
    if req.get("while_running") or not os.path.isdir(jobs_dir(state_dir)):
        # no jobs dir: no job of this node ever ran (a launch makes it under the same lock)
        return run(req)
    with LaunchLock(state_dir):
        job = running_job(state_dir)
        if job is not None and job.get("prefix") in (None, sys.prefix) and _would_write(run, req):
            raise NodeError(
                f"job {job['id']} ({job.get('name')}, pid {job.get('pid')}, since "
                f"{job.get('started')}) is running under this venv ({sys.prefix}): {op} would "
                "change files it runs from; nothing written",
                kind="job_running",
                job={k: job.get(k) for k in ("id", "name", "pid", "started")},
            )
        return run(req)


def _would_write(run: Callable[[dict], dict], req: dict) -> bool:
    """The set would write a file: every file fine (a set is all-or-nothing) and one not yet in its
    new form."""
    looked = run({**req, "check": True})
    items = looked.get("items") or ()
    return bool(looked.get("ok")) and any(item.get("status") in WOULD_WORDS for item in items)
