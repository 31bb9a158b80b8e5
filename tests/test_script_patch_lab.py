"""Script patches against real lab nodes (a 2-node lab and a project of its own): a playbook patch
entry that names a script (`transform(text) -> str`) instead of a diff, with a diff's guarantees:
the custom_worker fix as a script gives the very bytes of the shipped diff (the committed sha256 of
GNU patch's result), a second run is `already applied`, --check shows the diff and writes nothing,
rollback is byte-exact (the wheel's RECORD), the script's sha256 is in the backup record; a
transform that is not idempotent, raises, or breaks the syntax is refused with nothing written, and
stops the whole set (a diff entry beside it is not written either)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO, copy_playbooks, fab_json
from faultkit import reset_node

pytestmark = pytest.mark.lab

WORKER = "speculators.data_generation.custom_worker"
GENERATOR = "speculators.data_generation.vllm_hidden_states_generator"
BOOK = "playbooks/script-patch.yaml"


def want(form: str, module: str) -> str:
    for line in (
        (REPO / "tests/fixtures/speculators-0.3.0-vllm-0.16.sha256").read_text().splitlines()
    ):
        if line and not line.startswith("#") and line.split()[1:] == [form, module]:
            return line.split()[0]
    raise AssertionError(f"no {form} sha256 for {module}")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def with_script_patch_playbook(project: Path) -> None:
    copy_playbooks(project)
    shutil.copy(REPO / "tests/playbooks/script-patch.yaml", project / BOOK)
    shutil.copytree(REPO / "tests/playbooks/script-patch", project / "playbooks/script-patch")


@pytest.fixture(scope="module")
def lab2(lab_factory):
    return lab_factory.shared(2, __name__, layout=with_script_patch_playbook)


@pytest.fixture
def lab(lab2):
    for node in lab2.nodes():
        lab2.start_node(node)
        reset_node(lab2, node)
    return lab2


def item(doc: dict, module: str = WORKER) -> dict:
    return next(i for i in doc["results"][0]["items"] if i["label"] == module)


def test_script_patch_applies_reapplies_checks_and_rolls_back_byte_exact(lab):
    target = lab.node("lab01").module_file(WORKER)
    assert sha(target) == want("pristine", WORKER)
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch", "-p", BOOK, "--check")
    assert rc == 0, doc
    got = item(doc)
    assert got["status"] == "changed" and "would apply script fix_worker.py" in got["msg"], got
    assert (
        "+            hidden_states = self.embed_input_ids(input_ids)"
        in got["details"]["diff_text"]
    )
    assert sha(target) == want("pristine", WORKER)  # check mode wrote nothing
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch", "-p", BOOK)
    assert rc == 0, doc
    assert "applied script fix_worker.py (sha256 " in item(doc)["msg"], item(doc)
    # the very bytes GNU patch makes from the shipped diff
    assert sha(target) == want("patched", WORKER)
    script_sha = hashlib.sha256(
        (REPO / "tests/playbooks/script-patch/fix_worker.py").read_bytes()
    ).hexdigest()
    records = [
        json.loads(p.read_text()) for p in (lab.node("lab01").state_dir / "backups").glob("*.json")
    ]
    assert [(r["script"], r["script_sha256"]) for r in records] == [("fix_worker.py", script_sha)]
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch", "-p", BOOK)
    assert rc == 0 and item(doc)["status"] == "ok" and "already applied" in item(doc)["msg"], doc
    rc, doc = fab_json(lab.root, "-H", "lab01", "verify", "-p", BOOK)
    assert rc == 0, doc
    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback", "-p", BOOK)
    assert rc == 0, doc
    assert (
        "restored the saved original" in item(doc)["msg"]
        and "verified against the wheel's RECORD" in item(doc)["msg"]
    ), item(doc)
    assert sha(target) == want("pristine", WORKER)
    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback", "-p", BOOK)
    assert rc == 0 and "already original" in item(doc)["msg"], doc


BROKEN = {
    "not-idempotent": (
        "def transform(text):\n    return text + '# fixed\\n'\n",
        "is not idempotent",
    ),
    "raises": (
        "def transform(text):\n    raise ValueError('no such block here')\n",
        "ValueError: no such block here (line 2 of fix_worker.py)",
    ),
    # idempotent (a second run finds nothing left to replace), but the result is not Python
    "breaks-syntax": (
        "def transform(text):\n    return text.replace('residual = None', 'residual = (')\n",
        "produces a file that does not compile",
    ),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_transform_is_refused_and_stops_the_whole_set(lab, kind):
    source, expect = BROKEN[kind]
    book = lab.root / f"playbooks/broken-{kind}.yaml"
    (lab.root / f"playbooks/broken-{kind}").mkdir(exist_ok=True)
    (lab.root / f"playbooks/broken-{kind}/fix_worker.py").write_text(source)
    book.write_text(
        f"name: broken-{kind}\nrequires: [speculators==0.3.0]\npatches:\n"
        f"  - module: {GENERATOR}\n"
        "    diff: speculators-0.3.0-vllm-0.16/vllm_hidden_states_generator.diff\n"
        f"  - module: {WORKER}\n    script: broken-{kind}/fix_worker.py\n"
    )
    node = lab.node("lab01")
    before = {m: sha(node.module_file(m)) for m in (GENERATOR, WORKER)}
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch", "-p", str(book.relative_to(lab.root)))
    assert rc == 1, doc
    assert item(doc)["status"] == "failed" and expect in item(doc)["msg"], item(doc)
    assert (
        item(doc, GENERATOR)["status"] == "skipped"
        and "all-or-nothing" in item(doc, GENERATOR)["msg"]
    )
    assert {m: sha(node.module_file(m)) for m in (GENERATOR, WORKER)} == before
    assert not (node.state_dir / "backups").exists() or not list(
        (node.state_dir / "backups").glob("*.orig")
    )


def test_rollback_of_a_script_patch_refuses_a_file_edited_since(lab):
    node = lab.node("lab01")
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch", "-p", BOOK)
    assert rc == 0, doc
    target = node.module_file(WORKER)
    target.write_text(target.read_text() + "\n# edited after the patch\n")
    edited = sha(target)
    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback", "-p", BOOK)
    assert rc == 1 and item(doc)["status"] == "failed" and "drifted" in item(doc)["msg"], doc
    assert sha(target) == edited
    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback", "-p", BOOK, "--force")
    assert rc == 0, doc
    assert sha(target) == want("pristine", WORKER)
