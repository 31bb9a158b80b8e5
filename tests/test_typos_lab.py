"""Typos and wrong values against the real lab: a node name that is not the lab's names the lab's
nodes; a job id pasted with a blank after it is the job id."""

from __future__ import annotations

import pytest
from conftest import fab_json, run_fab

pytestmark = pytest.mark.lab


@pytest.mark.parametrize("task", ["lab.gpu", "lab.kernel"])
def test_a_lab_node_that_does_not_exist_names_the_labs_nodes(lab, task):
    proc = run_fab(lab.root, task, "--node", "lab09")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{task} --node 'lab09': no lab node 'lab09'" in proc.stderr, proc.stderr
    assert "(lab nodes: lab01, lab02; or all)" in proc.stderr, proc.stderr
    assert "simulated" not in proc.stdout, proc.stdout  # nothing was switched


def test_a_job_id_with_a_trailing_blank_is_the_job_id(lab):
    rc, doc = fab_json(lab.root, "-H", "lab01", "status", "--job-id", "nosuch ")
    msg = doc["results"][0]["msg"]
    assert "bad job id" not in msg and "'nosuch'" in msg, msg
