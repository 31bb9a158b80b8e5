"""A real one-node Slurm (fleetops/lab/slurm.py) with a lab of the module's own whose lab01 is the
cluster's login node in hosts/slurm.yaml (`scheduler: slurm`, partition, gres gpu:1, time limit):
the set-up of the modules that run jobs through sbatch. The daemons stop at the end, and no process
of the cluster may outlive it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from fleetops.lab.slurm import SlurmLab


def login_node_cluster(lab_factory, tmp_path_factory, lab_name: str) -> Iterator[dict]:
    """For a module fixture to `yield from` (it names lab_factory, slurm_tools and root_user, whose
    marks the tests need): {"project", "lab", "slurm", "node"}."""
    # A lab of its own: its inventory gains the Slurm login node, and the cluster's daemons run as
    # root.
    slurm = SlurmLab(tmp_path_factory.mktemp("slurm") / "cluster")
    stopped = None
    try:
        with lab_factory.own(lab_name, 1) as lab:
            try:
                slurm.up()
                project, node = lab.root, lab.node("lab01")
                write_inventory(project / "hosts" / "slurm.yaml", lab, node, slurm)
                yield {"project": project, "lab": lab, "slurm": slurm, "node": node}
            finally:
                stopped = slurm.down()
    finally:
        assert slurm.leftovers() == [], "a process of the test's Slurm outlived it"
        assert all(slurm.running(d) is None for d in ("munged", "slurmctld", "slurmd")), stopped


def write_inventory(path: Path, lab, node, slurm: SlurmLab) -> None:
    path.write_text(
        "\n".join(
            [
                "# The lab's Slurm login node: lab01's sshd, jobs through the cluster in "
                + str(slurm.root),
                "defaults:",
                "  address: 127.0.0.1",
                f"  user: {lab.user}",
                f"  identity_file: {lab.client_key}",
                f"  known_hosts: {lab.known_hosts}",
                "  lab: true",
                "hosts:",
                "  login01:",
                f"    port: {node.port}",
                f"    python: {node.python}",
                f"    state_dir: {node.state_dir}",
                "    groups: [lab]",
                "    scheduler: slurm",
                "    partition: gpu",
                "    gres: gpu:1",
                '    time_limit: "00:30:00"',
                "    env:",
                f"      SLURM_CONF: {slurm.conf}",
                "",
            ]
        )
    )
