"""Playbook authoring against real lab nodes (a 3-node lab and a project of its own, whose
playbooks/ is a real copy, so the playbooks `capture` and `rebase` write never land in the
checkout):

- `capture` of a node patched with the shipped playbook writes a playbook whose `patch` gives a
  fresh node byte-identical files (the committed sha256 of GNU patch's result), both modules at
  once; a hand-edited file is captured with no network at all (client and node in a network
  namespace of their own), its pristine side proven by the wheel in the node's pip cache; with that
  wheel gone it is refused and nothing is written;
- `rebase` of the shipped playbook onto real speculators 0.4.0 (`lab.install`) reports every hunk,
  and onto a file with lines added above the hunks applies with offset and writes a candidate that
  patches;
- grep checks judge code: a comment naming a forbidden symbol no longer fails, a comment cannot
  satisfy a `match`, and a raw-text check failing while callsites and the probe pass is called out
  in the verdict.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, copy_playbooks, fab_json, run_fab
from faultkit import reset_node

from fleetops.lab import SSHD

pytestmark = pytest.mark.lab

GENERATOR = "speculators.data_generation.vllm_hidden_states_generator"
WORKER = "speculators.data_generation.custom_worker"
SHIPPED = "playbooks/speculators-0.3.0-vllm-0.16.yaml"


def _fixture_sha() -> dict[tuple[str, str], str]:
    out = {}
    for line in (
        (REPO / "tests/fixtures/speculators-0.3.0-vllm-0.16.sha256").read_text().splitlines()
    ):
        if line and not line.startswith("#"):
            sha, form, module = line.split()
            out[(form, module)] = sha
    return out


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def lab(lab_factory):
    # capture and rebase write to playbooks/
    return lab_factory.shared(3, __name__, layout=copy_playbooks)


@pytest.fixture
def fresh(lab):
    for name in ("lab01", "lab02"):
        node = lab.node(name)
        lab.start_node(node)
        reset_node(lab, node)
    return lab


def _set_record(site: Path, rel: str, data: bytes) -> None:
    """Make the node's RECORD name these bytes for `rel`: how a new upstream release that only added
    lines looks to pip (the lab node plays that release)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    for record in site.glob("speculators-*.dist-info/RECORD"):
        lines = record.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith(rel + ","):
                lines[i] = f"{rel},sha256={digest},{len(data)}"
        record.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- capture
def test_capture_of_the_patched_node_reproduces_the_shipped_files_on_a_fresh_node(fresh):
    lab, want = fresh, _fixture_sha()
    run_fab(lab.root, "-H", "lab01", "patch", "-p", SHIPPED, check=True)
    rc, doc = fab_json(
        lab.root,
        "-H",
        "lab01",
        "capture",
        "--module",
        f"{GENERATOR},{WORKER}",
        "--pin",
        "vllm",
        "--playbook",
        "playbooks/new.yaml",
    )
    assert rc == 0, doc
    result = doc["results"][0]
    assert result["status"] == "changed", result
    captured = [item for item in result["items"] if not item["label"].startswith("pin ")]
    assert len(captured) == 2, result["items"]
    for item in captured:
        assert item["status"] == "changed" and "fleetops' saved original" in item["msg"], item
    offers = {
        item["label"]: item["details"]["offer"]
        for item in result["items"]
        if item["label"].startswith("pin ")
    }
    assert offers == {
        "pin speculators==0.3.0": "speculators>=0.3.0,<0.4",
        "pin vllm==0.16.0": "vllm>=0.16.0,<0.17",
    }, result["items"]
    book = lab.root / "playbooks/new.yaml"
    text = book.read_text()
    assert "speculators==0.3.0" in text and "vllm==0.16.0" in text
    assert (
        "diff: new/vllm_hidden_states_generator.diff" in text
        and "diff: new/custom_worker.diff" in text
    )
    assert (
        (lab.root / "playbooks/new/custom_worker.diff")
        .read_text()
        .startswith(
            "--- a/speculators/data_generation/custom_worker.py\n+++ "
            "b/speculators/data_generation/custom_worker.py\n"
        )
    )
    # lint agrees, and the captured playbook patches a fresh node to the very bytes of the shipped
    # one
    lint = run_fab(lab.root, "playbook.lint", "-p", "playbooks/new.yaml")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    node2 = lab.node("lab02")
    assert sha(node2.module_file(WORKER)) == want[("pristine", WORKER)]
    rc, doc = fab_json(lab.root, "-H", "lab02", "patch", "-p", "playbooks/new.yaml")
    assert rc == 0, doc
    for module in (GENERATOR, WORKER):
        assert (
            sha(node2.module_file(module))
            == want[("patched", module)]
            == sha(lab.node("lab01").module_file(module))
        )
    rc, doc = fab_json(lab.root, "-H", "lab02", "verify", "-p", "playbooks/new.yaml")
    assert rc == 0, doc
    # capturing again updates in place: same entries, no duplicates
    rc, doc = fab_json(
        lab.root, "-H", "lab01", "capture", "--module", WORKER, "--playbook", "playbooks/new.yaml"
    )
    assert rc == 0, doc
    # patch + compile
    assert book.read_text().count("module: speculators.data_generation.custom_worker\n") == 2


def test_capture_refuses_a_hand_edit_whose_pristine_bytes_nothing_proves(fresh):
    lab = fresh
    node = lab.node("lab01")
    target = node.module_file(WORKER)
    target.write_text(
        target.read_text().replace("self.get_input_embeddings(", "self.embed_input_ids(")
    )
    cache = node.dir / "pip-cache"
    # the wheel the lab put in the node's pip cache (lab.reset_packages puts it back)
    shutil.rmtree(cache)
    before = sorted(p.name for p in (lab.root / "playbooks").iterdir())
    try:
        rc, doc = fab_json(
            lab.root,
            "-H",
            "lab01",
            "capture",
            "--module",
            WORKER,
            "--playbook",
            "playbooks/hand.yaml",
        )
    finally:
        lab.reset_packages(node)
    assert rc == 1, doc
    item = doc["results"][0]["items"][0]
    assert item["status"] == "failed"
    msg = item["msg"]
    assert "no pristine copy proves RECORD's bytes" in msg, msg
    wheels = node.state_dir / "wheels"
    assert f"neither {wheels} nor the pip cache {cache} exists" in msg, msg
    # The command it gives makes the folder it names (an absolute path on the node), then fills it.
    assert (
        f"mkdir -p {wheels} && python3 -m pip download speculators==0.3.0 --no-deps -d {wheels}"
        in msg
    ), msg
    assert sorted(p.name for p in (lab.root / "playbooks").iterdir()) == before  # nothing written
    assert (cache / "wheels" / "lab" / "speculators-0.3.0-py3-none-any.whl").is_file()  # put back


def _offline(lab, node, script: str) -> subprocess.CompletedProcess:
    """`script` in a network namespace of its own (unshare -n: only a loopback, no route anywhere),
    beside a second sshd of `node` started there on the same port with the same keys, so the client
    reaches the node and nothing else."""
    config = node.dir / "sshd_config.offline"
    config.write_text(
        "\n".join(
            f"PidFile {node.dir / 'sshd-offline.pid'}" if line.startswith("PidFile ") else line
            for line in node.config.read_text().splitlines()
        )
        + "\n"
    )
    wrapper = f"""
set -u
ip link set lo up
{shlex.quote(SSHD)} -D -f {shlex.quote(str(config))} -E \
{shlex.quote(str(node.dir / "sshd-offline.log"))} &
sshd=$!
for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/{node.port}) 2>/dev/null && break; sleep 0.05; \
done
( {script} )
rc=$?
kill $sshd; wait $sshd 2>/dev/null
exit $rc
"""
    return subprocess.run(
        ["unshare", "-n", "bash", "-c", wrapper],
        cwd=lab.root,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
    )


NO_NETWORK = """import errno, json, socket, subprocess
links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout.strip()
try:
    socket.create_connection(("192.0.2.1", 443), timeout=2)  # TEST-NET-1: no route here, so no \
packet leaves
    reach = "connected"
except OSError as exc:
    reach = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps({"links": [l.split(":")[1].strip() for l in links], "routes": routes, "reach": \
reach}))
"""


def test_capture_of_a_hand_edit_with_no_network_proves_the_pristine_side_from_the_nodes_pip_cache(
    fresh,
):
    # No package index, no network at all: the client and a second sshd of lab01 in a network
    # namespace of their own. The pristine side comes from the wheel in the node's pip cache, which
    # the lab packed from the base venv's installed files (their RECORD sha256s checked), as a node
    # that installed from an index has it.
    lab = fresh
    node1, node2 = lab.node("lab01"), lab.node("lab02")
    target = node1.module_file(WORKER)
    target.write_text(
        target.read_text().replace("self.get_input_embeddings(", "self.embed_input_ids(")
    )
    probe = _offline(lab, node1, f"{shlex.quote(sys.executable)} -c {shlex.quote(NO_NETWORK)}")
    assert probe.returncode == 0, probe.stdout + probe.stderr
    seen = json.loads(probe.stdout.splitlines()[-1])
    assert seen == {"links": ["lo"], "routes": "", "reach": "ENETUNREACH"}, seen
    capture = (
        f"{shlex.quote(sys.executable)} -m fabric -H lab01 capture --module {WORKER} --playbook "
        "playbooks/offline.yaml --json"
    )
    proc = _offline(lab, node1, capture)
    assert "Traceback" not in proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0, doc
    item = doc["results"][0]["items"][0]
    where = node1.dir / "pip-cache" / "wheels" / "lab"
    assert (
        f"speculators-0.3.0-py3-none-any.whl in {where} (sha256" in item["msg"]
        and "= RECORD's" in item["msg"]
    ), item
    # the member is RECORD's bytes
    with zipfile.ZipFile(where / "speculators-0.3.0-py3-none-any.whl") as z:
        member = z.read("speculators/data_generation/custom_worker.py")
    assert hashlib.sha256(member).hexdigest() == _fixture_sha()[("pristine", WORKER)]
    rc, doc = fab_json(lab.root, "-H", "lab02", "patch", "-p", "playbooks/offline.yaml")
    assert rc == 0, doc
    assert node2.module_file(WORKER).read_bytes() == target.read_bytes()


def test_capture_of_an_unchanged_module_writes_nothing_and_says_why(fresh):
    rc, doc = fab_json(
        fresh.root,
        "-H",
        "lab02",
        "capture",
        "--module",
        WORKER,
        "--playbook",
        "playbooks/none.yaml",
    )
    assert rc == 0, doc
    assert "unchanged" in doc["results"][0]["items"][0]["msg"]
    assert not (fresh.root / "playbooks/none.yaml").exists()


# ---------------------------------------------------------------- rebase
def test_rebase_onto_speculators_040_reports_every_hunk(lab):
    node = lab.node("lab03")
    lab.install_package(node, "speculators==0.4.0")
    proc = run_fab(lab.root, "-H", "lab03", "rebase", "-p", SHIPPED)
    print("\n--- fab -H lab03 rebase (speculators 0.4.0) ---\n" + proc.stdout + proc.stderr)
    rc, doc = fab_json(lab.root, "-H", "lab03", "rebase", "-p", SHIPPED)
    result = doc["results"][0]
    hunks = result["data"]["hunks"]
    assert len(hunks) == sum(len(p.hunks) for p in _shipped().patches)  # every hunk judged
    states = {h["state"] for h in hunks}
    assert states <= {"clean", "offset", "fuzz", "conflict", "already upstream"}
    for h in hunks:
        if h["state"] == "conflict":
            assert any(s.startswith("new upstream, lines") for s in h["shown"]), h
        if h["state"] == "fuzz":
            assert h["shown"], h
    assert result["data"]["versions"]["speculators"] == "0.4.0"
    if "conflict" in states:
        assert rc == 1 and "no candidate written" in result["msg"]
        assert not any(
            p.name.startswith("speculators-0.4.0") for p in (lab.root / "playbooks").iterdir()
        )
    else:
        assert rc == 0 and result["data"]["candidate"]


def _shipped():
    from fleetops.plans.playbook import load_playbook

    return load_playbook(REPO / SHIPPED)


def test_rebase_onto_a_shifted_file_applies_with_offset_and_the_candidate_patches(fresh):
    lab = fresh
    node = lab.node("lab02")
    site = node.module_file(WORKER).parents[2]
    for module, added in ((GENERATOR, 7), (WORKER, 4)):
        path = node.module_file(module)
        text = (
            "".join(f"# an upstream release added line {i}\n" for i in range(added))
            + path.read_text()
        )
        path.write_text(text)
        _set_record(site, str(path.relative_to(site)), text.encode())
    rc, doc = fab_json(
        lab.root, "-H", "lab02", "rebase", "-p", SHIPPED, "--out", "playbooks/shifted copy.yaml"
    )
    assert rc == 0, doc
    result = doc["results"][0]
    # the suggested command is pasted into a shell: the candidate's path arrives as one word
    assert shlex.split(result["msg"].split("prove it with ", 1)[1])[-2:] == [
        "-p",
        "playbooks/shifted copy.yaml",
    ]
    assert {h["state"] for h in result["data"]["hunks"]} == {"offset"}
    assert {h["offset"] for h in result["data"]["hunks"] if h["diff"] == "custom_worker.diff"} == {
        4
    }
    assert {
        h["offset"]
        for h in result["data"]["hunks"]
        if h["diff"] == "vllm_hidden_states_generator.diff"
    } == {7}
    rc, doc = fab_json(lab.root, "-H", "lab02", "patch", "-p", "playbooks/shifted copy.yaml")
    assert rc == 0, doc
    rc, doc = fab_json(
        lab.root,
        "-H",
        "lab02",
        "verify",
        "-p",
        "playbooks/shifted copy.yaml",
        "--kinds",
        "grep,compile",
    )
    assert rc == 0, doc
    lab.reset_packages(node)  # RECORD and files back to the wheel's


# ---------------------------------------------------------------- grep checks judge code
def _kinds(doc: dict) -> dict[str, dict]:
    return {i["label"].split(" [")[0]: i for i in doc["results"][0]["items"]}


def test_a_comment_naming_a_forbidden_symbol_does_not_fail_a_grep(fresh):
    lab = fresh
    run_fab(lab.root, "-H", "lab01", "patch", "-p", SHIPPED, check=True)
    target = lab.node("lab01").module_file(WORKER)
    target.write_text(
        target.read_text() + "\n# vLLM < 0.16 called self.get_input_embeddings(input_ids) here\n"
    )
    rc, doc = fab_json(lab.root, "-H", "lab01", "verify", "-p", SHIPPED, "--kinds", "grep")
    assert rc == 0, doc
    assert _kinds(doc)["worker-no-direct-get-input-embeddings"]["status"] == "ok"


def test_a_comment_does_not_satisfy_a_match(fresh):
    # The unpatched node, whose fixes are only mentioned: in comments, and in a string that looks
    # like code.
    lab = fresh
    generator = lab.node("lab01").module_file(GENERATOR)
    generator.write_text(
        generator.read_text() + "\n# TODO: self.executor.sample_tokens(None) after execute_model\n"
        'NOTES = """\n    enable_chunked_prefill=False,\n"""\n'
    )
    worker = lab.node("lab01").module_file(WORKER)
    worker.write_text(worker.read_text() + "\n# vLLM 0.16: self.embed_input_ids(input_ids)\n")
    rc, doc = fab_json(lab.root, "-H", "lab01", "verify", "-p", SHIPPED, "--kinds", "grep")
    assert rc == 1
    items = _kinds(doc)
    for name in (
        "sample-tokens-after-execute-model",
        "chunked-prefill-off",
        "worker-embed-input-ids",
    ):
        assert items[name]["status"] == "failed", items[name]
        assert "only in comments or strings" in items[name]["msg"], items[name]


def test_a_raw_text_check_that_disagrees_with_the_behaviour_checks_is_named_in_the_verdict(fresh):
    lab = fresh
    book = lab.root / "playbooks/text-check.yaml"
    text = (
        (lab.root / SHIPPED)
        .read_text()
        .replace(
            "  - name: worker-no-direct-get-input-embeddings\n",
            "  - name: worker-no-direct-get-input-embeddings\n    search: text\n",
            1,
        )
    )
    book.write_text(text)
    run_fab(lab.root, "-H", "lab01", "patch", "-p", SHIPPED, check=True)
    target = lab.node("lab01").module_file(WORKER)
    target.write_text(
        target.read_text() + "\n# vLLM < 0.16 called self.get_input_embeddings(input_ids) here\n"
    )
    rc, doc = fab_json(
        lab.root,
        "-H",
        "lab01",
        "verify",
        "-p",
        "playbooks/text-check.yaml",
        "--kinds",
        "grep,callsites,probe",
    )
    assert rc == 1, doc
    result = doc["results"][0]
    items = _kinds(doc)
    assert (
        items["vllm-callsites"]["status"] == "ok"
        and items["every-prompt-token-through-the-model"]["status"] == "ok"
    )
    assert items["worker-no-direct-get-input-embeddings"]["status"] == "failed"
    assert "text check disagrees with the behaviour checks" in result["msg"], result["msg"]
    assert (
        "text check disagrees with the behaviour checks"
        in items["worker-no-direct-get-input-embeddings"]["msg"]
    )
