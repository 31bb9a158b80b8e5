"""A stand-in `nvidia-smi` for lab nodes, clearly simulated: it replays real output recorded on a 2×H200
machine (tests/fixtures/nvidia-smi/h200x2) according to the node's gpu.json state:

  idle          both GPUs free
  busy          a real process started by `fab lab.gpu --state busy` holds them (its pid replaces the
                recorded pids, so the node's process table has user, age and command for it)
  missing       GPU 1 is gone from every answer
  driver_error  nvidia-smi fails the way a driver/library mismatch makes it fail

Installed by the lab as <node>/bin/nvidia-smi; never used outside the lab.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent  # <node>/bin
RECORDED_PIDS = ("580", "581")


def main(argv: list[str]) -> int:
    config = json.loads((HERE.parent / "gpu.json").read_text())
    state, fixtures = config["state"], Path(config["fixtures"])
    if state == "driver_error":
        print("Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.159")
        return 18
    phase = "busy" if state == "busy" else "idle"
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
    holders = [str(p) for p in config.get("holder_pids", [])]
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
