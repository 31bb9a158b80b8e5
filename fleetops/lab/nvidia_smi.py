"""A stand-in `nvidia-smi` for lab nodes, clearly simulated: it replays real output recorded on a
2×H200 machine (fleetops/lab/recordings/h200x2, named in gpu.json) according to the node's gpu.json
state:

  idle          both GPUs free
  busy          a real process started by `fab lab.gpu --state busy` holds each GPU (its pid
                replaces the recorded pid, so the node's process table has user, age and command for
                it)
  missing       GPU 1 is gone from every answer
  driver_error  nvidia-smi fails the way a driver/library mismatch makes it fail
While a fleetops job's processes are alive on the node (and the state is idle), GPU 0 answers as the
recorded busy GPU 0, held by the job's process, so `gpu`, `extract`'s gate and `stop` see a job on
the GPU as they would.

Memory is held by LIVE processes only, decided from /proc on every call, never from a job's
bookkeeping: a GPU is busy exactly as long as its holder (a lab holder, or a process of the job's
process group or session other than the wrapper) exists and is not a zombie. So "released" is only
ever seen once the processes are really gone, as on a real GPU where the driver frees memory when
the last process using it exits.

Installed by the lab as <node>/bin/nvidia-smi; never used outside the lab.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent  # <node>/bin
RECORDED_PIDS = ("580", "581")  # the pids in the busy recordings, GPU 0 and GPU 1
GPU_UUIDS = ("GPU-65d02187", "GPU-96672edd")
# same text as fleetops.lab.HOLDER_MARK (this file runs standalone)
HOLDER_MARK = "fleetops-lab-gpu-holder"


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: [state, ppid, pgrp, session, ...]."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def live(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def job_holder(state_dir: str | None) -> int | None:
    """The process that holds GPU 0 for the node's current job: its main process while alive,
    otherwise any other live process of its group or session (a worker it left behind keeps the
    memory, as on a real GPU). The wrapper is the session leader but never touches the GPU, so it
    holds nothing."""
    if not state_dir:
        return None
    try:
        current = json.loads((Path(state_dir) / "jobs" / "current.json").read_text())
        job = json.loads((Path(state_dir) / "jobs" / current["id"] / "job.json").read_text())
        pid, pgid = job.get("pid"), job.get("pgid")
        wrapper = job.get("wrapper_pid")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pid and live(int(pid)):
        return int(pid)
    if not pgid:
        return None
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == wrapper:
            continue
        fields = _stat(int(entry))
        if fields and fields[0] not in ("Z", "X") and int(pgid) in (int(fields[2]), int(fields[3])):
            members.append(int(entry))
    return min(members) if members else None


def lab_holder(pid: int) -> bool:
    try:
        return live(pid) and HOLDER_MARK.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _recorded(fixtures: Path, name: str) -> list[str]:
    return [
        ln
        for ln in (fixtures / name).read_text().splitlines()
        if ln.strip() and not ln.startswith("rc=")
    ]


def main(argv: list[str]) -> int:
    config = json.loads((HERE.parent / "gpu.json").read_text())
    state, fixtures = config["state"], Path(config["fixtures"])
    if state == "driver_error":
        print(
            "Failed to initialize NVML: Driver/library "
            "version mismatch\nNVML library version: 580.159"
        )
        return 18
    present = (0,) if state == "missing" else (0, 1)
    holders = {g: p for g, p in _holders(config).items() if g in present}
    args = " ".join(argv)
    nounits, noheader = "nounits" in args, "noheader" in args
    if "--query-gpu" in args:
        out = _gpu_rows(fixtures, present, holders, nounits, noheader)
    elif "--query-compute-apps" in args:
        out = _app_rows(fixtures, holders, nounits, noheader)
    # -q, or the plain table (the busy recording whenever any GPU is held; only its header is
    # parsed)
    else:
        name = "busy_q.xml" if "-q" in argv else f"{'busy' if holders else 'idle'}_table.txt"
        out = [ln for ln in (fixtures / name).read_text().splitlines() if not ln.startswith("rc=")]
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def _holders(config: dict) -> dict[int, int]:
    """GPU index → the pid that holds it: the lab's holder processes while the state is busy, else
    a running job's."""
    holders: dict[int, int] = {}
    if config["state"] == "busy":
        for gpu, pid in enumerate(config.get("holder_pids", [])[:2]):
            if lab_holder(int(pid)):
                holders[gpu] = int(pid)
        return holders
    pid = job_holder(config.get("state_dir"))
    if pid:
        holders[0] = pid  # a job takes GPU 0 only; GPU 1 stays free
    return holders


def _gpu_rows(
    fixtures: Path, present: tuple[int, ...], holders: dict[int, int], nounits: bool, noheader: bool
) -> list[str]:
    """--query-gpu: each GPU answers from the busy recording only while a live process holds it."""
    suffix = "_nounits" if nounits else ""
    busy = _recorded(fixtures, f"busy_query{suffix}.csv")
    idle = _recorded(fixtures, f"idle_query{suffix}.csv")
    out: list[str] = []
    if idle[0].startswith("index") and not noheader:
        out.append(idle[0])
    for gpu in present:
        source = busy if gpu in holders else idle
        out += [ln for ln in source if ln.startswith(f"{gpu},")]
    return out


def _app_rows(fixtures: Path, holders: dict[int, int], nounits: bool, noheader: bool) -> list[str]:
    """--query-compute-apps: the recorded row of each held GPU, with its live holder's pid."""
    out: list[str] = []
    if not noheader:
        out.append(_recorded(fixtures, "busy_apps.csv")[0])
    rows = _recorded(fixtures, f"busy_apps{'_nounits' if nounits else ''}.csv")
    for gpu, pid in sorted(holders.items()):
        row = next(ln for ln in rows if GPU_UUIDS[gpu] in ln and ln.startswith(RECORDED_PIDS[gpu]))
        out.append(f"{pid}," + row.split(",", 1)[1])
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
