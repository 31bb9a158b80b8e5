"""Long jobs on the node that outlive the SSH session: start (detached, own session), status, tail
by byte offset, logs, stop (the whole process group). Stdlib only. This module is their one public
face for the rest of the agent and the lab; each part lives in its own module: records (the record
store), procscan and liveness (whether a job runs), start, status, tail (tail and logs), stop,
keeper (the keeper and the wrapper).

Layout: <state_dir>/jobs/<id>/{job.json, request.json, output.log, exit.json}; jobs/current.json
names the latest job. Two small processes stand behind the job: the keeper (`agent.pyz wrap
<job_dir>`, session leader and child subreaper) and the wrapper it forks (the job's parent), which
waits for the job and writes exit.json however it ends (exit code or signal). If the wrapper is
killed the job is re-parented to the keeper, which collects and records its exit status instead;
exit.json is written into space reserved at launch (exit.reserve), so a full disk cannot lose it.

Every process of the job carries FLEETOPS_JOB_DIR=<job_dir> (and FLEETOPS_JOB_ID) in its
environment: whether a job runs is decided by scanning /proc/*/environ of this user's processes for
that tag, not by the wrapper or the process group, and `stop` kills every tagged process (a child
that left the group with setsid included). Only a process that drops its whole environment (env -i)
escapes the tag. Launching is atomic per node: the running check and the launch happen under
jobs/launch.lock.
"""

from __future__ import annotations

from ..core.nodeio import NodeError
from .keeper import wrap_main
from .liveness import job_state, live_job_ids, running_job
from .procscan import group_members, tagged_pids
from .records import all_jobs, expand, jobs_dir, load_job, output_dir
from .start import job_start
from .status import job_status, jobs_list
from .stop import job_stop
from .tail import attach_offset, job_logs, job_tail

__all__ = [
    "NodeError",
    "all_jobs",
    "attach_offset",
    "expand",
    "group_members",
    "job_logs",
    "job_start",
    "job_state",
    "job_status",
    "job_stop",
    "job_tail",
    "jobs_dir",
    "jobs_list",
    "live_job_ids",
    "load_job",
    "output_dir",
    "running_job",
    "tagged_pids",
    "wrap_main",
]
