"""`fab lab.up --nodes N` leaves exactly N lab nodes: on a lab of 4, `--nodes 3` stops and removes
lab04 (its sshd gone, its port closed, out of the inventory); `lab.up` without --nodes keeps the
lab's size; a --nodes that is not a number of nodes is a usage error."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

from fleetops.lab.common import port_open

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab4(lab_factory):
    # shrinks: a restore of the shared 4-node lab would regrow it
    with lab_factory.own("up-exact", 4) as lab:
        yield lab


def lab_task(lab, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args],
        cwd=lab.root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )


def test_lab_up_nodes_3_on_a_lab_of_4_leaves_3(lab4):
    lab = lab4
    fourth = lab.node("lab04")
    assert fourth.running() and port_open(fourth.port)
    proc = lab_task(lab, "lab.up", "--nodes", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [n.name for n in lab.nodes()] == ["lab01", "lab02", "lab03"]
    assert "lab04" not in lab.hosts_file.read_text() and "lab03" in lab.hosts_file.read_text()
    assert not port_open(fourth.port) and not fourth.dir.exists()
    assert all(n.running() for n in lab.nodes())

    same = lab_task(lab, "lab.up")  # no --nodes: the lab's own size
    assert same.returncode == 0, same.stdout + same.stderr
    assert [n.name for n in lab.nodes()] == ["lab01", "lab02", "lab03"]

    bad = lab_task(lab, "lab.up", "--nodes", "abc")
    assert bad.returncode == 2 and "lab.up --nodes 'abc'" in bad.stderr + bad.stdout, (
        bad.stdout + bad.stderr
    )
    assert "Traceback" not in bad.stdout + bad.stderr
