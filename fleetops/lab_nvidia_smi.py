"""A stand-in `nvidia-smi` for lab nodes, clearly simulated: it replays real output recorded on a 2×H200
machine (tests/fixtures/nvidia-smi/h200x2) according to the node's gpu.json state:

  idle          both GPUs free
  busy          a real process started by `fab lab.gpu --state busy` holds them (its pid replaces the
                recorded pids, so the node's process table has user, age and command for it)
  missing       GPU 1 is gone from every answer
  driver_error  nvidia-smi fails the way a driver/library mismatch makes it fail
While a fleetops job runs on the node (and the state is idle), GPU 0 answers as the recorded busy GPU 0,
held by the job's process, so `gpu`, `extract`'s gate and `stop` see a job on the GPU as they would.

Installed by the lab as <node>/bin/nvidia-smi; never used outside the lab.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent  # <node>/bin
RECORDED_PIDS = ("580", "581")


def running_job_pid(state_dir: str | None) -> int | None:
    if not state_dir:
        return None
    try:
        current = json.loads((Path(state_dir) / "jobs" / "current.json").read_text())
        job_dir = Path(state_dir) / "jobs" / current["id"]
        if (job_dir / "exit.json").exists():
            return None
        pid = int(json.loads((job_dir / "job.json").read_text())["pid"])
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return pid if stat[0] != "Z" else None
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def main(argv: list[str]) -> int:
    config = json.loads((HERE.parent / "gpu.json").read_text())
    state, fixtures = config["state"], Path(config["fixtures"])
    job_pid = running_job_pid(config.get("state_dir")) if state == "idle" else None
    if state == "driver_error":
        print("Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.159")
        return 18
    phase = "busy" if state == "busy" or job_pid else "idle"
    args = " ".join(argv)
    nounits = "nounits" in args
    if "--query-gpu" in args:
        name = f"{phase}_query{'_nounits' if nounits else ''}.csv"
    elif "--query-compute-apps" in args:
        name = f"{phase}_apps{'_nounits' if nounits and phase == 'busy' else ''}.csv"
    elif "-q" in argv:
        name = "busy_q.xml"
    else:
        name = f"{phase}_table.txt"
    lines = [ln for ln in (fixtures / name).read_text().splitlines() if not ln.startswith("rc=")]
    if "noheader" in args and lines and lines[0].startswith(("index", "pid")):
        lines = lines[1:]
    holders = [str(p) for p in config.get("holder_pids", [])] or ([str(job_pid)] if job_pid else [])
    if job_pid:  # only GPU 0 is the job's: GPU 1 answers as idle
        idle_name = "idle_apps.csv" if "apps" in name else name.replace("busy", "idle")
        idle = [ln for ln in (fixtures / idle_name).read_text().splitlines() if not ln.startswith("rc=")]
        gpu1_idle = [ln for ln in idle if "GPU-96672edd" in ln and not ln.startswith("pid")]
        lines = [ln for ln in lines if "GPU-96672edd" not in ln and not ln.startswith("1,")] + \
            [ln for ln in gpu1_idle if "--query-gpu" in args]
    out = []
    for line in lines:
        if state == "missing" and ("GPU-96672edd" in line or line.startswith("1,")):
            continue
        for recorded, real in zip(RECORDED_PIDS, holders):
            line = line.replace(f"{recorded},", f"{real},", 1) if line.startswith(recorded) else line
        out.append(line)
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
