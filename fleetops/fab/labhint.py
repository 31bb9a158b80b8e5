"""`fleet lab.*` where the lab is not installed: the lab is a wheel of its own (fleetops-lab), for
trying fleetops on local nodes, so an installed fleetops may run without it. Each lab task is then a
stand-in that says how to add it, instead of Invoke's "No idea what 'lab.up' is!"."""

from __future__ import annotations

from invoke import Collection, Task
from invoke.exceptions import Exit

from ..results import EXIT_USAGE

# The lab's tasks, as fleetops/lab/tasks.py's collection() names them
# (tests/test_wheel_contents_lab.py holds the two to the same names).
LAB_TASKS = (
    "up",
    "status",
    "down",
    "reset",
    "gpu",
    "install",
    "build-base",
    "kernel",
    "stop",
    "start",
    "rekey",
    "slurm",
)
HOW = (
    "the lab is not installed with this fleetops: it is a wheel of its own (fleetops-lab), for "
    "trying fleetops on local nodes. In a clone of fleetops, scripts/build makes it beside "
    "fleetops' wheel; then `pipx inject fleetops dist/fleetops_lab-*.whl` (or `pip install "
    "dist/fleetops_lab-*.whl` in fleetops' venv)"
)


def missing_lab() -> Collection:
    """A `lab` collection whose every task says how to install the lab, and exits 2."""

    def stand_in(c: object) -> None:
        raise Exit(HOW, code=EXIT_USAGE)

    lab = Collection()
    for name in LAB_TASKS:
        lab.add_task(Task(stand_in, name=name, help={}), name=name)
    return lab
