"""The new-version day without a node: pins that keep the shape the author chose (a release series
stays a series), the shipped 0.17 playbook accepting 0.17's point releases, exact pins offered the
range that would accept them, a candidate written whole or not at all, and `fleet init` setting up
the playbook set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from fleetops.init import make_project
from fleetops.plans.playbookset import load_set
from fleetops.plans.rebase import exact_pins, pin_for, pin_requires, series_pin
from fleetops.plans.yamlsrc import ConfigError
from fleetops.tasks.authoring import _install_candidate, _pin_offers

FLEET = Path(sys.executable).parent / "fleet"
NEW = "speculators-0.3.0-vllm-0.17"


@pytest.mark.parametrize(
    "old, version, new",
    [
        ("vllm==0.16.*", "0.17.0", "vllm==0.17.*"),
        ("vllm>=0.16.0,<0.17", "0.17.1", "vllm>=0.17.1,<0.18"),
        ("vllm >= 0.16, < 1", "0.17.0", "vllm>=0.17.0,<1"),
        ("vllm~=0.16.0", "0.17.2", "vllm~=0.17.2"),
        (
            "vllm==0.16.0",
            "0.17.0",
            "vllm==0.17.0",
        ),  # exact stays exact: the author chose one release
        (None, "0.17.0", "vllm==0.17.0"),
    ],
)
def test_a_new_pin_keeps_the_shape_of_the_old_one(old, version, new):
    assert pin_for(old, "vllm", version) == new


def test_rebase_pins_keep_a_series_a_series():
    assert pin_requires(
        ["speculators==0.3.0", "vllm==0.16.*"],
        {"speculators": "0.3.0", "vllm": "0.17.0"},
        ["speculators", "vllm"],
    ) == ["speculators==0.3.0", "vllm==0.17.*"]


def test_the_shipped_new_playbook_accepts_its_point_releases():
    books = load_set(REPO / "playbooks")
    assert [b.name for b in books.fitting({"speculators": "0.3.0", "vllm": "0.17.1"})] == [NEW]
    assert [b.name for b in books.fitting({"speculators": "0.3.0", "vllm": "0.17.0"})] == [NEW]
    assert books.fitting({"speculators": "0.3.0", "vllm": "0.18.0"}) == []


def test_an_exact_pin_is_offered_the_range_that_accepts_its_point_releases():
    assert exact_pins(["speculators==0.3.0", "vllm==0.17.*", "torch>=2"]) == ["speculators==0.3.0"]
    assert series_pin("vllm==0.17.0") == "vllm>=0.17.0,<0.18"
    offers = _pin_offers(["vllm==0.17.0", "speculators==0.3.*"], "cand.yaml")
    assert [(i.label, i.details["offer"]) for i in offers] == [
        ("pin vllm==0.17.0", "vllm>=0.17.0,<0.18")
    ]
    assert "write `vllm>=0.17.0,<0.18` in cand.yaml's requires" in offers[0].msg


def test_a_candidate_that_does_not_load_leaves_nothing(tmp_path):
    out = tmp_path / "cand.yaml"
    with pytest.raises(ConfigError):
        _install_candidate(
            out, "name: cand\nrequires: [vllm==0.17.*\n", {"x.diff": "--- a/x\n+++ b/x\n"}
        )
    assert list(tmp_path.iterdir()) == []


def test_a_candidate_that_loads_is_put_in_place_whole(tmp_path):
    out = tmp_path / "far" / "cand.yaml"
    out.parent.mkdir()
    probe = "import sys\nprint('ok')\n"
    text = (
        "name: cand\nrequires: [vllm==0.17.*]\npatches: []\nverify:\n  - name: p\n    kind: probe\n"
        "    script: cand/probe.py\n    modules: [json]\n"
    )
    _install_candidate(out, text, {"probe.py": probe})
    assert sorted(p.name for p in out.parent.iterdir()) == ["cand", "cand.yaml"]
    assert (out.parent / "cand" / "probe.py").read_text() == probe and out.read_text() == text


def test_fleet_init_sets_up_the_playbook_set_and_names_every_playbook(tmp_path):
    proc = subprocess.run(
        [str(FLEET), "init", "ops"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    shipped = sorted(p.name for p in (REPO / "playbooks").glob("*.yaml"))
    assert len(shipped) >= 2
    for name in shipped:
        assert f"playbooks/{name}" in proc.stdout, proc.stdout
    assert "  playbook: playbooks/ " in (tmp_path / "ops" / "fabric.yaml").read_text()
    lint = subprocess.run(
        [str(FLEET), "playbook.lint"],
        cwd=tmp_path / "ops",
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert lint.returncode == 0 and all(n in lint.stdout for n in shipped), (
        lint.stdout + lint.stderr
    )


def test_the_runbook_says_to_rebase_from_the_newest_playbook():
    text = (REPO / "docs" / "runbooks" / "new-version-landed.md").read_text()
    assert "Rebase from the newest playbook of the set" in text


def test_make_project_reads_no_playbook_but_the_packages(tmp_path):
    made = make_project(tmp_path)
    assert "fabric.yaml" in made.written
