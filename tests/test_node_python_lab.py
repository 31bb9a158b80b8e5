"""A lab node per node Python: `fab lab.up --nodes 6 --python 3.9,3.10,3.11,3.12,3.13,3.8` makes
each node's venv from that interpreter (pyenv's), with speculators 0.3.0's files and no vLLM, and
one fab command patches, verifies and answers ping and facts on the five supported ones over real
SSH; the shipped playbook's verify says honestly what a node without vLLM cannot show; rollback puts
the wheel's bytes back; and the 3.8 node is refused in one line that names its Python and the
minimum. Under CI=true a missing interpreter fails (conftest: no silent skip)."""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path

import pytest
import yaml
from conftest import (
    GENERATOR,
    WORKER,
    copy_playbooks,
    fab_json,
    make_project,
    record_sha256,
    run_fab,
)

from fleetops.lab import Lab, site_packages
from fleetops.lab.pythons import NODE_PYTHONS, find_python

pytestmark = pytest.mark.lab

TOO_OLD = "3.8"
HOSTS = ",".join(f"lab{i:02d}" for i in range(1, len(NODE_PYTHONS) + 1))
FILES_ONLY = "playbooks/speculators-0.3.0-files.yaml"


def _files_only_playbook(project: Path) -> None:
    """The shipped playbook's patches and file checks (grep, compile), requiring only what these
    nodes have."""
    shipped = yaml.safe_load(
        (project / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml").read_text()
    )
    doc = {
        "name": "speculators-0.3.0-files",
        "description": "the shipped patch and its file checks, no vLLM",
        "requires": ["speculators==0.3.0"],
        "patches": shipped["patches"],
        "verify": [c for c in shipped["verify"] if c["kind"] in ("grep", "compile")],
    }
    (project / FILES_ONLY).write_text(yaml.safe_dump(doc, sort_keys=False))


@pytest.fixture(scope="module")
def matrix(lab_factory):
    pythons = [*NODE_PYTHONS, TOO_OLD]
    missing = [v for v in pythons if find_python(v) is None]
    if missing:
        pytest.skip(
            f"no Python {', '.join(missing)} on this machine (pyenv install {' '.join(missing)})"
        )
    project = lab_factory.project_dir("node-pythons")
    if not (project / "fabfile.py").exists():
        make_project(project)
        copy_playbooks(project)
        _files_only_playbook(project)
    started = time.monotonic()
    up = run_fab(
        project, "lab.up", "--nodes", str(len(pythons)), "--python", ",".join(pythons), check=True
    )
    took = time.monotonic() - started
    print(f"lab.up of {len(pythons)} nodes, one per Python: {took:.2f} s")
    try:
        yield Lab(project), up, took
    finally:
        if lab_factory.kept is None:
            Lab(project).down(purge=True)
            shutil.rmtree(project.parent, ignore_errors=True)


def test_each_node_runs_its_own_python_without_vllm(matrix):
    lab, up, _ = matrix
    nodes = lab.nodes()
    assert [n.python_version for n in nodes] == [*NODE_PYTHONS, TOO_OLD]
    for node, version in zip(nodes, [*NODE_PYTHONS, TOO_OLD]):
        assert (
            f"{node.name}: sshd on 127.0.0.1:{node.port}" in up.stdout
            and f"(Python {version} from {find_python(version)}; no vLLM)" in up.stdout
        )
        site = site_packages(node.venv)
        assert site.parent.name == f"python{version}"
        assert not (site / "_fleetops_lab_base.pth").exists() and not (site / "vllm").exists()
        assert record_sha256(site, GENERATOR)  # speculators 0.3.0's files, with pip's RECORD


def test_patch_verify_ping_and_facts_on_every_node_python_in_one_command(matrix):
    lab, _, _ = matrix
    rc, doc = fab_json(
        lab.root,
        "-H",
        HOSTS,
        "ping",
        "facts",
        "patch",
        "--playbook",
        FILES_ONLY,
        "verify",
        "--playbook",
        FILES_ONLY,
    )
    assert rc == 0, doc
    by = {(r["host"], r["task"]): r for r in doc["results"]}
    for i, version in enumerate(NODE_PYTHONS, 1):
        host = f"lab{i:02d}"
        assert by[(host, "ping")]["data"]["version"].startswith(version + ".")
        facts = by[(host, "facts")]["data"]["facts"]
        assert (
            facts["python"].startswith(version + ".")
            and facts["packages"]["speculators"] == "0.3.0"
        )
        assert facts["packages"]["vllm"] is None
        assert [i["status"] for i in by[(host, "patch")]["items"]] == ["changed", "changed"]
        verify = by[(host, "verify")]  # requires, 11 greps, 2 compiles
        assert verify["status"] == "ok" and verify["msg"] == "14/14 checks passed", verify
    # the human report shows each node's Python
    proc = run_fab(lab.root, "-H", HOSTS, "facts")
    for i, version in enumerate(NODE_PYTHONS, 1):
        assert (
            f"lab{i:02d} | facts | ok | os=" in proc.stdout and f"python={version}." in proc.stdout
        )

    rc, doc = fab_json(lab.root, "-H", HOSTS, "rollback", "--playbook", FILES_ONLY)
    assert rc == 0, doc
    for node in lab.nodes()[: len(NODE_PYTHONS)]:
        site = site_packages(node.venv)
        for module in (GENERATOR, WORKER):
            assert hashlib.sha256(
                node.module_file(module).read_bytes()
            ).hexdigest() == record_sha256(site, module)


def test_the_shipped_playbook_says_what_a_node_without_vllm_cannot_show(matrix):
    lab, _, _ = matrix
    rc, doc = fab_json(lab.root, "-H", "lab01,lab05", "verify")
    assert rc == 1
    for result in doc["results"]:
        items = {i["label"].split(" [")[0]: i for i in result["items"]}
        assert result["status"] == "failed" and items["requires"]["status"] == "failed"
        assert "vllm not installed" in " ".join(items["requires"]["details"]["evidence"])
        for name in (
            "generator-imports",
            "worker-imports",
            "vllm-callsites",
            "every-prompt-token-through-the-model",
        ):
            assert items[name]["status"] == "failed"
            assert items[name]["msg"].startswith("not run: vllm is not installed for "), items[name]
        assert items["generator-compiles"]["status"] == "ok"  # the file checks still ran


def test_a_node_python_older_than_the_floor_is_refused_in_one_line(matrix):
    lab, _, _ = matrix
    node = lab.nodes()[-1]
    proc = run_fab(lab.root, "-H", node.name, "ping")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stdout + proc.stderr
    assert (
        f"{node.name}: refusing to run the agent with Python 3.8." in proc.stdout
        and "the fleetops agent needs Python 3.9 or newer" in proc.stdout
    ), proc.stdout + proc.stderr


def test_restore_and_a_plain_lab_up_keep_each_nodes_python(matrix):
    lab, _, _ = matrix
    node = lab.nodes()[0]
    site = site_packages(node.venv)
    node.module_file(GENERATOR).write_text("# changed by a test\n")
    (site / "left-behind.txt").write_text("x")
    lab.restore()
    assert hashlib.sha256(node.module_file(GENERATOR).read_bytes()).hexdigest() == record_sha256(
        site, GENERATOR
    )
    assert (
        not (site / "left-behind.txt").exists() and not (site / "_fleetops_lab_base.pth").exists()
    )
    run_fab(lab.root, "lab.up", "--nodes", str(len(lab.nodes())), check=True)
    assert [n.python_version for n in lab.nodes()] == [*NODE_PYTHONS, TOO_OLD]
    assert site_packages(lab.nodes()[0].venv) == site
