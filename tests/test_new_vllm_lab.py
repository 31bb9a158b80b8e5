"""The day a new vLLM lands, on a real mixed lab: lab01 runs the default base (vLLM 0.16.0), lab02 a
faithful base with a newer real vLLM (fleetops.lab.common.NEWER_NODE_PACKAGES: 0.17.0 with its own
torch, built by `lab.build-base` and cached), speculators 0.3.0 on both. The project's playbooks/ is
a real copy (rebase writes there).

- a mixed fleet goes green in one command, each host with the playbook its versions fit (`-p
  playbooks/`), and a host no playbook fits is refused with its versions and the nearest playbook's
  pins;
- `-p` given once names the playbook of every task of the command;
- `rebase` onto the new vLLM says which calls no longer bind (hunks alone said "clean"), and "clean"
  only when they do;
- every evidence list says how many lines it leaves out; the probe names the vLLM it ran on;
- `facts` and `verify` warn when the installed packages do not satisfy each other (pip check), as on
  a node given a vLLM without its dependencies.
"""

from __future__ import annotations

import shutil

import pytest
from conftest import copy_playbooks, fab_json, run_fab

from fleetops.lab import base_dir
from fleetops.plans.playbook import load_playbook

pytestmark = pytest.mark.lab

OLD, NEW = "speculators-0.3.0-vllm-0.16", "speculators-0.3.0-vllm-0.17"
OLD_YAML, NEW_YAML = f"playbooks/{OLD}.yaml", f"playbooks/{NEW}.yaml"
EOS = "vllm.v1.request.Request: got an unexpected keyword argument 'eos_token_id'"


@pytest.fixture(scope="module")
def mixed_lab(lab_factory, newer_base):
    with lab_factory.own("newvllm", 2, layout=copy_playbooks) as lab:
        lab.use_base(lab.node("lab02"), newer_base)
        yield lab


@pytest.fixture
def lab(mixed_lab, newer_base):
    """Both nodes pristine on their own base (lab01: 0.16.0, lab02: the newer vLLM), nothing
    patched."""
    for node, base in (
        (mixed_lab.node("lab01"), base_dir()),
        (mixed_lab.node("lab02"), newer_base),
    ):
        mixed_lab.use_base(node, base)
        shutil.rmtree(node.state_dir / "backups", ignore_errors=True)
        (node.state_dir / "lock.json").unlink(missing_ok=True)
    for leftover in mixed_lab.root.glob("playbooks/candidate*"):
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    return mixed_lab


def results(doc: dict) -> dict[tuple[str, str], dict]:
    return {(r["host"], r["task"]): r for r in doc["results"]}


def test_a_mixed_fleet_goes_green_in_one_command_each_host_with_its_own_playbook(lab):
    rc, doc = fab_json(lab.root, "-H", "@lab", "patch", "verify", "-p", "playbooks/")
    got = results(doc)
    assert rc == 0, doc
    assert {host: got[(host, "verify")]["data"]["playbook"] for host in ("lab01", "lab02")} == {
        "lab01": OLD,
        "lab02": NEW,
    }
    assert got[("lab02", "patch")]["data"]["playbook"] == NEW
    # every check of the new playbook, probe included
    assert got[("lab02", "verify")]["msg"] == "20/20 checks passed"
    human = run_fab(lab.root, "-H", "@lab", "verify", "-p", "playbooks/").stdout
    assert f"playbook: {NEW} (from playbooks/, for speculators 0.3.0, vllm 0.17.0)" in human, human
    assert f"playbook: {OLD} (from playbooks/, for speculators 0.3.0, vllm 0.16.0)" in human, human


def test_a_host_no_playbook_fits_is_refused_with_its_versions_and_the_nearest_pins(lab):
    # a version no playbook of the set is for
    lab.install_package(lab.node("lab01"), "speculators==0.4.0")
    rc, doc = fab_json(lab.root, "-H", "@lab", "patch", "verify", "-p", "playbooks/")
    got = results(doc)
    assert rc == 1
    refused = got[("lab01", "patch")]
    assert refused["status"] == "failed" and refused["data"]["error_kind"] == "no_playbook"
    assert refused["msg"].startswith(
        f"no playbook in playbooks/ fits lab01: it has speculators 0.4.0, vllm 0.16.0; "
        f"the nearest, {OLD}, requires speculators==0.3.0, vllm==0.16.*"
    ), refused["msg"]
    assert got[("lab01", "verify")]["status"] == "skipped"
    assert got[("lab02", "verify")]["status"] == "ok"  # the other host is not held back
    # nothing was written on the refused host
    assert not (lab.node("lab01").state_dir / "backups").exists()


def test_p_given_once_names_the_playbook_of_every_task(lab):
    rc, doc = fab_json(lab.root, "-H", "lab02", "patch", "verify", "-p", NEW_YAML)
    got = results(doc)
    assert rc == 0, doc
    assert (
        got[("lab02", "patch")]["data"]["playbook"]
        == got[("lab02", "verify")]["data"]["playbook"]
        == NEW
    )


def test_rebase_onto_the_new_vllm_names_the_calls_that_no_longer_bind(lab):
    rc, doc = fab_json(
        lab.root, "-H", "lab02", "rebase", "-p", OLD_YAML, "--out", "playbooks/candidate.yaml"
    )
    result = doc["results"][0]
    assert rc == 1, result
    assert (
        "6 clean; hunks clean, 1 call no longer binds: vllm_hidden_states_generator.py:"
        in result["msg"]
    )
    assert EOS in result["msg"] and "; clean;" not in result["msg"]
    checks = {c["kind"]: c for c in result["data"]["checks"]}
    assert not checks["callsites"]["ok"] and not checks["probe"]["ok"]
    assert "got an unexpected keyword argument 'eos_token_id'" in checks["probe"]["msg"]
    # written: the start of the hand fix
    candidate = load_playbook(lab.root / "playbooks" / "candidate.yaml")
    # the shape of the old pin, vllm==0.16.*
    assert candidate.requires == ["speculators==0.3.0", "vllm==0.17.*"]
    assert "0.4.0" not in candidate.requires_hint and "vllm==0.17.*" in candidate.requires_hint
    assert candidate.description.startswith("REVIEW (written for speculators==0.3.0, vllm==0.16.*)")
    assert any("vLLM 0.16" in line for line in result["data"]["review"])


def test_rebase_says_clean_only_when_the_calls_bind(lab):
    rc, doc = fab_json(
        lab.root, "-H", "lab02", "rebase", "-p", NEW_YAML, "--out", "playbooks/candidate.yaml"
    )
    result = doc["results"][0]
    assert rc == 0, result
    assert (
        "; clean; candidate candidate.yaml written: prove it with fab -H lab02 patch verify -p"
        in result["msg"]
    )
    assert all(c["ok"] for c in result["data"]["checks"]) and {
        c["kind"] for c in result["data"]["checks"]
    } == {"callsites", "probe"}


def test_every_evidence_list_counts_what_it_leaves_out_and_the_probe_names_its_vllm(lab):
    # pristine files on vLLM 0.17.0
    proc = run_fab(lab.root, "-H", "lab02", "verify", "-v", "-p", OLD_YAML)
    assert proc.returncode == 1
    assert (
        "vllm-callsites [callsites]: 6 call sites do not match the installed packages"
        in proc.stdout
    )
    assert "and 1 more (--json for all)" in proc.stdout, proc.stdout
    _, doc = fab_json(lab.root, "-H", "lab02", "verify", "-p", OLD_YAML)
    items = {i["label"]: i for i in doc["results"][0]["items"]}
    calls = items["vllm-callsites [callsites]"]["details"]["evidence"]
    assert len(calls) == 6 and any(f"{c['callee']}: {c['error']}" == EOS for c in calls)
    probe = items["every-prompt-token-through-the-model [probe]"]
    assert "breaks on vLLM 0.17.0:" in probe["msg"] and "[vLLM 0.17.0: " in probe["msg"], probe[
        "msg"
    ]
    assert "0.16" not in probe["msg"]


def test_facts_and_verify_warn_when_installed_packages_do_not_satisfy_each_other(lab):
    # without its dependencies: on 0.16's torch
    lab.install_package(lab.node("lab01"), "vllm==0.17.0")
    _, doc = fab_json(lab.root, "-H", "@lab", "facts")
    got = results(doc)
    warned = got[("lab01", "facts")]["data"].get("node_warnings") or []
    assert "pip check: vllm 0.17.0 requires torch==2.10.0, but you have torch 2.9.1" in warned, (
        warned
    )
    assert got[("lab01", "facts")]["data"]["facts"]["unmet_requirements"] == warned
    # the faithful node: everything met
    assert not got[("lab02", "facts")]["data"].get("node_warnings")
    _, doc = fab_json(lab.root, "-H", "lab01", "verify", "-p", NEW_YAML, "--kinds", "callsites")
    assert "pip check: vllm 0.17.0 requires torch==2.10.0, but you have torch 2.9.1" in doc[
        "results"
    ][0]["data"].get("node_warnings", [])


def test_lab_reset_keeps_a_nodes_base_and_install_vllm_moves_it(lab):
    def vllm_on(host: str) -> str:
        _, doc = fab_json(lab.root, "-H", host, "facts")
        return doc["results"][0]["data"]["facts"]["packages"]["vllm"]

    run_fab(lab.root, "lab.reset", check=True)
    assert vllm_on("lab02") == "0.17.0"
    run_fab(lab.root, "lab.install", "--node", "lab02", "--vllm", "0.16.0", check=True)
    assert vllm_on("lab02") == "0.16.0"
    run_fab(lab.root, "lab.install", "--node", "lab02", "--vllm", "0.17.0", check=True)
    assert vllm_on("lab02") == "0.17.0"
