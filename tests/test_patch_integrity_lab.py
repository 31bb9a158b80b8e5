"""Patch integrity against real sshd lab nodes and the real speculators 0.3.0 files in their venvs:
backups the node cannot forge alone, all-or-nothing patch sets, one lock per shared venv, and
rollback that keeps later edits or refuses. Every attack or fault from the issue's "Why" is replayed
here and must now be refused or handled; what each test expects comes from pip's RECORD and GNU
patch (faultkit), never from the node-side code under test.

A module of its own with a 2-node lab (a throwaway project) plus a shared-venv inventory: shA
(lab01's sshd) and shB (lab02's sshd), each with its own state dir, both running lab01's python: one
site-packages."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import GENERATOR, WORKER, fab_json, record_sha256, run_fab
from faultkit import (
    arm,
    disarm,
    failpoints_hit,
    file_sha,
    hit_file,
    independent_forms,
    reset_node,
    wait_for,
)

from fleetops import api
from fleetops.lab import site_packages

pytestmark = pytest.mark.lab
NODES = ("lab01", "lab02")
MODULES = (GENERATOR, WORKER)
LOCK_NAME = ".fleetops-patch.lock"
# 4 racing rounds: the patch-vs-rollback race twice from each start form (odd rounds patched, even
# pristine), each round also racing two patches and two rollbacks; that a host waits for the other's
# lock is proven with the lock held on purpose (test_a_host_sharing_the_venv_waits_...).
# FLEETOPS_RACE_ROUNDS=20 is the longer soak.
RACE_ROUNDS = int(os.environ.get("FLEETOPS_RACE_ROUNDS") or 4)


@pytest.fixture(scope="module")
def lab2(lab_factory):
    lab = lab_factory.shared(2, __name__)
    n1, n2 = lab.node("lab01"), lab.node("lab02")
    lines = ["hosts:"]
    for name, node in (("shA", n1), ("shB", n2)):
        lines += [
            f"  {name}:",
            "    address: 127.0.0.1",
            f"    port: {node.port}",
            f"    user: {lab.user}",
            f"    identity_file: {lab.client_key}",
            f"    known_hosts: {lab.known_hosts}",
            f"    python: {n1.python}",
            f"    state_dir: {node.dir / ('state-' + name)}",
        ]
    (lab.root / "hosts" / "shared.yaml").write_text("\n".join(lines) + "\n")
    return lab


@pytest.fixture
def lab(lab2):
    for name in NODES:
        node = lab2.node(name)
        lab2.start_node(node)
        reset_node(lab2, node)
        disarm(node)
        (site_packages(node.venv) / LOCK_NAME).unlink(missing_ok=True)
        for shared in node.dir.glob("state-sh*"):
            shutil.rmtree(shared)
    return lab2


def forms(lab) -> dict[str, dict[str, str]]:
    return independent_forms(lab.node("lab01"))


def form_of(node, module: str, known: dict) -> str:
    got = file_sha(node, module)
    return next((f for f, s in known[module].items() if s == got), "NEITHER")


def items(doc: dict) -> dict[str, dict]:
    return {i["label"]: i for r in doc["results"] for i in r["items"]}


def audit_lines(host: str, task: str) -> list[dict]:
    path = Path(os.environ["FLEETOPS_AUDIT_LOG"])
    if not path.exists():
        return []
    return [
        e
        for e in map(json.loads, path.read_text().splitlines())
        if e["host"] == host and e["task"] == task
    ]


def backup_of(node, module: str) -> tuple[Path, Path]:
    """The backup (.orig) and its record (.json), found by the path the record names."""
    target = os.path.realpath(node.module_file(module))
    for record in (node.state_dir / "backups").glob("*.json"):
        if json.loads(record.read_text()).get("path") == target:
            return record.with_suffix(".orig"), record
    raise AssertionError(f"no backup record for {target}")


# ---------------------------------------------------------------- item 1: backups the node cannot
# forge alone
def test_a_forged_backup_with_a_matching_record_is_never_restored(lab):
    """The issue: a tampered backups/<key>-custom_worker.py.orig plus a matching .json was restored
    by rollback ("restored the saved original (sha256 … verified)") and then imported as root by
    verify."""
    node, known = lab.node("lab01"), forms(lab)
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0, doc
    orig, record = backup_of(node, WORKER)
    evil = orig.read_bytes() + b"\nimport os; os.system('touch /tmp/fleetops-pwned')  # planted\n"
    orig.write_bytes(evil)
    rec = json.loads(record.read_text())
    rec["original_sha256"] = hashlib.sha256(evil).hexdigest()  # the node's own tag, forged to match
    record.write_text(json.dumps(rec))

    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback")
    assert rc == 1, doc
    worker = items(doc)[WORKER]
    assert worker["status"] == "failed", worker
    assert (
        str(orig) in worker["msg"]
        and "is not the original" in worker["msg"]
        and "RECORD" in worker["msg"]
    )
    assert items(doc)[GENERATOR]["status"] == "skipped", (
        "the set is all-or-nothing: the generator stays too"
    )
    assert (
        form_of(node, WORKER, known) == "patched" and form_of(node, GENERATOR, known) == "patched"
    )
    assert b"planted" not in node.module_file(WORKER).read_bytes()

    # --force on a drifted file: the forged backup is the only source, and it is refused all the
    # same.
    target = node.module_file(WORKER)
    target.write_text(
        target.read_text().replace(
            "hidden_states = self.embed_input_ids(input_ids)",
            "hidden_states = self.embed_input_ids(input_ids)  # local",
        )
    )
    drifted = file_sha(node, WORKER)
    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback", "--force")
    assert rc == 1, doc
    assert "is not the original" in items(doc)[WORKER]["msg"]
    assert file_sha(node, WORKER) == drifted and b"planted" not in target.read_bytes()

    # Moved aside, the hunks alone roll back, and the result is proven against pip's RECORD.
    target.write_text(target.read_text().replace("  # local", ""))
    orig.rename(orig.with_name(orig.name + ".evidence"))
    record.rename(record.with_name(record.name + ".evidence"))
    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback")
    assert rc == 0, doc
    assert "verified against the wheel's RECORD" in items(doc)[WORKER]["msg"]
    for module in MODULES:
        assert file_sha(node, module) == record_sha256(site_packages(node.venv), module)


# ---------------------------------------------------------------- item 3: all-or-nothing sets
def test_a_drifted_file_writes_no_file_of_the_set_and_every_report_agrees(lab):
    """The issue: with one file drifted inside a hunk, patch wrote the other: `failed | 1 applied, 1
    drifted`, recap `changed 0`, audit `"changed": false, "exit_status": 0`."""
    node, known = lab.node("lab01"), forms(lab)
    target = node.module_file(WORKER)
    target.write_text(
        target.read_text().replace(
            "            else self.get_input_embeddings(input_ids)\n",
            "            else self.get_input_embeddings(input_ids)  # ours\n",
        )
    )
    drifted = file_sha(node, WORKER)
    before = len(audit_lines("lab01", "patch"))
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 1, doc
    (result,) = doc["results"]
    assert result["status"] == "failed" and result["changed"] is False
    assert (
        doc["exit_status"] == 1
        and doc["recap"]["lab01"]["failed"] == 1
        and doc["recap"]["lab01"]["changed"] == 0
    )
    assert (
        "applied" not in result["msg"]
        and "1 drifted" in result["msg"]
        and "1 not written" in result["msg"]
    )
    assert items(doc)[WORKER]["status"] == "failed" and items(doc)[WORKER]["details"]["drift"]
    gen = items(doc)[GENERATOR]
    assert gen["status"] == "skipped" and "all-or-nothing" in gen["msg"] and WORKER in gen["msg"]
    assert form_of(node, GENERATOR, known) == "pristine" and file_sha(node, WORKER) == drifted
    assert not (node.state_dir / "backups").exists() or not list(
        (node.state_dir / "backups").iterdir()
    )
    # the intent line, written before any write
    intent, line = audit_lines("lab01", "patch")[before:]
    assert intent["result"] == "started" and intent["exit_status"] is None, intent
    assert (line["result"], line["changed"], line["exit_status"]) == ("failed", False, 1), line

    human = run_fab(lab.root, "-H", "lab01", "patch")
    assert human.returncode == 1
    assert "failed hosts: lab01  (exit status 1)" in human.stdout, human.stdout
    assert "1 drifted" in human.stdout and "not written" in human.stdout, human.stdout
    assert "Traceback" not in human.stdout + human.stderr
    assert form_of(node, GENERATOR, known) == "pristine"


def test_a_corrupt_backup_record_of_the_second_file_never_leaves_the_first_alone_patched(lab):
    """The issue: a corrupt backup record for the second file left the first silently patched."""
    node, known = lab.node("lab01"), forms(lab)
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch", "rollback")
    assert rc == 0, doc
    _, record = backup_of(node, WORKER)
    record.write_text('{"path": "/etc/shadow", "original_sha256": ')  # torn / corrupt
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    # Either the whole set or nothing; here the corrupt record is moved aside (reported) and the set
    # applied.
    assert {form_of(node, m, known) for m in MODULES} in ({"patched"}, {"pristine"}), doc
    assert rc == 0, doc
    (aside,) = record.parent.glob(record.name + ".corrupt-*")  # the evidence, moved aside
    assert aside.read_text().startswith('{"path": "/etc/shadow"')
    fresh = json.loads(record.read_text())  # and a new record of the file this run saw
    assert fresh["original_sha256"] == record_sha256(site_packages(node.venv), WORKER)
    quarantined = doc["results"][0]["data"].get("quarantined") or []
    assert any(q["path"] == str(record) for q in quarantined), doc["results"][0]["data"]


def test_a_write_that_fails_midway_puts_the_files_already_written_back(lab):
    node, known = lab.node("lab01"), forms(lab)
    # the worker's write: EIO
    arm(node, {"patch.target.before_rename": {"action": "raise", "skip": 1}})
    try:
        rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    finally:
        disarm(node)
    assert rc == 1, doc
    assert doc["results"][0]["changed"] is False and doc["results"][0]["status"] == "failed"
    gen, worker = items(doc)[GENERATOR], items(doc)[WORKER]
    assert (
        worker["status"] == "failed"
        and "cannot patch" in worker["msg"]
        and "unchanged" in worker["msg"]
    ), worker
    assert gen["status"] == "skipped" and "put back" in gen["msg"], gen
    assert {m: form_of(node, m, known) for m in MODULES} == {
        GENERATOR: "pristine",
        WORKER: "pristine",
    }
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0 and {form_of(node, m, known) for m in MODULES} == {"patched"}, doc


def test_no_room_or_a_read_only_file_system_refuses_the_set_before_any_write(lab):
    """Free space and writability are checked for the whole set first. The files' directory becomes
    a tmpfs with room for about one more copy of the generator (before: the generator was written,
    then the worker's write failed: a half-patched set), then read-only."""
    if os.geteuid() != 0:
        pytest.fail(
            "mounting a small tmpfs over the node's package directory needs root", pytrace=False
        )
    node, known = lab.node("lab01"), forms(lab)
    where = node.module_file(GENERATOR).parent
    saved = {p.name: p.read_bytes() for p in where.iterdir() if p.is_file()}
    used = sum(len(b) // 4096 + 1 for b in saved.values()) * 4096
    room = len(saved[node.module_file(GENERATOR).name]) + 8192
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={used + room},mode=755", "tmpfs", str(where)],
        check=True,
    )
    try:
        for name, data in saved.items():
            (where / name).write_bytes(data)
        rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
        assert rc == 1, doc
        assert doc["results"][0]["changed"] is False
        msgs = [i["msg"] for i in items(doc).values()]
        assert any("not enough free space" in m and str(where) in m for m in msgs), msgs
        assert {form_of(node, m, known) for m in MODULES} == {"pristine"}
        assert not (node.state_dir / "backups").exists() or not list(
            (node.state_dir / "backups").iterdir()
        )

        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
        assert rc == 1, doc
        msgs = [i["msg"] for i in items(doc).values()]
        assert any("read-only file system" in m for m in msgs), msgs
        assert {form_of(node, m, known) for m in MODULES} == {"pristine"}
    finally:
        subprocess.run(["umount", str(where)], check=True)
    assert {form_of(node, m, known) for m in MODULES} == {"pristine"}


# ---------------------------------------------------------------- item 5: rollback keeps later
# edits or refuses
def test_rollback_keeps_an_edit_made_after_the_patch(lab):
    """The issue: `rollback` discards edits made after the patch: a line appended outside the hunks
    vanished."""
    node = lab.node("lab01")
    site = site_packages(node.venv)
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0, doc
    target = node.module_file(GENERATOR)
    note = "\n# operator: keep the cache dir on the local disk\n"
    target.write_text(target.read_text() + note)
    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback")
    assert rc == 0, doc
    gen = items(doc)[GENERATOR]
    assert gen["status"] == "changed" and "kept" in gen["msg"], gen
    text = target.read_text()
    assert text.endswith(note), "the edit made after the patch was discarded"
    assert hashlib.sha256(text[: -len(note)].encode()).hexdigest() == record_sha256(site, GENERATOR)
    assert file_sha(node, WORKER) == record_sha256(site, WORKER)


def test_rollback_of_a_file_edited_inside_a_hunk_refuses_with_details_and_force_restores(lab):
    node, known = lab.node("lab01"), forms(lab)
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0, doc
    target = node.module_file(GENERATOR)
    text = target.read_text()
    assert "            enable_prefix_caching=False,\n" in text
    target.write_text(
        text.replace(
            "            enable_prefix_caching=False,\n",
            "            enable_prefix_caching=True,  # tried it\n",
        )
    )
    drifted = file_sha(node, GENERATOR)
    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback")
    assert rc == 1, doc
    gen = items(doc)[GENERATOR]
    assert gen["status"] == "failed" and "drifted" in gen["msg"] and "--force" in gen["msg"], gen
    drift = gen["details"]["drift"]
    assert drift and any(
        "enable_prefix_caching=True,  # tried it" in " ".join(d.get("found", [])) for d in drift
    )
    assert items(doc)[WORKER]["status"] == "skipped"
    assert file_sha(node, GENERATOR) == drifted and form_of(node, WORKER, known) == "patched"

    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback", "--force")
    assert rc == 0, doc
    assert "--force" in items(doc)[GENERATOR]["msg"] and "RECORD" in items(doc)[GENERATOR]["msg"]
    assert {form_of(node, m, known) for m in MODULES} == {"pristine"}


def test_rollback_of_a_file_never_patched_is_a_noop_that_says_so(lab):
    """The issue: rollback of a never-patched file says it is "neither the saved original nor the
    patched form"; a pristine file that differs from an old backup gets `drifted`, exit 1, with no
    details."""
    node, known = lab.node("lab01"), forms(lab)
    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback")
    assert rc == 0, doc
    assert doc["results"][0]["status"] == "ok"
    for module in MODULES:
        assert items(doc)[module]["msg"].startswith("not patched by fleetops; nothing to do"), (
            items(doc)[module]
        )

    # An old backup, then the package reinstalled and edited outside the hunks: pristine, yet not
    # the backup.
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0, doc
    lab.reset_packages(node)
    target = node.module_file(WORKER)
    target.write_text(target.read_text() + "\n# site-local comment\n")
    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback")
    assert rc == 0, doc
    worker = items(doc)[WORKER]
    assert worker["status"] == "ok" and worker["msg"].startswith("not patched by fleetops"), worker
    assert any("not used" in n for n in worker["details"].get("notes", [])), worker
    assert form_of(node, GENERATOR, known) == "pristine"


# ---------------------------------------------------------------- item 4: a shared venv is patched
# once
def _agents_holding(path: Path, marker: str) -> list[int]:
    """Pids of processes whose command line names `marker` and that hold `path` open (evidence from
    /proc)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker.encode() not in (proc / "cmdline").read_bytes():
                continue
            if any(os.readlink(fd) == str(path) for fd in (proc / "fd").iterdir()):
                out.append(int(proc.name))
        except OSError:
            continue
    return out


def test_a_host_sharing_the_venv_waits_for_the_other_and_says_who_applied(lab):
    """Deterministic: shA's agent is paused inside its set (after saving its first backup); shB's
    agent is seen by /proc holding the venv's lock file open (blocked on it) while the files are
    still pristine; once shA goes on, shB reports "already applied (by shA)" and that it waited."""
    n1, n2, known = lab.node("lab01"), lab.node("lab02"), forms(lab)
    lock_file = site_packages(n1.venv) / LOCK_NAME
    hit = hit_file(n1, "patch.after_backup")
    hit.unlink(missing_ok=True)
    arm(n1, {"patch.after_backup": {"action": "pause", "seconds": 300}})
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    fab = [sys.executable, "-m", "fabric"]
    first = subprocess.Popen(
        [*fab, "-H", "shA", "patch", "--json"],
        cwd=lab.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    second = None
    try:
        wait_for(
            lambda: hit.exists() or first.poll() is not None,
            "shA's agent to pause inside its set",
            120,
        )
        disarm(n1)
        assert hit.exists(), first.communicate()
        holder = int(hit.read_text())
        second = subprocess.Popen(
            [*fab, "-H", "shB", "patch", "--json"],
            cwd=lab.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        waiting = wait_for(
            lambda: _agents_holding(lock_file, str(n2.dir / "state-shB")),
            "shB's agent to wait on the venv's lock",
            120,
        )
        assert holder not in waiting and second.poll() is None
        assert {form_of(n1, m, known) for m in MODULES} == {"pristine"}
    finally:
        hit.unlink(missing_ok=True)
    out1, err1 = first.communicate(timeout=300)
    out2, err2 = second.communicate(timeout=300)
    assert first.returncode == 0 and second.returncode == 0, (out1, err1, out2, err2)
    a, b = json.loads(out1)["results"][0], json.loads(out2)["results"][0]
    assert a["status"] == "changed" and b["status"] == "ok", (a["msg"], b["msg"])
    for item in b["items"]:
        assert "already applied (by shA" in item["msg"], item["msg"]
        assert any(
            f"waited for shA (patch, pid {holder})" in n for n in item["details"]["notes"]
        ), item
    assert {form_of(n1, m, known) for m in MODULES} == {"patched"}


def test_two_hosts_sharing_a_venv_serialize_and_patch_it_once(lab):
    """The issue: two inventory hosts, different state dirs, same site-packages: concurrent runs
    both reported `2 applied`; a rollback racing a patch left the generator patched and the worker
    pristine. Here: RACE_ROUNDS rounds of both hosts patching at once, both rolling back at once,
    and one patching while the other rolls back; a watcher reads both files all along."""
    node, known = lab.node("lab01"), forms(lab)
    seen: dict[str, set[str]] = {m: set() for m in MODULES}
    stop = threading.Event()
    bad: list[str] = []

    samples = [0]

    def watch() -> None:
        while not stop.is_set():
            for module in MODULES:
                try:
                    form = form_of(node, module, known)
                except OSError as exc:  # an atomic rename never leaves the path missing
                    form = f"unreadable: {exc}"
                seen[module].add(form)
                if form not in ("pristine", "patched"):
                    bad.append(f"{module}: {form}")
            samples[0] += 1
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    applied, restored, mixed_ends = [], [], []
    # rounds where the second host's agent found the first inside the venv's lock and waited
    waited = 0
    started = time.monotonic()
    try:
        for rnd in range(RACE_ROUNDS):
            results = api.run(lab.root, "shA,shB", [("patch", {})], forks=2)
            changed = [r for r in results if r.status.value == "changed"]
            applied.append(len(changed))
            waited += any(
                "waited for" in n
                for r in results
                for i in r.items
                for n in i.details.get("notes", [])
            )
            assert len(changed) == 1, [(r.host, r.status.value, r.msg) for r in results]
            (other,) = [r for r in results if r is not changed[0]]
            assert other.status.value == "ok", other.msg
            for item in other.items:
                assert f"already applied (by {changed[0].host}" in item.msg, item.msg
            assert {form_of(node, m, known) for m in MODULES} == {"patched"}

            results = api.run(lab.root, "shA,shB", [("rollback", {})], forks=2)
            changed = [r for r in results if r.status.value == "changed"]
            restored.append(len(changed))
            assert len(changed) == 1 and all(
                r.status.value in ("ok", "changed") for r in results
            ), [(r.host, r.status.value, r.msg) for r in results]
            assert {form_of(node, m, known) for m in MODULES} == {"pristine"}

            # one host patches while the other rolls back: either order, never half of each
            if rnd % 2:  # odd rounds race from the patched form, even ones from the pristine form
                assert api.run(lab.root, "shB", [("patch", {})])[0].status.value == "changed"
            procs = [
                subprocess.Popen(
                    [sys.executable, "-m", "fabric", "-H", host, op, "--json"],
                    cwd=lab.root,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
                )
                for host, op in (("shA", "patch"), ("shB", "rollback"))
            ]
            outs = [p.communicate(timeout=300) for p in procs]
            for p, (out, err) in zip(procs, outs):
                assert p.returncode == 0, (out, err)
            ends = {form_of(node, m, known) for m in MODULES}
            assert len(ends) == 1, f"round {rnd}: the race left {ends}"
            mixed_ends.append(ends.pop())
            if mixed_ends[-1] == "patched":
                assert api.run(lab.root, "shA", [("rollback", {})])[0].status.value == "changed"
        assert watcher.is_alive(), "the watcher stopped early"
    finally:
        stop.set()
        watcher.join(timeout=10)
    took = time.monotonic() - started
    print(
        f"\nshared venv, 2 hosts x {RACE_ROUNDS} rounds in {took:.0f}s ({waited} patch rounds "
        f"had one host wait on the other's lock): applied per round {applied}, restored per "
        f"round {restored}; patch-vs-rollback races ended {mixed_ends.count('patched')}x "
        f"patched, {mixed_ends.count('pristine')}x pristine; the watcher read both files "
        f"{samples[0]} times and saw "
        f"{ {m.rsplit('.', 1)[1]: sorted(f) for m, f in seen.items()} }"
    )
    assert not bad, f"a file was seen in neither known form: {bad}"
    assert applied == [1] * RACE_ROUNDS and restored == [1] * RACE_ROUNDS
    assert all(s <= {"pristine", "patched"} for s in seen.values())


# ---------------------------------------------------------------- kill at every write of the
# two-file set
@pytest.mark.parametrize("op", ["patch", "rollback"])
def test_a_kill_at_every_write_of_the_set_never_leaves_it_half_done_after_the_next_run(lab, op):
    """SIGKILL at every write of both files (targets, backups, backup records, the lock info): right
    after the kill each file is whole (one of the two known forms); the next run, of either
    operation, finishes the set in its own direction and says when an earlier writer died
    mid-set."""
    node, known = lab.node("lab01"), forms(lab)
    done, before = ("patched", "pristine") if op == "patch" else ("pristine", "patched")
    if op == "rollback":
        assert fab_json(lab.root, "-H", "lab01", "patch")[0] == 0
    points = failpoints_hit(lab, node, op)
    per_file = [p for p in points if p[0].startswith(op + ".")]
    assert {p for p, _ in per_file} >= {f"{op}.target.before_rename", f"{op}.target.after_rename"}
    assert max(n for p, n in per_file if p == f"{op}.target.after_rename") == 2, (
        "both files' writes enumerated"
    )
    if op == "patch":
        assert max(n for p, n in per_file if p == "patch.backup.before_rename") == 2
        assert max(n for p, n in per_file if p == "patch.record.before_rename") == 2
    tally = {"killed": 0, "mixed right after": 0, "whole after the next run": 0, "reported": 0}
    for i, (point, n) in enumerate(points):
        lab.reset_packages(node)
        for sub in ("backups", "lock.json"):
            target = node.state_dir / sub
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        if op == "rollback":
            assert fab_json(lab.root, "-H", "lab01", "patch")[0] == 0
        arm(node, {point: {"action": "kill", "skip": n - 1}})
        try:
            rc, doc = fab_json(lab.root, "-H", "lab01", op)
        finally:
            disarm(node)
        assert rc != 0 and doc["results"][0]["status"] == "failed", (
            f"{point} hit {n}: not killed? {doc}"
        )
        tally["killed"] += 1
        now = {m: form_of(node, m, known) for m in MODULES}
        assert set(now.values()) <= {"pristine", "patched"}, f"kill at {point} hit {n}: {now}"
        tally["mixed right after"] += len(set(now.values())) > 1
        # the next run: the same operation for even points, the other one for odd points
        again = op if i % 2 == 0 else ("rollback" if op == "patch" else "patch")
        rc, doc = fab_json(lab.root, "-H", "lab01", again)
        assert rc == 0, f"after a kill at {point} hit {n}, {again}: {doc}"
        want = done if again == op else before
        ends = {m: form_of(node, m, known) for m in MODULES}
        assert set(ends.values()) == {want}, f"kill at {point} hit {n}, then {again}: {ends}"
        tally["whole after the next run"] += 1
        notes = [
            x for r in doc["results"] for it in r["items"] for x in it["details"].get("notes", [])
        ]
        if point.startswith(op + "."):  # killed after the set's writing began: the next run says so
            assert any("died before finishing this set" in x for x in notes), (point, n, notes)
            tally["reported"] += 1
    print(f"\n{op}: {len(points)} write points killed: {tally}")
    assert tally["killed"] == tally["whole after the next run"] == len(points)
