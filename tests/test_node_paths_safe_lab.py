"""Local paths a node's answer names never leave the operator's folder: `rebase` and `capture`
against a hostile node (tests/hostile_node_agent.py behind lab01's sshd) that answers with a version
and module names full of `../`. The playbook folder sits eight levels down a scratch tree with an
`outside/` folder at every level, so any escape lands where the test sees it; nothing may be written
anywhere, and the error is one line.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import GENERATOR, REPO, WORKER, run_fab
from hostile_hosts import hostile_inventory

pytestmark = pytest.mark.lab

SHIPPED = "speculators-0.3.0-vllm-0.16.yaml"
# The backup names the hostile script reads its pristine files from (as fleetops names them on a
# node).
BACKUPS = {
    GENERATOR: "a388f645ffeaa395-vllm_hidden_states_generator.py.orig",
    WORKER: "309956783d44b712-custom_worker.py.orig",
}


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")
    }


def _scratch(lab, root: Path, mode: str) -> tuple[Path, Path]:  # fleetops.lab.Lab
    """(the playbook folder, the inventory with host evil01 answering in `mode`)."""
    deep = root.joinpath(*"abcdefgh")
    for level in [root, *deep.parents, deep]:
        if root in (level, *level.parents):
            (level / "outside").mkdir(parents=True, exist_ok=True)
    books = deep / "playbooks"
    shutil.copytree(REPO / "playbooks", books)
    backups = root / "backups"
    backups.mkdir()
    node = lab.node("lab01")
    for module, name in BACKUPS.items():
        # lab01 is pristine (the lab fixture resets it)
        shutil.copy(node.module_file(module), backups / name)
    inventory = hostile_inventory(
        lab, root / "hostile", {"evil01": mode}, env={"LAB01_BACKUPS": str(backups)}
    )
    return books, inventory


def _one_failed_line(proc, task: str) -> str:  # CompletedProcess
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out and "internal error" not in out, out[
        -3000:
    ]
    lines = [
        line for line in proc.stdout.splitlines() if line.startswith(f"evil01 | {task} | failed |")
    ]
    assert len(lines) == 1, out[-3000:]
    return lines[0]


def test_rebase_with_a_node_chosen_version_of_dotdots_writes_nothing(lab, tmp_path_factory):
    root = tmp_path_factory.mktemp("paths")
    books, inventory = _scratch(lab, root, "rebase")
    before = _tree(root)
    proc = run_fab(
        lab.root,
        "-H",
        "evil01",
        "rebase",
        "-p",
        str(books / SHIPPED),
        "--inventory",
        str(inventory),
        timeout=300,
    )
    assert _tree(root) == before, sorted(set(_tree(root)) - set(before))
    line = _one_failed_line(proc, "rebase")
    assert (
        "../../../../../outside/PWNED-rebase" in line
        and "not a version" in line
        and "nothing written" in line
    )


def test_capture_with_node_chosen_module_names_of_dotdots_writes_nothing(lab, tmp_path_factory):
    root = tmp_path_factory.mktemp("paths")
    books, inventory = _scratch(lab, root, "capture")
    before = _tree(root)
    proc = run_fab(
        lab.root,
        "-H",
        "evil01",
        "capture",
        "--module",
        WORKER,
        "--playbook",
        str(books / "cap.yaml"),
        "--inventory",
        str(inventory),
        timeout=300,
    )
    assert _tree(root) == before, sorted(set(_tree(root)) - set(before))
    line = _one_failed_line(proc, "capture")
    assert "outside/CAPTURED" in line and "not asked for" in line and "nothing written" in line, (
        line
    )
