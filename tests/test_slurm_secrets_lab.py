"""A Slurm job's secrets in `tail`, `logs` and `status` on the login node, against a real Slurm: the
job's own playbook (named in its record) is loaded when the run names another, and the node masks
the values before anything is sent, as for an SSH job (tests/test_node_text_lab.py)."""

from __future__ import annotations

import pytest
from conftest import run_fab
from slurmlogin import login_node_cluster
from test_node_text_lab import SECRET_CUT, pieces

pytestmark = [pytest.mark.lab, pytest.mark.root("slurmd runs job steps as root")]


@pytest.fixture(scope="module")
def cluster(lab_factory, slurm_tools, root_user, tmp_path_factory):
    yield from login_node_cluster(lab_factory, tmp_path_factory, "slurm-secrets")


def test_a_slurm_jobs_secret_is_masked_whatever_playbook_the_run_names(cluster):
    project = cluster["project"]
    book = ("--playbook", SECRET_CUT)
    submitted = run_fab(
        project, "-H", "login01", "extract", "--job", "leak", *book, "tail", timeout=600
    )
    assert submitted.returncode == 0 and "done" in submitted.stdout, (
        submitted.stdout + submitted.stderr
    )
    runs = {
        "extract tail": submitted,
        "tail": run_fab(project, "-H", "login01", "tail", "--from-start", timeout=300),
        "logs": run_fab(project, "-H", "login01", "logs"),
        "logs --json": run_fab(project, "-H", "login01", "logs", "--json"),
        "status": run_fab(project, "-H", "login01", "status", "--json"),
    }
    for name, proc in runs.items():
        out = proc.stdout + proc.stderr
        assert "Traceback" not in out, f"{name}: {out[-2000:]}"
        assert pieces(out) == [], f"{name} shows {pieces(out)} of the secret: {out[-2000:]}"
    for name in ("extract tail", "tail", "logs"):
        assert "short line: [secret]" in runs[name].stdout, f"{name}: {runs[name].stdout[-2000:]}"
