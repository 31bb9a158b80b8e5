#!/usr/bin/env python3
"""Real-GPU smoke test of the `gpu` node operation (not run by CI: it needs NVIDIA GPUs and torch).

Runs the node agent exactly as `fab -H node gpu` does over SSH (JSON request on stdin, JSON answer
on stdout), but locally against the real nvidia-smi:
  1. idle: every GPU free;
  2. a process allocates 20 GiB on GPU 0: that GPU busy, the process listed with its pid and MiB;
  3. that process stopped: GPU 0 free again.
Usage: python3 scripts/gpu-smoke.py   (from the repository root)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (stdlib-only modules: no fabric needed here)
from fleetops.plans.gpugate import Gate, evaluate  # noqa: E402
from fleetops.plans.tables import gpu_rows  # noqa: E402

HOLD_GIB = 20
HOLDER = (
    "import time, torch\n"
    f"x = torch.empty({HOLD_GIB} * 2**30, dtype=torch.uint8, device='cuda:0')\n"
    "x.fill_(1); torch.cuda.synchronize(); print('held', flush=True); time.sleep(600)\n"
)


def snapshot(state_dir: str) -> dict:
    req = json.dumps({"protocol": 1, "op": "gpu", "state_dir": state_dir})
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "remote_scripts")],
        input=req,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        sys.exit(f"agent failed ({proc.returncode}): {proc.stderr}")
    answer = json.loads(proc.stdout)
    answer["_took_s"] = round(time.monotonic() - started, 3)
    return answer


def show(title: str, answer: dict) -> object:
    verdict = evaluate(answer, Gate())
    print(f"== {title}: gate exit {verdict.code}: {verdict.msg}  (agent exec {answer['_took_s']}s)")
    for row in gpu_rows(verdict):
        print("   ", " | ".join(row).replace("\n", " ; "))
    for holder in verdict.holders:
        print("    holder:", holder)
    return verdict


def main() -> int:
    failures = []
    with tempfile.TemporaryDirectory() as state:
        v = show("1 idle", snapshot(state))
        if v.code != 0:
            failures.append("GPUs not free at start (another user?)")
        holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None
        line = holder.stdout.readline().strip()
        if line != "held":
            holder.kill()
            return print("holder process could not allocate GPU memory") or 2
        answer = snapshot(state)
        v = show(f"2 busy: pid {holder.pid} holds {HOLD_GIB} GiB on GPU 0", answer)
        gpu0 = next(g for g in answer["gpus"] if g["index"] == 0)
        procs = {p["pid"]: p for p in gpu0["processes"]}
        if v.code != 10:
            failures.append(f"expected busy (exit 10), got {v.code}")
        if holder.pid not in procs:
            failures.append(
                f"holder pid {holder.pid} not listed on GPU 0 (listed: {sorted(procs)})"
            )
        elif (procs[holder.pid]["used_mib"] or 0) < HOLD_GIB * 1024:
            failures.append(
                f"holder listed with {procs[holder.pid]['used_mib']} "
                f"MiB, expected >= {HOLD_GIB * 1024}"
            )
        holder.terminate()
        holder.wait(timeout=60)
        deadline = time.monotonic() + 30
        while True:
            answer = snapshot(state)
            if evaluate(answer, Gate()).code == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        v = show("3 after the holder stopped", answer)
        if v.code != 0:
            failures.append("GPU 0 not free again within 30 s")
    print("RESULT:", "PASS" if not failures else "FAIL: " + "; ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
