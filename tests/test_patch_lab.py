"""patch / rollback / verify against real sshd lab nodes and the real speculators 0.3.0 file."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (
    GENERATOR,
    disconnect_all,
    fab_json,
    on_openssh,
    record_sha256,
    run_fab,
    sha256,
)
from faultkit import hit_file
from pausekit import patch_holding_the_lock
from sshd_evidence import agent_zips, clear_agent_cache, logs_for

from fleetops.lab import site_packages
from fleetops.wire.bundle import agent_bundle

pytestmark = pytest.mark.lab
BOTH = ["lab01", "lab02"]


def items(doc: dict, task: str) -> list[dict]:
    return [i for r in doc["results"] if r["task"] == task for i in r["items"]]


def test_patch_twice_then_rollback_twice_restores_the_installed_bytes(lab):
    node = lab.node("lab01")
    target = node.module_file(GENERATOR)
    installed = record_sha256(site_packages(node.venv), GENERATOR)
    assert sha256(target) == installed

    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0, doc
    assert doc["results"][0]["status"] == "changed"
    assert items(doc, "patch")[0]["details"]["original_sha256"] == installed
    assert "kv_cache_specs=kv_cache_spec" not in target.read_text()

    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0 and doc["results"][0]["status"] == "ok"
    assert "already applied" in items(doc, "patch")[0]["msg"]

    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback")
    assert rc == 0 and doc["results"][0]["status"] == "changed"
    assert sha256(target) == installed

    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback")
    assert rc == 0 and doc["results"][0]["status"] == "ok"
    assert "already original" in items(doc, "rollback")[0]["msg"]
    assert sha256(target) == installed


def test_patch_leaves_other_node_untouched_and_removes_stale_bytecode(lab):
    n1, n2 = lab.node("lab01"), lab.node("lab02")
    before = sha256(n2.module_file(GENERATOR))
    tag = subprocess.run(
        [str(n1.python), "-c", "import sys; print(sys.implementation.cache_tag)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    pyc = (
        n1.module_file(GENERATOR).parent / "__pycache__" / f"vllm_hidden_states_generator.{tag}.pyc"
    )
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(b"stale")
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0
    assert not pyc.exists()
    assert str(pyc) in items(doc, "patch")[0]["details"]["bytecode_removed"]
    assert sha256(n2.module_file(GENERATOR)) == before


def test_check_mode_prints_the_diff_and_writes_nothing(lab):
    target = lab.node("lab01").module_file(GENERATOR)
    before = sha256(target)
    proc = run_fab(lab.root, "-H", "lab01", "patch", "--check")
    assert proc.returncode == 0, proc.stderr
    assert "-            kv_cache_specs=kv_cache_spec," in proc.stdout
    assert "check mode" in proc.stdout
    assert sha256(target) == before
    assert not (lab.node("lab01").state_dir / "backups").exists()


def test_drifted_file_is_refused_with_expected_and_found_lines(lab):
    target = lab.node("lab01").module_file(GENERATOR)
    text = target.read_text().replace(
        "            kv_cache_groups=kv_cache_groups,\n",
        "            kv_cache_groups=groups,  # local edit\n",
    )
    target.write_text(text)
    before = sha256(target)
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 1
    item = items(doc, "patch")[0]
    assert item["status"] == "failed" and "drifted" in item["msg"]
    drift = item["details"]["drift"][0]
    assert drift["hunk"] == 1
    assert drift["first_difference"]["expected"] == "            kv_cache_groups=kv_cache_groups,"
    assert drift["first_difference"]["found"] == "            kv_cache_groups=groups,  # local edit"
    assert sha256(target) == before
    human = run_fab(lab.root, "-H", "lab01", "patch")
    assert "expected '            kv_cache_groups=kv_cache_groups,'" in human.stdout
    assert sha256(target) == before


def test_verify_fails_on_unpatched_and_passes_after_patch(lab):
    rc, doc = fab_json(lab.root, "-H", "lab01", "verify", "--kinds", "grep,compile")
    assert rc == 1
    grep = [i for i in items(doc, "verify") if i["label"].startswith("kv-cache-config-call")][0]
    assert grep["status"] == "failed"
    assert grep["details"]["evidence"][0]["text"] == "kv_cache_specs=kv_cache_spec,"
    assert grep["details"]["evidence"][0]["line"] == 139
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch", "verify", "--kinds", "grep,compile")
    assert rc == 0, doc
    assert all(i["status"] == "ok" for i in items(doc, "verify"))


def test_patch_verify_uses_one_connection_and_uploads_the_agent_once(lab):
    """Counted by the nodes (sshd and sftp-server logs, the agent file's inode), compared with the
    tool's own counters. The agent cache is emptied first, so the first run must upload, and the
    second must not."""
    bundle = agent_bundle()
    for name in BOTH:
        assert clear_agent_cache(lab.node(name)) is not None
        assert agent_zips(lab.node(name)) == {}
    openssh = on_openssh()
    if openssh:
        disconnect_all()  # the first run logs in afresh on either transport
    logs = logs_for(lab, BOTH)
    both_runs = logs_for(lab, BOTH)
    env = {"FLEETOPS_TRACE": "1"}
    rc, doc = fab_json(lab.root, "-H", "lab01,lab02", "patch", "verify", "--kinds", "grep", env=env)
    assert rc == 0, doc
    shipped = {}
    for name in BOTH:
        node, wire = lab.node(name), logs[name].settled()
        # 1 connection; the first exec finds no agent (the bootstrap refuses, nothing runs), one
        # upload, then the one agent of the run answers patch and verify: 2 execs, all on it.
        assert wire.counts() == {"connections": 1, "execs": 2, "uploads": 1}, wire.describe()
        assert list(wire.execs) == wire.accepted, wire.describe()
        assert wire.uploads == [f"{node.state_dir}/bin/{bundle.filename}"], wire.describe()
        assert wire.upload_bytes == [len(bundle.data)], wire.describe()
        assert doc["counters"][name] == wire.counts(), (
            f"tool counters {doc['counters'][name]}; {wire.describe()}"
        )
        print(
            f"first run, {name}: node logs {wire.counts()}, tool counters {doc['counters'][name]}"
        )
        shipped[name] = agent_zips(node)
        assert list(shipped[name]) == [bundle.filename]
        assert sha256(node.state_dir / "bin" / bundle.filename) == bundle.sha256

    for one in logs.values():
        one.mark()
    rc, doc = fab_json(lab.root, "-H", "lab01,lab02", "patch", "verify", "--kinds", "grep", env=env)
    assert rc == 0, doc
    for name in BOTH:
        wire = logs[name].settled()
        # one agent; paramiko: on a connection of its own, openssh: on the first run's master (no
        # new login)
        assert wire.counts() == {"connections": 0 if openssh else 1, "execs": 1, "uploads": 0}, (
            wire.describe()
        )
        if openssh:
            assert len(both_runs[name].settled().accepted) == 1, (
                both_runs[name].settled().describe()
            )
        assert wire.sftp_sessions == 0, wire.describe()
        assert doc["counters"][name] == wire.counts(), (
            f"tool counters {doc['counters'][name]}; {wire.describe()}"
        )
        # same inode and mtime: not written again
        assert agent_zips(lab.node(name)) == shipped[name]
        print(
            f"second run, {name}: node logs {wire.counts()}, tool counters {doc['counters'][name]}"
        )


def test_two_patch_runs_at_once_one_is_refused_by_the_lock(lab):
    node = lab.node("lab01")
    target = node.module_file(GENERATOR)
    # Hold the first run inside its locked section until the second has been refused: the node's
    # failpoint pauses the agent until this test deletes its .hit file (which names the holding
    # agent's pid), so there is no timing window however slow a fab start-up is on a loaded machine.
    hit = hit_file(node, "lock.acquired")
    with patch_holding_the_lock(lab.root, node) as (first, holder):
        try:
            rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
            assert Path(f"/proc/{holder}").exists(), (
                "the first run's agent left the lock before the second arrived"
            )
        finally:
            hit.unlink(missing_ok=True)  # release the first run
        assert rc == 1
        msg = doc["results"][0]["msg"]
        assert "locked by" in msg and "since" in msg and f"(patch, pid {holder})" in msg
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert json.loads(out)["results"][0]["status"] == "changed"
    assert "kv_cache_specs=kv_cache_spec" not in target.read_text()
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0 and doc["results"][0]["status"] == "ok"


def test_stale_lock_of_a_dead_holder_is_taken_over(lab):
    node = lab.node("lab01")
    (node.state_dir / "lock.json").write_text(
        json.dumps(
            {
                "operator": "ghost@gone",
                "op": "patch",
                "pid": 999999,
                "since": "2026-01-01T00:00:00Z",
            }
        )
    )
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0
    notes = items(doc, "patch")[0]["details"]["notes"]
    assert "took over a stale lock from ghost@gone" in notes[0]


def test_module_outside_site_packages_is_refused(lab, tmp_path):
    book = tmp_path / "outside.yaml"
    diff = tmp_path / "json.diff"
    diff.write_text("--- a/json/__init__.py\n+++ b/json/__init__.py\n@@ -1,1 +1,1 @@\n-x\n+y\n")
    book.write_text(f"name: outside\npatches:\n  - module: json\n    diff: {diff}\n")
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch", "--playbook", str(book))
    assert rc == 1
    assert "outside this interpreter's site-packages" in items(doc, "patch")[0]["msg"]


def test_malformed_playbook_names_file_and_line_and_connects_nowhere(lab, tmp_path):
    book = tmp_path / "bad.yaml"
    book.write_text("name: bad\npatches:\n  - module: x\n    diff: [unclosed\n")
    proc = run_fab(lab.root, "-H", "lab01", "patch", "--playbook", str(book))
    assert proc.returncode == 2
    assert f"{book}:5" in proc.stderr or f"{book}:4" in proc.stderr
    book.write_text(
        "name: bad\nverify:\n  - kind: grep\n    module: a.b\n    pattern: '(unclosed'\n"
    )
    proc = run_fab(lab.root, "-H", "lab01", "verify", "--playbook", str(book))
    assert proc.returncode == 2 and f"{book}:5:5: bad regex" in proc.stderr
    book.write_text("name: bad\nverify:\n  - kind: grep\n    module: a.b\n    patern: x\n")
    proc = run_fab(lab.root, "-H", "lab01", "verify", "--playbook", str(book))
    assert proc.returncode == 2 and f"{book}:5:5: unknown key 'patern'" in proc.stderr


def test_unknown_host_lists_known_names(lab):
    proc = run_fab(lab.root, "-H", "gpu99", "patch")
    assert proc.returncode == 2
    assert "unknown host 'gpu99'" in proc.stderr and "lab01, lab02" in proc.stderr


def test_closed_port_fails_fast_and_other_hosts_still_run(lab):
    extra = lab.root / "hosts" / "extra.yaml"
    extra.write_text(
        f"hosts:\n  deadnode:\n    address: 127.0.0.1\n    port: 1\n    connect_timeout: 3\n"
        f"    identity_file: {lab.client_key}\n    known_hosts: {lab.known_hosts}\n"
    )
    try:
        started = time.monotonic()
        rc, doc = fab_json(lab.root, "-H", "deadnode,lab01", "patch", "verify", "--kinds", "grep")
        took = time.monotonic() - started
    finally:
        extra.unlink()
    assert rc == 4
    by = {(r["host"], r["task"]): r for r in doc["results"]}
    assert by[("deadnode", "patch")]["status"] == "unreachable"
    assert "connection refused" in by[("deadnode", "patch")]["msg"]
    assert by[("deadnode", "verify")]["status"] == "skipped"
    assert (
        by[("lab01", "patch")]["status"] == "changed" and by[("lab01", "verify")]["status"] == "ok"
    )
    assert doc["failed_hosts"] == ["deadnode"]
    assert took < 60


def test_host_key_mismatch_is_refused_with_both_fingerprints(lab, tmp_path):
    node = lab.node("lab01")
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    keytype, key = other.with_suffix(".pub").read_text().split()[:2]
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{node.port} {keytype} {key}\n")
    extra = lab.root / "hosts" / "spoof.yaml"
    extra.write_text(
        f"hosts:\n  spoofed:\n    address: 127.0.0.1\n    port: {node.port}\n"
        f"    identity_file: {lab.client_key}\n    known_hosts: {wrong}\n"
        f"    python: {node.python}\n    state_dir: {node.state_dir}\n"
    )
    try:
        rc, doc = fab_json(lab.root, "-H", "spoofed", "patch")
    finally:
        extra.unlink()
    assert rc == 4
    msg = doc["results"][0]["msg"]
    # Both fingerprints, computed from the key files themselves: the one known_hosts expects and the
    # node's.
    expected, offered = (
        subprocess.run(
            ["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True
        ).stdout.split()[1]
        for pub in (other.with_suffix(".pub"), node.host_key.with_suffix(".pub"))
    )
    assert "does not match known_hosts" in msg and expected in msg and offered in msg, msg
    assert "kv_cache_specs=kv_cache_spec" in node.module_file(GENERATOR).read_text()


def test_shell_metacharacters_in_inventory_are_refused_never_run(lab, tmp_path):
    canary = tmp_path / "pwned"
    extra = lab.root / "hosts" / "evil.yaml"
    extra.write_text(
        f'hosts:\n  evil:\n    address: 127.0.0.1\n    python: "/usr/bin/python3; touch {canary}"\n'
    )
    try:
        proc = run_fab(lab.root, "-H", "lab01", "patch")
    finally:
        extra.unlink()
    assert proc.returncode == 2
    assert f"{extra}:4" in proc.stderr and "'python'" in proc.stderr
    assert not canary.exists()
