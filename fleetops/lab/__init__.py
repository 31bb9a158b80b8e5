"""The local lab: real OpenSSH sshd nodes on 127.0.0.1, each with its own host key, state directory
and venv holding real vllm 0.16.0 + speculators 0.3.0 (heavy packages shared, speculators files per
node).

Lab nodes are how anyone tries fleetops without a fleet, and what the tests run against. The parts:
common.py (base venv, ports, LabError), node.py (one node's files), lab.py (Lab: bring up, restore,
stop), sshd.py (a node's sshd config, start, stop), keys.py (ssh keys, known_hosts), inventory.py
(hosts/lab.yaml, .gitignore), packages.py (a node's venv and packages), tiny_model.py (the extract
model, copied to each node), files.py (removing, emptying, mirroring the lab's directories), gpu.py
(simulated GPUs; nvidia_smi.py is the stand-in copied to each node, replaying recordings/h200x2/),
model.py (the tiny model for `extract`, run by the base venv's python), tasks.py (the `fab lab.*`
tasks). Everything tests, bench/ and fabfile.py use is importable from here.
"""

from __future__ import annotations

from ..agent.core.procfs import pid_alive, stat_fields
from .common import (
    NODE_PACKAGES,
    OWN_PACKAGES,
    LabError,
    base_dir,
    ensure_base,
    free_port,
    port_open,
    say,
    site_packages,
)
from .gpu import GPU_STATES, HOLDER_MARK, RECORDINGS, SIMULATED_GPUS, gpu_fixtures
from .lab import SSHD, Lab
from .node import Node
from .tasks import collection

__all__ = [
    "GPU_STATES",
    "HOLDER_MARK",
    "NODE_PACKAGES",
    "OWN_PACKAGES",
    "RECORDINGS",
    "SIMULATED_GPUS",
    "SSHD",
    "Lab",
    "LabError",
    "Node",
    "base_dir",
    "collection",
    "ensure_base",
    "free_port",
    "gpu_fixtures",
    "pid_alive",
    "port_open",
    "say",
    "site_packages",
    "stat_fields",
]
