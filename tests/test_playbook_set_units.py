"""A playbook set (a directory of playbooks), without a node: which playbook a host's installed
versions fit, the refusal that names the versions and the nearest playbook's pins, and how a run
plans with a set named by -p or by fabric.yaml. The lab side (a mixed fleet green in one command) is
tests/test_new_vllm_lab.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fleetops.plans.playbookset import load_set
from fleetops.plans.yamlsrc import ConfigError
from fleetops.run import assemble
from fleetops.state import RunState

REPO = Path(__file__).resolve().parent.parent
OLD, NEW = "speculators-0.3.0-vllm-0.16", "speculators-0.3.0-vllm-0.17"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "playbooks", tmp_path / "playbooks")
    (tmp_path / "hosts").mkdir()
    (tmp_path / "hosts" / "lab.yaml").write_text(
        "defaults:\n  address: 127.0.0.1\nhosts:\n  lab01:\n    port: 2222\n"
    )
    return tmp_path


def test_each_version_pair_fits_its_own_playbook_of_the_shipped_set():
    books = load_set(REPO / "playbooks")
    assert sorted(b.name for b in books.books) == [OLD, NEW]
    assert books.packages == ["speculators", "vllm"]
    assert [b.name for b in books.fitting({"speculators": "0.3.0", "vllm": "0.16.0"})] == [OLD]
    assert [b.name for b in books.fitting({"speculators": "0.3.0", "vllm": "0.16.2"})] == [OLD]
    assert [b.name for b in books.fitting({"speculators": "0.3.0", "vllm": "0.17.0"})] == [NEW]
    assert books.fitting({"speculators": "0.3.0", "vllm": "0.18.0"}) == []
    assert books.fitting({"speculators": None, "vllm": "0.16.0"}) == []


def test_a_host_no_playbook_fits_is_told_its_versions_and_the_nearest_pins():
    books = load_set(REPO / "playbooks")
    text = books.refusal("gpu07", {"speculators": "0.3.0", "vllm": "0.18.0"})
    assert text.startswith(
        "no playbook in playbooks/ fits gpu07: it has speculators 0.3.0, vllm 0.18.0; the "
        f"nearest, {NEW}, requires speculators==0.3.0, vllm==0.17.*."
    ), text
    assert books.nearest({"speculators": "0.3.0", "vllm": "0.15.1"}).name == OLD
    # one of two pins met
    assert books.nearest({"speculators": "0.4.0", "vllm": "0.17.0"}).name == NEW


def test_a_set_needs_playbooks_of_distinct_names(tmp_path: Path):
    with pytest.raises(ConfigError, match="no playbook in it"):
        load_set(tmp_path)
    shutil.copytree(REPO / "playbooks", tmp_path / "set")
    shutil.copy(tmp_path / "set" / f"{OLD}.yaml", tmp_path / "set" / "copy.yaml")
    with pytest.raises(ConfigError, match=f"playbook name '{OLD}' is also"):
        load_set(tmp_path / "set")


@pytest.mark.parametrize("where", ["-p", "fabric.yaml"])
def test_a_run_plans_each_task_once_per_playbook_of_the_set(project: Path, where: str):
    settings = (
        {"playbook": "playbooks"}
        if where == "fabric.yaml"
        else {"playbook": f"playbooks/{OLD}.yaml"}
    )
    given = {"playbook": str(project / "playbooks")} if where == "-p" else {}
    run = assemble(RunState(project, settings), ["lab01"], [("patch", dict(given)), ("verify", {})])
    for step in run.steps:
        plan = step.run.args[2]
        # chosen per host when it runs
        assert plan.playbook is None and sorted(plan.by_playbook) == [OLD, NEW]
        assert plan.by_playbook[NEW].playbook.name == NEW


def test_tasks_that_read_one_playbook_file_refuse_a_set(project: Path):
    with pytest.raises(
        ConfigError, match=r"a playbook set \(a directory\); this task reads one playbook"
    ):
        assemble(
            RunState(project, {}), ["lab01"], [("rebase", {"playbook": str(project / "playbooks")})]
        )
