"""Deep verification on a lab node with real vllm 0.16.0: what an import test misses, callsites and
the probe catch; the real playbook fixes it; known wrong fixes are caught; wrong versions are
refused untouched."""

from __future__ import annotations

import pytest
from conftest import GENERATOR, REPO, WORKER, fab_json, record_sha256, sha256

from fleetops.lab import site_packages

pytestmark = pytest.mark.lab
WRONG_FIXES = str(REPO / "tests" / "playbooks" / "known-wrong-fixes.yaml")


def by_kind(doc: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in doc["results"]:
        if r["task"] == "verify":
            for item in r["items"]:
                kind = item["label"].rsplit("[", 1)[1].rstrip("]")
                out.setdefault(kind, []).append(item)
    return out


def verdicts(doc: dict) -> list[tuple[str, str]]:
    return sorted((i["label"], i["status"]) for items in by_kind(doc).values() for i in items)


def assert_unpatched_picture(doc: dict) -> None:
    kinds = by_kind(doc)
    # the import test is fooled
    assert all(i["status"] == "ok" for i in kinds["import"]), kinds["import"]
    callsites = kinds["callsites"][0]
    assert callsites["status"] == "failed"
    errors = {
        (e["callee"].rsplit(".", 1)[-1], e["error"]) for e in callsites["details"]["evidence"]
    }
    assert ("SchedulerConfig", "missing a required argument: 'is_encoder_decoder'") in errors
    assert (
        "get_kv_cache_config_from_groups",
        "got an unexpected keyword argument 'kv_cache_specs'",
    ) in errors
    assert ("Scheduler", "missing a required argument: 'block_size'") in errors
    assert any(c == "get_input_embeddings" and "has no attribute" in e for c, e in errors)
    for e in callsites["details"]["evidence"]:
        assert e["file"].endswith(".py") and e["line"] > 0
    probe = kinds["probe"][0]
    assert probe["status"] == "failed"
    assert "prompt tokens never go through the model" in probe["msg"]


def test_unpatched_import_passes_but_callsites_and_probe_fail(lab):
    rc, doc = fab_json(lab.root, "-H", "lab01", "verify")
    assert rc == 1
    assert_unpatched_picture(doc)


def test_patched_passes_everything_and_rollback_fails_again_exactly_as_before(lab):
    rc, before = fab_json(lab.root, "-H", "lab01", "verify")
    assert rc == 1
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch", "verify")
    assert rc == 0, [i for r in doc["results"] for i in r["items"] if i["status"] != "ok"]
    kinds = by_kind(doc)
    assert set(kinds) == {"requires", "grep", "compile", "import", "callsites", "probe"}
    assert "PASS: all" in kinds["probe"][0]["msg"]
    rc, after = fab_json(lab.root, "-H", "lab01", "rollback", "verify")
    assert rc == 1
    assert verdicts(after) == verdicts(before)
    assert_unpatched_picture(after)
    node = lab.node("lab01")
    for module in (GENERATOR, WORKER):
        assert sha256(node.module_file(module)) == record_sha256(site_packages(node.venv), module)


def test_known_wrong_fixes_pass_grep_and_import_but_not_the_probe(lab):
    # Task flags belong to the task they follow (Invoke's rule): each task names the playbook.
    rc, doc = fab_json(
        lab.root,
        "-H",
        "lab01",
        "patch",
        "--playbook",
        WRONG_FIXES,
        "verify",
        "--playbook",
        WRONG_FIXES,
    )
    assert rc == 1
    patch = [r for r in doc["results"] if r["task"] == "patch"][0]
    assert patch["status"] == "changed"
    kinds = by_kind(doc)
    assert kinds["grep"] and all(i["status"] == "ok" for i in kinds["grep"])
    assert all(i["status"] == "ok" for i in kinds["import"])
    probe = kinds["probe"][0]
    assert probe["status"] == "failed" and "never go through the model" in probe["msg"]
    assert "hidden by a block hasher" in probe["msg"]
    # ...and the real verify list on that same node says so too.
    rc, real = fab_json(lab.root, "-H", "lab01", "verify")
    assert rc == 1
    assert by_kind(real)["probe"][0]["status"] == "failed"


@pytest.fixture(scope="module")
def other_versions(lab_factory):
    """lab03 has real vllm 0.11.0, lab04 real speculators 0.4.0 (installed without deps,
    shadowing)."""
    lab = lab_factory.shared(4, __name__)
    for name, req in (("lab03", "vllm==0.11.0"), ("lab04", "speculators==0.4.0")):
        node = lab.node(name)
        dist = req.split("==")[0]
        found = [p.name for p in site_packages(node.venv).glob(f"{dist}-*.dist-info")]
        if found != [f"{dist}-{req.split('==')[1]}.dist-info"]:
            lab.install_package(node, req)
    return lab


@pytest.mark.parametrize("node,found", [("lab03", "vllm 0.11.0"), ("lab04", "speculators 0.4.0")])
def test_other_versions_are_refused_before_any_change(other_versions, node, found):
    lab = other_versions
    target = lab.node(node).module_file(GENERATOR)
    before = sha256(target) if target.exists() else None
    rc, doc = fab_json(lab.root, "-H", node, "patch")
    assert rc == 1
    item = doc["results"][0]["items"][0]
    assert item["status"] == "failed"
    assert found in item["msg"] and "requirements not met" in item["msg"]
    assert "speculators 0.4.0 supports vLLM 0.12-0.16" in item["msg"]
    assert (sha256(target) if target.exists() else None) == before
    assert not (lab.node(node).state_dir / "backups").exists()
