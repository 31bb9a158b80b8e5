"""The suite's lab factory (tests/conftest.py, LabFactory) and what it rests on
(fleetops.lab.Lab.restore, reset_packages): a lab of a given size is built once per run and handed
from module to module; what one user did to its nodes and its project, the next does not see; the
restore puts files back, it reinstalls nothing (a file that was not touched keeps its inode), and it
is quick."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest
from conftest import REPO, fab_json, run_fab

from fleetops.lab import base_dir, site_packages

pytestmark = pytest.mark.lab
GENERATOR = "speculators.data_generation.vllm_hidden_states_generator"
WORKER = "speculators.data_generation.custom_worker"


def tree(root: Path) -> dict[str, tuple[str, int]]:
    """relative path -> (sha256, mode) of every file under root, bytecode left out."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            out[str(path.relative_to(root))] = (
                hashlib.sha256(path.read_bytes()).hexdigest(),
                path.stat().st_mode,
            )
    return out


def pristine(node) -> dict[str, tuple[str, int]]:  # fleetops.lab.Node
    site = site_packages(node.venv)
    return {name: value for name, value in tree(site).items() if name.startswith("speculators")}


def test_a_size_is_built_once_and_the_next_user_sees_nothing_the_last_one_did(lab_factory):
    lab = lab_factory.shared(2, "first user")
    assert lab_factory.shared(2, "first user") is lab
    want = tree(site_packages(base_dir()) / "speculators")
    n1, n2 = lab.node("lab01"), lab.node("lab02")
    untouched = n2.module_file(WORKER)
    inode = untouched.stat().st_ino

    # The first user: a patch with its backups and bytecode, a hand edit, another version beside the
    # package, a failpoint armed, busy GPUs, an Xid in the kernel log, a stopped sshd, extra project
    # files, playbooks/ replaced by a copy, an extra inventory.
    assert fab_json(lab.root, "-H", "lab01", "patch")[0] == 0
    n2.module_file(GENERATOR).write_text("# edited by hand\n")
    (site_packages(n2.venv) / "speculators-0.4.0.dist-info").mkdir()
    (site_packages(n2.venv) / "stray.pth").write_text("/nowhere\n")
    (n1.faults_dir / "failpoints.json").write_text("{}")
    run_fab(lab.root, "lab.gpu", "--node", "lab01", "--state", "busy", check=True)
    run_fab(lab.root, "lab.kernel", "--node", "lab02", "--xid", "79", "--gpu", "1", check=True)
    lab.stop_node(n2)
    (lab.root / "notes.txt").write_text("mine")
    (lab.root / "hosts" / "extra.yaml").write_text("hosts: {}\n")
    (lab.root / "playbooks").unlink()
    (lab.root / "playbooks").mkdir()
    assert list(n1.state_dir.glob("backups/*")) and (n1.state_dir / "bin").exists()

    started = time.monotonic()
    again = lab_factory.shared(2, "second user")
    took = time.monotonic() - started
    assert again is lab
    for node in (n1, n2):
        assert {k: v for k, v in pristine(node).items() if k.startswith("speculators/")} == {
            f"speculators/{k}": v for k, v in want.items()
        }, node.name
        assert sorted(p.name for p in site_packages(node.venv).iterdir()) == [
            "_fleetops_lab_base.pth",
            "speculators",
            "speculators-0.3.0.dist-info",
        ]
        assert sorted(p.name for p in node.state_dir.iterdir()) == ["lab-data", "lab-model"]
        assert not list(node.faults_dir.iterdir())
        assert lab.gpu_state(node)["state"] == "idle" and not lab.gpu_state(node)["holder_pids"]
        assert (node.dir / "kernel.log").read_text() == ""
        assert node.running()
    assert untouched.stat().st_ino == inode, "a file nobody touched was copied again"
    assert sorted(p.name for p in lab.root.iterdir()) == sorted(
        [".lab", "fabfile.py", "fabric.yaml", "hosts", "playbooks", "tests"]
    )
    assert os.readlink(lab.root / "playbooks") == str(REPO / "playbooks")
    assert [p.name for p in (lab.root / "hosts").iterdir()] == ["lab.yaml"]
    # What the second user runs works on the restored lab as on a new one.
    rc, doc = fab_json(lab.root, "-H", "lab01,lab02", "verify", "--kinds", "grep")
    assert rc == 1 and {r["host"] for r in doc["results"]} == {"lab01", "lab02"}, doc
    print(f"restore of a dirtied 2-node lab: {took * 1000:.0f} ms")
    assert took < 30, f"the restore took {took:.1f} s: it should put a few files back, not rebuild"


def test_the_same_user_gets_the_lab_as_it_left_it(lab_factory):
    lab = lab_factory.shared(2, "keeper")
    (lab.root / "mine.txt").write_text("kept")
    assert lab_factory.shared(2, "keeper") is lab and (lab.root / "mine.txt").read_text() == "kept"


def test_reset_packages_puts_back_only_what_changed(lab):
    node = lab.node("lab01")
    edited, untouched = node.module_file(GENERATOR), node.module_file(WORKER)
    inode = untouched.stat().st_ino
    edited.write_text("# drifted\n")
    edited.chmod(0o600)
    (edited.parent / "__pycache__").mkdir(exist_ok=True)
    (edited.parent / "__pycache__" / "stale.cpython-311.pyc").write_bytes(b"stale")
    (edited.parent / "new_module.py").write_text("x = 1\n")
    lab.reset_packages(node)
    want = tree(site_packages(base_dir()) / "speculators")
    assert tree(site_packages(node.venv) / "speculators") == want
    assert not (edited.parent / "__pycache__").exists()
    assert untouched.stat().st_ino == inode


def test_a_lab_of_ones_own_is_gone_when_its_user_is_done(lab_factory):
    with lab_factory.own("throwaway", 1) as lab:
        node = lab.node("lab01")
        assert node.running()
        # The extract model comes from the cache beside the base venv: no lab makes its own.
        assert (node.state_dir / "lab-model").is_dir() and not (lab.dir / "tiny").exists()
    assert not node.running() and not lab.dir.exists()
