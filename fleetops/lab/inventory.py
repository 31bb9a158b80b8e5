"""What `lab.up` writes into the project besides .lab/: the inventory naming the nodes
(hosts/lab.yaml), and the .gitignore lines that keep the lab's files (its keys among them) and
fleetops' own out of the project's git."""

from __future__ import annotations

from pathlib import Path

from . import gpu
from .node import Node

# What the lab and fleetops write into a project (the lab's keys among them): kept out of the
# project's git.
GIT_IGNORED = (".lab/", "hosts/lab.yaml", ".fleetops/", "fetched/", "fleet.ssh_config")


def write_inventory(
    path: Path, user: str, client_key: Path, known_hosts: Path, nodes: list[Node]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    out = [
        (
            "# Written by `fab lab.up`: the local lab (real "
            "sshd on 127.0.0.1). Regenerated on every lab.up."
        ),
        "defaults:",
        "  address: 127.0.0.1",
        f"  user: {user}",
        f"  identity_file: {client_key}",
        f"  known_hosts: {known_hosts}",
        "  lab: true",
        "  connect_timeout: 5",
        "hosts:",
    ]
    for node in nodes:
        out += [
            f"  {node.name}:",
            f"    port: {node.port}",
            f"    python: {node.python}",
            f"    state_dir: {node.state_dir}",
            f"    gpus: {gpu.SIMULATED_GPUS}",
            "    groups: [lab]",
        ]
    path.write_text("\n".join(out) + "\n")


def git_ignore(root: Path) -> None:
    """A project that is a git work tree gets the lines of GIT_IGNORED its .gitignore lacks (nothing
    else is touched; a project outside git gets no file)."""
    if not (root / ".git").exists():
        return
    path = root / ".gitignore"
    text = path.read_text() if path.exists() else ""
    missing = [p for p in GIT_IGNORED if p not in text.splitlines()]
    if missing:
        lead = "" if not text or text.endswith("\n") else "\n"
        path.write_text(
            text
            + lead
            + "# written by fab lab.up: the lab's files and what fleetops writes here\n"
            + "".join(f"{p}\n" for p in missing)
        )
