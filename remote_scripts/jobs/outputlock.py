"""An extraction's output-directory lock (stdlib only): one run at a time writes an output
directory, whichever host it runs on, hosts that share the filesystem (a Slurm login node and its
compute nodes, two nodes on one NFS export) included.

The lock is a file, `<output>/.fleetops-output.lock`, made by linking a file already written to that
name (atomic on a local filesystem and on NFS, where the server decides the link), holding who took
it: the host's name, its boot id and pid namespace, the pid and start time of the run's process, and
the job's id. Whether a lock is stale (its run gone without removing it: SIGKILL, OOM, power loss)
is judged only by the host that took it: only there do the pid and its start time name a process (a
pid on another host means nothing here). A host that finds another host's lock refuses and names
that host and job; once that run is gone, its own host clears the lock on its next extract there (or
a person removes the file).

Not fcntl/flock for the lock itself: on NFS those depend on the lock manager (lockd/NLM or NFSv4
leases), which a cluster may not run, and a lock of a process killed on a host that then hangs may
be held until the lease expires. The file's content names its holder in words a person can read. A
takeover of a stale lock is serialised among the takers (all on the owning host) by a flock of a
file beside it."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time

from ..core.procfs import start_ticks

LOCK = ".fleetops-output.lock"
TAKEOVER = ".fleetops-output.lock.takeover"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _pid_ns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def me(job_id: str | None, pid: int | None = None) -> dict:
    pid = pid or os.getpid()
    return {
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "pid_ns": _pid_ns(),
        "pid": pid,
        "pid_started": start_ticks(pid),
        "job": job_id,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _read(path: str) -> dict | None:
    """The holder a lock file names; {} when it names none (a damaged file: acquire() links a lock
    whole); None when there is no lock."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "rb") as f:
            holder = json.loads(f.read(8192).decode("utf-8", "replace") or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def judge(holder: dict) -> str:
    """'live', 'stale' or 'elsewhere' (another host's: only it can tell). Stale only on the holder's
    own host: the same boot and pid namespace with no process of the holder's pid and start time, or
    the same host name booted since (no process of an earlier boot lives; two machines must not
    share a host name)."""
    boot, ns = _boot_id(), _pid_ns()
    if boot and holder.get("boot_id") == boot and holder.get("pid_ns") == ns:
        pid = holder.get("pid")
        if not isinstance(pid, int) or pid <= 0:
            return "elsewhere"
        return (
            "live"
            if start_ticks(pid) is not None and start_ticks(pid) == holder.get("pid_started")
            else "stale"
        )
    if (
        boot
        and holder.get("boot_id")
        and holder.get("boot_id") != boot
        and holder.get("host") == socket.gethostname()
    ):
        return "stale"
    return "elsewhere"


def held(output: str) -> dict | None:
    """Who holds the output's lock, as it may be told (its holder, and `judged`: live or elsewhere),
    or None when it is free or its holder is provably gone."""
    holder = _read(os.path.join(output, LOCK))
    if holder is None:
        return None
    verdict = judge(holder) if holder else "elsewhere"
    return (
        None
        if verdict == "stale"
        else {**holder, "judged": verdict, "path": os.path.join(output, LOCK)}
    )


def describe(holder: dict) -> str:
    if not holder.get("host"):
        return (
            f"{holder.get('path')} exists but names no holder "
            "(damaged, or left by an older fleetops); remove "
            "it once no run writes there"
        )
    where = "this host" if holder.get("judged") == "live" else f"host {holder.get('host')}"
    return (
        f"job {holder.get('job') or '(unknown)'} (pid {holder.get('pid')} on {where}, since "
        f"{holder.get('at')}) holds {holder.get('path')}"
    )


class OutputBusy(Exception):
    def __init__(self, holder: dict) -> None:
        super().__init__(describe(holder))
        self.holder = holder


def acquire(output: str, job_id: str | None) -> str:
    """Take the output's lock for this process; OutputBusy when another run (on any host) holds it.
    A stale lock of this host is taken over. Returns the lock's path.

    The lock appears whole: its content is written to a file of this process's own first, which is
    then linked to the lock's name (link fails if the name exists, atomically, on NFS too). A racer
    therefore never reads a lock that is there but empty, as it would between an O_EXCL create and
    its write."""
    path = os.path.join(output, LOCK)
    mine = (json.dumps(me(job_id)) + "\n").encode()
    folder = os.open(output, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for _ in range(3):
            if _link_whole(folder, mine):
                return path
            holder = _read(path)
            if holder is None:
                continue  # released meanwhile
            if not holder or judge(holder) != "stale":
                raise OutputBusy(
                    {
                        **(holder or {}),
                        "judged": judge(holder) if holder else "elsewhere",
                        "path": path,
                    }
                )
            _take_over(path, holder)
    finally:
        os.close(folder)
    raise OutputBusy({**(_read(path) or {}), "judged": "elsewhere", "path": path})


def _link_whole(folder: int, content: bytes) -> bool:
    """The lock named LOCK in `folder`, holding `content` from its first moment: True if this call
    made it."""
    temp = f"{LOCK}.{socket.gethostname()}.{os.getpid()}.{os.urandom(4).hex()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=folder)
    try:
        try:
            os.write(fd, content)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temp, LOCK, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
            return True
        except FileExistsError:
            return False
        except OSError:
            # NFS may report a failed link whose create the server did make (a lost reply): two
            # names on our file mean it is ours.
            return os.stat(temp, dir_fd=folder, follow_symlinks=False).st_nlink == 2
    finally:
        os.unlink(temp, dir_fd=folder)


def _take_over(path: str, stale: dict) -> None:
    """Remove a lock this host judged stale, unless another taker got there first (checked under a
    flock of a file beside it, so two takers never remove each other's fresh lock)."""
    fd = os.open(
        os.path.join(os.path.dirname(path), TAKEOVER), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _read(path) == stale:
            os.unlink(path)
    finally:
        os.close(fd)


def release(path: str) -> None:
    """Remove the lock, only while it is still this process's."""
    holder = _read(path)
    if holder and holder.get("pid") == os.getpid() and holder.get("boot_id") == _boot_id():
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
