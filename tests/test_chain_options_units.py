"""`-p` names the playbook of the whole command: given once, to any task of the chain, every task
that takes a playbook plans with it (Invoke hands an option only to the task it follows, so `patch
verify -p NEW.yaml` used to patch with fabric.yaml's playbook and verify with NEW). Planned without
a node: assemble() connects nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fleetops.run import UsageError, assemble
from fleetops.state import RunState

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "playbooks", tmp_path / "playbooks")
    old = tmp_path / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml"
    new = tmp_path / "playbooks" / "NEW.yaml"
    new.write_text(old.read_text().replace("name: speculators-0.3.0-vllm-0.16", "name: NEW", 1))
    (tmp_path / "hosts").mkdir()
    (tmp_path / "hosts" / "lab.yaml").write_text(
        "defaults:\n  address: 127.0.0.1\nhosts:\n  lab02:\n    port: 2222\n"
    )
    return tmp_path


def planned(project: Path, tasks: list[tuple[str, dict]]) -> list[str | None]:
    state = RunState(project, {"playbook": "playbooks/speculators-0.3.0-vllm-0.16.yaml"})
    run = assemble(state, ["lab02"], tasks)
    return [step.run.args[2].playbook.name for step in run.steps]


def test_p_after_the_last_task_applies_to_every_task_of_the_chain(project: Path):
    new = str(project / "playbooks" / "NEW.yaml")
    assert planned(project, [("patch", {"playbook": None}), ("verify", {"playbook": new})]) == [
        "NEW",
        "NEW",
    ]
    assert planned(project, [("patch", {"playbook": new}), ("verify", {})]) == ["NEW", "NEW"]
    assert planned(project, [("patch", {}), ("verify", {})]) == ["speculators-0.3.0-vllm-0.16"] * 2


def test_two_different_playbooks_in_one_command_are_refused(project: Path):
    new = str(project / "playbooks" / "NEW.yaml")
    old = str(project / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml")
    with pytest.raises(UsageError, match=r"--playbook given with different values .*give it once"):
        planned(project, [("patch", {"playbook": old}), ("verify", {"playbook": new})])
