"""The `diagnose` operation: everything the on-call engineer would look at on a node, read in one
exec and sent back raw-ish (the client parses: fleetops/plans/kernellog.py, gpuhealth.py). Stdlib
only; read-only.

Each part is read on its own: a part that cannot be read (no nvidia-smi, a kernel log this user may
not read, no job yet) answers {"error": ..., "error_kind": ...} with the reason, and the others
still come back.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from ..core import drainmark
from ..core.kernel import kernel_log
from ..core.procfs import pids, read, stat_fields, uptime
from ..core.registry import node_op

XML_MAX_BYTES = 4 * 1024 * 1024
LOG_TAIL_BYTES = 64 * 1024
LOG_TAIL_LINES = 200
# the jobs before the latest whose records come along: an OOM kill may be one of theirs
EARLIER_JOBS = 20


def _part(fn, *args):  # any reader: its answer, or the reason it has none
    try:
        return fn(*args)
    except Exception as exc:  # one unreadable part must not hide the others
        return {"error": f"{type(exc).__name__}: {exc}", "error_kind": "crashed"}


def clock() -> dict:
    up = uptime()
    now = time.time()
    return {"epoch": now, "uptime_s": up, "boot_time": now - up, "hostname": socket.gethostname()}


def smi_xml(smi: str | None) -> dict:
    if smi is None:
        return {"error": "nvidia-smi not found on the node", "error_kind": "no_nvidia_smi"}
    try:
        proc = subprocess.run([smi, "-q", "-x"], capture_output=True, timeout=60)
    except subprocess.TimeoutExpired:
        return {"error": "nvidia-smi -q -x timed out after 60s", "error_kind": "nvidia_smi_failed"}
    if proc.returncode != 0:
        text = (proc.stdout + proc.stderr).decode("utf-8", "replace").strip()
        return {
            "error": f"nvidia-smi -q -x failed (exit {proc.returncode}): {text[:500]}",
            "error_kind": "nvidia_smi_failed",
        }
    return {
        "xml": proc.stdout[:XML_MAX_BYTES].decode("utf-8", "replace"),
        "truncated": len(proc.stdout) > XML_MAX_BYTES,
    }


def _meminfo() -> dict:
    out = {}
    with open("/proc/meminfo", encoding="utf-8") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable", "SwapTotal", "SwapFree"):
                out[key] = int(rest.split()[0])  # kB
    return out


def host_load() -> dict:
    load = os.getloadavg()
    return {"load": [round(x, 2) for x in load], "cpus": os.cpu_count(), "memory_kb": _meminfo()}


def disk(paths: dict[str, str | None]) -> list[dict]:
    out = []
    for label, path in paths.items():
        if not path:
            continue
        row: dict = {"label": label, "path": path}
        probe = path
        while probe and not os.path.exists(probe):  # an output dir not made yet: its filesystem
            probe = os.path.dirname(probe.rstrip("/")) if probe not in ("/", "") else ""
        try:
            st = os.statvfs(probe or "/")
        except OSError as exc:
            row["error"] = str(exc)
        else:
            row.update(
                exists=os.path.exists(path),
                total_bytes=st.f_blocks * st.f_frsize,
                free_bytes=st.f_bavail * st.f_frsize,
                inodes_total=st.f_files,
                inodes_free=st.f_favail,
            )
        out.append(row)
    return out


def _proc_row(pid: int, ticks: int, page: int) -> dict | None:
    fields = stat_fields(pid)
    if fields is None:
        return None
    raw_cmd, raw_comm = read(pid, "cmdline"), read(pid, "comm")
    if raw_cmd is None or raw_comm is None:
        cmd, comm = "", ""
    else:
        cmd = raw_cmd.replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
        comm = raw_comm.decode("utf-8", "replace").strip()
    return {
        "pid": pid,
        "ppid": int(fields[1]),
        "pgid": int(fields[2]),
        "state": fields[0],
        "comm": comm,
        "cmd": cmd,
        "cpu_s": round((int(fields[11]) + int(fields[12])) / ticks, 2),
        "rss_kb": int(fields[21]) * page // 1024,
    }


def process_tree(pgid: int | None, gpu_mib: dict[int, int]) -> list[dict]:
    """The job's processes: every process of its session (the wrapper leads it), with CPU use over a
    short sample, RSS, and GPU memory from nvidia-smi."""
    if not pgid:
        return []
    ticks, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")

    def members() -> dict[int, dict]:
        found = {}
        for pid in pids():
            fields = stat_fields(pid)
            if fields is not None and pgid in (int(fields[2]), int(fields[3])):
                row = _proc_row(pid, ticks, page)
                if row is not None:
                    found[pid] = row
        return found

    first = members()
    if not first:
        return []
    time.sleep(0.3)
    second = members()
    rows = []
    for pid, row in sorted(second.items()):
        before = first.get(pid)
        row["cpu_pct"] = round((row["cpu_s"] - before["cpu_s"]) / 0.3 * 100, 1) if before else None
        row["gpu_mib"] = gpu_mib.get(pid)
        rows.append(row)
    return rows


def _log_tail(logs: list[str]) -> tuple[int, list[str]]:
    """The logs' bytes and their last lines, one log after the other (a job array's tasks share
    LOG_TAIL_LINES, each at least 20, the first 50 tasks)."""
    total, tail = 0, []
    lines = max(20, LOG_TAIL_LINES // max(1, len(logs)))
    for log in logs[:50]:
        try:
            size = os.path.getsize(log)
            with open(log, "rb") as f:
                f.seek(max(0, size - LOG_TAIL_BYTES))
                tail += f.read().decode("utf-8", "replace").splitlines()[-lines:]
            total += size
        except OSError:
            continue
    return total, tail


def latest_job(req: dict, state_dir: str) -> dict:
    """The newest job of the node's store, SSH or Slurm (records.find_job), with its state and its
    log's end. A Slurm job's state is the client's to read from squeue/sacct's lines and its exit
    files, as `status` reads it."""
    from ..core.nodeio import NodeError
    from ..core.statetrust import read_json
    from ..jobs.records import find_job, is_slurm, log_paths, output_dir

    try:
        job_dir, job = find_job(state_dir, None)
    except NodeError as exc:
        return {"error": str(exc), "error_kind": exc.kind}
    if is_slurm(job):
        from ..jobs.slurm import record_view

        st = record_view(req, job_dir, job)
        st["record"] = {k: v for k, v in job.items() if k != "env"}
        st["output"] = output_dir(job_dir, job)
    else:
        from ..jobs.jobs import job_state

        st = job_state(job_dir, job)
        st["output"] = (read_json(os.path.join(job_dir, "request.json")) or {}).get("output")
    logs = log_paths(job) or [os.path.join(job_dir, "output.log")]
    size, tail = _log_tail(logs)
    public = {
        k: job.get(k)
        for k in (
            "id",
            "name",
            "kind",
            "argv",
            "started",
            "started_ts",
            "pid",
            "pgid",
            "wrapper_pid",
            "cwd",
            "slurm_job_id",
            "shards",
            "again",
        )
    }
    return {
        **public,
        "scheduler": job.get("scheduler") or "ssh",
        "log": logs[0],
        "logs": logs,
        "dir": job_dir,
        **st,
        "log_bytes": size,
        "log_tail": tail,
    }


def earlier_jobs(state_dir: str, latest: str | None) -> list[dict]:
    """The records of the node's jobs before the latest one, newest first (pids, start, how each
    ended): the client matches kernel OOM kills against them too, so a kill of an earlier job is
    known as this node's."""
    from ..core.nodeio import NodeError
    from ..core.statetrust import read_json
    from ..jobs.records import jobs_dir, newest_ids

    base = jobs_dir(state_dir)
    out = []
    for job_id in newest_ids(base):
        if job_id == latest:
            continue
        try:
            job = read_json(os.path.join(base, job_id, "job.json")) or {}
            ended = read_json(os.path.join(base, job_id, "exit.json"))
        except (NodeError, OSError):
            continue  # a record that cannot be read names no pid to match
        out.append(
            {
                **{k: job.get(k) for k in ("id", "name", "pid", "wrapper_pid", "started_ts")},
                "exit": ended,
            }
        )
        if len(out) >= EARLIER_JOBS:
            break
    return out


@node_op("diagnose", writes=False)
def diagnose(req: dict) -> dict:
    from ..checks import checks
    from . import gpu

    state_dir = os.path.abspath(req["state_dir"])
    out: dict = {"ok": True, "clock": _part(clock), "drain": _part(drainmark.read, state_dir)}
    if req.get("checks") or req.get("requires"):
        out["checks"] = _part(checks.verify, req)
    else:
        out["checks"] = {
            "error": "the playbook has no fast checks (requires, grep, compile)",
            "error_kind": "no_checks",
        }
    # the patch in check mode: per file already applied / would apply / drifted; no lock
    if req.get("patch"):
        from ..patch.patching import patch

        out["patch"] = _part(patch, {**req["patch"], "state_dir": state_dir, "check": True})
    smi = gpu.find_smi()
    out["gpu"] = _part(gpu.snapshot, state_dir)
    out["smi_xml"] = _part(smi_xml, smi)
    out["kernel"] = _part(kernel_log)
    job = _part(latest_job, req, state_dir)
    out["job"] = job
    out["earlier_jobs"] = _part(
        earlier_jobs, state_dir, None if job.get("error") else job.get("id")
    )
    gpu_mib = {}
    if out["gpu"].get("ok"):
        for g in out["gpu"]["gpus"]:
            for p in g.get("processes", []):
                gpu_mib[int(p["pid"])] = p.get("used_mib")
    out["processes"] = _part(process_tree, job.get("pgid"), gpu_mib) if not job.get("error") else []
    job_output = job.get("output") if not job.get("error") else None
    out["disk"] = _part(
        disk,
        {
            "venv": sys.prefix,
            "state_dir": state_dir,
            "job_dir": job.get("dir") if not job.get("error") else None,
            "job_output": job_output,
        },
    )
    out["host"] = _part(host_load)
    return out
