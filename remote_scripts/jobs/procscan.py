"""The /proc scans behind a job's liveness (stdlib only): which live processes of this user carry a
job's tag (FLEETOPS_JOB_DIR in their environment), which belong to a process group, whether a
recorded pid is still ours."""

from __future__ import annotations

import os

from ..core.procfs import pid_alive, stat_fields


def process_alive(pid: int | None, marker: str) -> bool:
    if not pid or not pid_alive(int(pid)):
        return False
    fields = stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return marker.encode() in f.read()
    except OSError:
        return False


def tagged_pids(job_dir: str) -> list[int]:
    """Live (not zombie) processes of this user whose environment carries the job's tag: the job's
    own processes wherever they are (another process group, a new session), found without the
    wrapper."""
    me = os.getpid()
    return sorted(p for p in tag_index().get(os.path.abspath(job_dir), []) if p != me)


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(entry)
        if fields is None:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def tag_index() -> dict[str, list[int]]:
    """Every job dir named by a live process's tag → its pids (one pass over /proc)."""
    uid = os.getuid()
    out: dict[str, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        for var in env.split(b"\0"):
            if var.startswith(b"FLEETOPS_JOB_DIR="):
                fields = stat_fields(entry)
                if fields is not None and fields[0] not in ("Z", "X"):
                    out.setdefault(var.split(b"=", 1)[1].decode("utf-8", "replace"), []).append(
                        int(entry)
                    )
                break
    return out
