"""What an openssh run of a host task does not import: the SSH code only paramiko needs, and the
result classes and report parts of the task families it does not run (the jobs' and diagnose's
dataclasses, rich's progress bars, and rich.table, which a one-host run does not draw). Each of
these was imported by every run's start, client CPU before the first byte went out. The same run
of `diagnose` loads its family: what the harness would see if the others did."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from clientprobe import fleet_imports, loopback_project, run_python, ssh_code

# what a run of ping or patch does not need
NOT_IMPORTED = (
    "fleetops.results.jobs",
    "fleetops.results.diagnose",
    "fleetops.tasks.jobs",
    "fleetops.tasks.diagnose",
    "fleetops.plans.jobspec",  # a playbook's jobs: a run that reads no playbook reads none
    "rich.progress",
    "rich.live",
    "rich.table",
)


def _openssh_run(words: list[str], root: Path) -> tuple[str, set[str]]:
    control = tempfile.mkdtemp(prefix="fo-l-", dir="/tmp")  # 0700, short enough for a socket
    try:
        proc, names = fleet_imports(
            ["fleet", "-H", "n1", *words],
            loopback_project(root),
            {"FLEETOPS_TRANSPORT": "openssh", "FLEETOPS_CONTROL_DIR": control},
        )
    finally:
        for name in os.listdir(control):
            os.unlink(os.path.join(control, name))
        os.rmdir(control)
    # nothing listens on 127.0.0.1:9: the whole run, its connection attempt and report included
    assert proc.returncode in (4, 22), proc.stdout + proc.stderr[-2000:]
    assert "n1 | " in proc.stdout and "unreachable" in proc.stdout, proc.stdout
    assert "fleetops.wire.openssh" in names
    return proc.stdout, names


def _loaded(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == m or n.startswith(m + ".") for m in NOT_IMPORTED))


@pytest.mark.parametrize("words", [["ping"], ["facts"]], ids=" ".join)
def test_an_openssh_run_loads_no_other_familys_results_and_no_ssh_code(words, tmp_path):
    _, names = _openssh_run(words, tmp_path)
    assert ssh_code(names) == []
    assert _loaded(names) == []


def test_a_run_of_diagnose_loads_its_family(tmp_path):
    _, names = _openssh_run(["diagnose"], tmp_path)
    assert {"fleetops.results.diagnose", "fleetops.tasks.diagnose"} <= set(_loaded(names))


def test_planning_a_deferred_task_registers_its_payload_kind():
    """A host that never answered still has its task's payload kind (shape_of): planning the task
    imports the result class its declaration names, in a process that had not."""
    probe = (
        "import sys\nfrom fleetops.results import Result, Status, shape_of\n"
        "from fleetops.tasks.registry import plan_for\n"
        "r = Result('n1', 'jobs', Status.UNREACHABLE, 'no route')\n"
        "print('fleetops.results.jobs' in sys.modules, shape_of(r))\n"
        "plan_for(None, 'jobs', {'last': '0'})\n"
        "print(shape_of(r).__name__)\n"
    )
    proc = run_python("-c", probe)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "None", "JobList"], proc.stdout
