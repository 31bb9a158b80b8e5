"""A lab node's simulated GPUs: the state in <node>/gpu.json, the nvidia-smi stand-in
(nvidia_smi.py) in <node>/bin, and the real processes that hold the GPUs in the busy state.

The stand-in replays nvidia-smi output recorded on a 2×H200 machine, shipped with this package in
recordings/h200x2/ (copies of the files it reads from tests/fixtures/nvidia-smi/h200x2, so an
installed fleetops needs no checkout)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from ..agent.core.procfs import read, stat_fields
from . import kernel_log
from .common import LabError
from .node import Node

GPU_STATES = ("idle", "busy", "missing", "driver_error", "absent")
# lab/nvidia_smi.py (run standalone on the node) holds a copy
HOLDER_MARK = "fleetops-lab-gpu-holder"
SIMULATED_GPUS = 2  # the recordings come from a 2×H200 machine
RECORDINGS = Path(__file__).resolve().parent / "recordings" / "h200x2"


def gpu_fixtures() -> Path:
    """The recorded nvidia-smi output the nodes' stand-in replays (package data)."""
    return RECORDINGS


def gpu_state(node: Node) -> dict:
    try:
        return json.loads((node.dir / "gpu.json").read_text())
    except (OSError, ValueError):
        return {"state": "absent", "holder_pids": []}


def set_gpu_state(node: Node, state: str) -> dict:
    if state not in GPU_STATES:
        raise LabError(f"unknown GPU state {state!r}; one of {', '.join(GPU_STATES)}")
    stop_holders(node)
    smi = node.dir / "bin" / "nvidia-smi"
    smi.parent.mkdir(parents=True, exist_ok=True)
    kernel_log.install(node)  # the simulated dmesg/journalctl sit next to the simulated nvidia-smi
    if state == "absent":
        smi.unlink(missing_ok=True)
    else:
        source = (Path(__file__).parent / "nvidia_smi.py").read_text()
        smi.write_text(f"#!{node.python}\n{source}")
        smi.chmod(0o755)
    holders = []
    if state == "busy":
        for _ in range(SIMULATED_GPUS):
            proc = subprocess.Popen(
                [str(node.python), "-c", f"import time  # {HOLDER_MARK}\ntime.sleep(86400)"],
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            holders.append(proc.pid)
    config = {
        "state": state,
        "fixtures": str(gpu_fixtures()),
        "holder_pids": holders,
        "state_dir": str(node.state_dir),
    }
    (node.dir / "gpu.json").write_text(json.dumps(config) + "\n")
    return config


def stop_holders(node: Node) -> None:
    killed = []
    for pid in gpu_state(node).get("holder_pids", []):
        try:
            if HOLDER_MARK.encode() in (read(pid, "cmdline") or b""):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        except OSError:
            pass
    # The simulated GPU frees a holder's memory only once the process is really gone (dead or a
    # zombie), as a driver does; wait for that so a state switch is complete when this returns.
    deadline = time.monotonic() + 30
    for pid in killed:
        try:
            os.waitpid(pid, 0)  # ours when this process started it (tests): reap it
            continue
        except ChildProcessError:
            pass
        while time.monotonic() < deadline:
            fields = stat_fields(pid)
            if fields is None or fields[0] in "ZX":
                break
            time.sleep(0.02)
