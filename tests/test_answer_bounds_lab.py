"""Bounded work per answer, against a real lab node's sshd whose `python` answers every request with
millions of values in one line (tests/hostile_node_agent.py, mode `wide`, under the 32 MiB line
cap): every task that turns a node's answer into objects (facts, gpu tables, pins, status, tail,
fetch manifests, diagnose findings...) gets it refused unread in one line naming the host and the
cause, and the client's CPU for the whole run stays under a second (json.loads alone would take
about that for one such line, and each parser after it more)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO
from hostile_hosts import hostile_inventory

pytestmark = pytest.mark.lab

TASKS = [
    ("facts",),
    ("gpu",),
    ("ping",),
    ("verify",),
    ("patch", "--check"),
    ("status",),
    ("jobs",),
    ("tail",),
    ("logs",),
    ("fetch", "--path", "x"),
    ("diagnose",),
    ("run", "true"),
    ("rollback", "--check"),
]
CPU = (
    "import resource, subprocess, sys\n"
    "proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "use = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "sys.stdout.write(proc.stdout + f'\\nCPU {use.ru_utime + use.ru_stime:.2f}\\n')\n"
    "sys.stderr.write(proc.stderr)\n"
)


def _fab_cpu(lab, *args: str) -> tuple[str, float]:
    """fab's whole output and the CPU seconds (user + system) it used, start-up and SSH included."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-c", CPU, sys.executable, "-m", "fabric", *args],
        cwd=lab.root,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    out = done.stdout + done.stderr
    return out, float(done.stdout.strip().splitlines()[-1].split()[1])


@pytest.mark.parametrize("task", TASKS, ids=[" ".join(t) for t in TASKS])
def test_an_answer_of_millions_of_values_is_refused_in_one_line_with_the_client_cpu_bounded(
    lab, tmp_path, task
):
    inventory = str(hostile_inventory(lab, tmp_path / "hostile", {"evil01": "wide"}))
    out, cpu = _fab_cpu(lab, "-H", "evil01", *task, "--inventory", inventory)
    assert "Traceback" not in out, out[-3000:]
    said = [line for line in out.splitlines() if "holds more than 4,000,000 values" in line]
    assert said and said[0].startswith("evil01 | ") and "refused unread" in said[0], out[-3000:]
    # one host's line (and detail)
    assert all(line.startswith((" ", "evil01 | ")) for line in said), out[-3000:]
    assert cpu < 1.0, f"{' '.join(task)}: the client used {cpu:.2f} s of CPU\n{out[-2000:]}"
