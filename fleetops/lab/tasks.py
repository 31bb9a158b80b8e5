"""The `fab lab.*` tasks (fabfile.py adds collection() as `lab`): bring the lab up and down, show it, reset
a node's packages, switch its simulated GPUs, install another package version on one node."""

from __future__ import annotations

import subprocess
from pathlib import Path

from invoke import Collection, task

from .common import LabError, say
from .gpu import GPU_STATES, SIMULATED_GPUS
from .lab import Lab


def _lab(c) -> Lab:
    root = (c.config.get("fleetops") or {}).get("root")  # set by fleetops.fab.executor: the fabfile's folder
    return Lab(Path(root) if root else Path.cwd())


@task(help={"nodes": "number of lab nodes (default 1)"})
def up(c, nodes=1):
    """Start the local lab: N real sshd nodes on 127.0.0.1 with real vllm 0.16.0 + speculators 0.3.0."""
    lab = _lab(c)
    try:
        started = lab.up(int(nodes))
    except (LabError, subprocess.CalledProcessError) as exc:
        raise SystemExit(f"lab.up failed: {exc}") from None
    for n in started:
        say(f"{n.name}: sshd on 127.0.0.1:{n.port} (pid {n.pid()}), python {n.python}")
    say(f"inventory: {lab.hosts_file}  (try: fab -H lab01 patch verify)")


@task
def status(c):
    """Show lab nodes: port, sshd pid, whether it listens."""
    lab = _lab(c)
    rows = lab.status()
    if not rows:
        say("no lab nodes (fab lab.up)")
    for r in rows:
        state = f"sshd pid {r['sshd_pid']}" if r["sshd_pid"] else "sshd stopped"
        listening = "listening" if r["listening"] else "not listening"
        say(f"{r['name']}: 127.0.0.1:{r['port']} {state}, {listening}; python {r['python']}; "
            f"GPUs: simulated {SIMULATED_GPUS}x H200 (replayed nvidia-smi recordings), state {r['gpus']}")


@task(help={"purge": "also delete the lab's files (keys, node venvs, state)"})
def down(c, purge=False):
    """Stop the lab's sshd processes (only those it started)."""
    stopped = _lab(c).down(purge=purge)
    say(f"stopped: {', '.join(stopped) or 'nothing running'}")


@task(help={"node": "lab node name, or 'all'"})
def reset(c, node="all"):
    """Give lab nodes pristine speculators files again (as installed from PyPI)."""
    lab = _lab(c)
    for n in lab.nodes():
        if node in ("all", n.name):
            lab.reset_packages(n)
            say(f"{n.name}: packages reset")


@task(help={"state": f"one of {', '.join(GPU_STATES)}", "node": "lab node name, or 'all'"})
def gpu(c, state="idle", node="all"):
    """Switch a lab node's simulated GPUs: idle, busy (a real held process), missing GPU, driver error, absent."""
    lab = _lab(c)
    for n in lab.nodes():
        if node in ("all", n.name):
            try:
                config = lab.set_gpu_state(n, state)
            except LabError as exc:
                raise SystemExit(str(exc)) from None
            held = f" (held by pids {', '.join(map(str, config['holder_pids']))})" if config["holder_pids"] else ""
            say(f"{n.name}: simulated GPUs now {state}{held}")


@task(help={"node": "lab node name", "package": "a pinned requirement, e.g. vllm==0.11.0"})
def install(c, node, package):
    """Give one lab node another real version of a package (no deps), e.g. to see a refused patch."""
    lab = _lab(c)
    lab.install_package(lab.node(node), package)
    say(f"{node}: installed {package} (shadows the shared venv's copy; `fab lab.reset` restores speculators)")


def collection() -> Collection:
    return Collection(up, status, down, reset, gpu, install)
