"""Draining a node that is also a Slurm node, against a real one-node Slurm (fleetops/lab/slurm.py:
Debian's munged, slurmctld and slurmd, run as root in a temp directory): a lab sshd node named in
the inventory with `slurm_node` is drained in Slurm too (Slurm's own view: sinfo and scontrol say
DRAIN, with the reason), and undrain resumes it there; a Slurm node name Slurm does not know fails
the drain, with the command to run by hand, while fleetops' own mark stands."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from conftest import REPO, fab_json, run_fab

from fleetops.lab.slurm import SlurmLab

pytestmark = [pytest.mark.lab, pytest.mark.root("slurmd runs as root")]
JOBS = str(REPO / "tests" / "playbooks" / "jobs.yaml")


@pytest.fixture(scope="module")
def cluster(slurm_tools, root_user, tmp_path_factory):
    slurm = SlurmLab(tmp_path_factory.mktemp("slurm") / "cluster")
    try:
        slurm.up()
        yield slurm
    finally:
        slurm.down()
        assert slurm.leftovers() == [], "a process of the test's Slurm outlived it"


@pytest.fixture
def slurm_hosts(lab, cluster):
    """hosts/slurm-nodes.yaml: lab01's sshd as `gpu01`, the cluster's node, as `ghost01`, a node
    Slurm does not know, and as `login01`, the cluster's login node (jobs through sbatch)."""
    node = lab.node("lab01")
    lines = [
        "defaults:",
        "  address: 127.0.0.1",
        f"  user: {lab.user}",
        f"  identity_file: {lab.client_key}",
        f"  known_hosts: {lab.known_hosts}",
        "  lab: true",
        f"  port: {node.port}",
        f"  python: {node.python}",
        f"  state_dir: {node.state_dir}",
        "  env:",
        f"    SLURM_CONF: {cluster.conf}",
        "hosts:",
        "  gpu01:",
        f"    slurm_node: {cluster.node}",
        "  ghost01:",
        "    slurm_node: ghost01",
        "  login01:",
        "    scheduler: slurm",
        "    partition: gpu",
        "",
    ]
    path = lab.root / "hosts" / "slurm-nodes.yaml"
    path.write_text("\n".join(lines))
    yield lab
    path.unlink(missing_ok=True)
    (node.state_dir / "drain.json").unlink(missing_ok=True)
    subprocess.run(
        ["scontrol", "update", f"nodename={cluster.node}", "state=resume"],
        capture_output=True,
        env={**os.environ, **cluster.env},
        timeout=60,
    )


def scontrol_node(cluster: SlurmLab) -> str:
    return subprocess.run(
        ["scontrol", "show", "node", cluster.node],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **cluster.env},
    ).stdout


def test_drain_and_undrain_a_slurm_node_in_slurm_too(slurm_hosts, cluster):
    lab = slurm_hosts
    rc, doc = fab_json(lab.root, "-H", "gpu01", "drain", "--reason", "Xid 79 on GPU 1")
    res = doc["results"][0]
    assert rc == 0 and res["status"] == "changed", res
    shown = scontrol_node(cluster)  # Slurm's own view, not through fleetops
    assert "DRAIN" in shown and "Reason=Xid 79 on GPU 1" in shown, shown
    assert cluster.node_state().lower().startswith("drain"), cluster.node_state()
    assert any(
        i["label"] == "slurm" and f"Slurm node {cluster.node}: drain" in i["msg"]
        for i in res["items"]
    ), res
    assert (lab.node("lab01").state_dir / "drain.json").exists()

    rc, doc = fab_json(lab.root, "-H", "gpu01", "undrain")
    assert rc == 0 and doc["results"][0]["status"] == "changed", doc
    shown = scontrol_node(cluster)
    assert "DRAIN" not in shown and cluster.node_state().lower().startswith("idle"), shown
    assert not (lab.node("lab01").state_dir / "drain.json").exists()


def test_a_slurm_refusal_fails_the_drain_and_names_the_command(slurm_hosts, cluster):
    lab = slurm_hosts
    proc = run_fab(lab.root, "-H", "ghost01", "drain", "--reason", "bad fan")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "but Slurm refused to drain node ghost01" in proc.stdout, proc.stdout
    by_hand = "scontrol update nodename=ghost01 state=drain 'reason=bad fan'"
    assert re.search(r"next:.*\n\s+" + re.escape(by_hand) + r"\n", proc.stdout), proc.stdout
    assert (lab.node("lab01").state_dir / "drain.json").exists()  # fleetops' own mark stands
    assert "DRAIN" not in scontrol_node(cluster)


def test_a_drained_login_node_submits_nothing(slurm_hosts, cluster):
    lab = slurm_hosts
    assert (
        run_fab(lab.root, "-H", "login01", "drain", "--reason", "cluster maintenance").returncode
        == 0
    )
    proc = run_fab(lab.root, "-H", "login01", "extract", "--job", "numbers", "--playbook", JOBS)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "refused to submit numbers: login01 is drained" in proc.stdout, proc.stdout
    assert re.search(r"next:.*\n\s+" + re.escape("fab -H login01 undrain") + r"\n", proc.stdout), (
        proc.stdout
    )
    queue = subprocess.run(
        ["squeue", "--noheader"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **cluster.env},
    )
    # nothing reached sbatch
    assert queue.returncode == 0 and queue.stdout.strip() == "", queue.stdout
