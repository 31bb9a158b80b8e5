"""README behaviours that had no test, checked against real lab sshd nodes and the real speculators
0.3.0 files: `rollback --check`, rollback refusing a tampered backup, stale bytecode removed on
rollback, atomic writes keeping the file's mode (and owner), `lab.down --purge` and `lab.reset`.

Expected bytes come from pip's RECORD (the wheel as installed), never from fleetops' own code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from base64 import urlsafe_b64decode
from pathlib import Path

import pytest
from conftest import GENERATOR, WORKER, fab_json, make_project, record_sha256, run_fab, sha256

from fleetops.lab import Lab, Node, pid_alive, port_open, site_packages

pytestmark = pytest.mark.lab
TMP_MARK = ".fleetops-tmp-"  # remote_scripts/core/atomicio.py names its temp files so


def items(doc: dict, task: str) -> dict[str, dict]:
    return {i["label"]: i for r in doc["results"] if r["task"] == task for i in r["items"]}


def backup_of(node: Node, target: Path) -> tuple[Path, dict]:
    """The saved original of `target` and its record, found by the path the record names (not by the
    key's recipe, so a change in how backups are named cannot make this test look at the wrong
    file)."""
    for record_file in sorted((node.state_dir / "backups").glob("*.json")):
        record = json.loads(record_file.read_text())
        if record.get("path") == str(target):
            orig = record_file.with_suffix(".orig")
            assert orig.exists(), f"record {record_file} has no saved original"
            return orig, record
    raise AssertionError(f"no backup record for {target} in {node.state_dir / 'backups'}")


def tree_state(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under `root` with its sha256 and mtime: enough to prove nothing was written."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): (sha256(p), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def record_mismatches(site: Path, package: str = "speculators") -> list[str]:
    """Files of `package` whose bytes differ from pip's RECORD, plus files RECORD does not list."""
    bad, listed = [], set()
    records = list(site.glob(f"{package}-*.dist-info/RECORD"))
    assert len(records) == 1, records
    for line in records[0].read_text().splitlines():
        path, digest, _size = line.rsplit(",", 2)
        if not digest or path.startswith(".."):
            continue
        listed.add(path)
        algo, b64 = digest.split("=", 1)
        assert algo == "sha256", line
        want = urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
        file = site / path
        if not file.exists():
            bad.append(f"{path}: missing")
        elif sha256(file) != want:
            bad.append(f"{path}: sha256 {sha256(file)[:12]}, RECORD says {want[:12]}")
    for file in (site / package).rglob("*"):
        rel = str(file.relative_to(site))
        if file.is_file() and rel not in listed and "__pycache__" not in file.parts:
            bad.append(f"{rel}: not in RECORD")
    return bad


# ---------------------------------------------------------------- rollback --check
def test_rollback_check_shows_the_restore_diff_exits_0_and_writes_nothing(lab):
    node = lab.node("lab01")
    target = node.module_file(GENERATOR)
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0, doc
    patched = sha256(target)
    assert patched != record_sha256(site_packages(node.venv), GENERATOR)
    files_before = tree_state(target.parent)
    state_before = tree_state(node.state_dir / "backups")

    human = run_fab(lab.root, "-H", "lab01", "rollback", "--check")
    assert human.returncode == 0, human.stdout + human.stderr
    # The diff a rollback would apply: the patched-out keyword comes back, the added one goes.
    assert "+            kv_cache_specs=kv_cache_spec," in human.stdout
    assert "-                is_encoder_decoder=False," in human.stdout
    assert "check mode: nothing written" in human.stdout

    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback", "--check")
    assert rc == 0, doc
    result = doc["results"][0]
    assert result["status"] == "changed" and result["data"]["check_mode"] is True
    gen = items(doc, "rollback")[GENERATOR]
    assert gen["msg"].startswith("would restore") and "nothing written" in gen["msg"]
    original = record_sha256(site_packages(node.venv), GENERATOR)
    # names the original it would restore, checked against pip's RECORD
    assert original[:12] in gen["msg"]
    assert "+            kv_cache_specs=kv_cache_spec," in gen["details"]["diff_text"]

    assert sha256(target) == patched
    # nothing written next to it either (no temp, no pyc)
    assert tree_state(target.parent) == files_before
    assert tree_state(node.state_dir / "backups") == state_before


def test_rollback_check_message_does_not_claim_a_restore_happened(lab):
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0, doc
    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback", "--check")
    assert rc == 0, doc
    msg = items(doc, "rollback")[GENERATOR]["msg"]
    assert "restored" not in msg and msg.startswith("would restore the saved original (sha256 "), (
        msg
    )


# ---------------------------------------------------------------- tampered backup
def test_rollback_refuses_a_backup_whose_sha256_does_not_match(lab):
    node = lab.node("lab01")
    target = node.module_file(GENERATOR)
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0, doc
    patched = sha256(target)
    orig, record = backup_of(node, target)
    assert (
        record["original_sha256"]
        == record_sha256(site_packages(node.venv), GENERATOR)
        == sha256(orig)
    )
    tampered = orig.read_bytes().replace(
        b"kv_cache_specs=kv_cache_spec,", b"kv_cache_specs=None,  # tampered"
    )
    assert tampered != orig.read_bytes()
    orig.write_bytes(tampered)

    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback")
    assert rc == 1, doc
    gen = items(doc, "rollback")[GENERATOR]
    assert gen["status"] == "failed"
    assert "does not match its recorded sha256" in gen["msg"] and str(orig) in gen["msg"]
    # left as it was: still the patched file, not the tampered backup
    assert sha256(target) == patched
    assert orig.read_bytes() == tampered  # the evidence is kept for the operator
    human = run_fab(lab.root, "-H", "lab01", "rollback")
    assert human.returncode == 1 and "does not match its recorded sha256" in human.stdout
    assert "Traceback" not in human.stdout + human.stderr
    assert sha256(target) == patched


# ---------------------------------------------------------------- stale bytecode
def test_rollback_removes_the_targets_stale_bytecode_only(lab):
    node = lab.node("lab01")
    target = node.module_file(GENERATOR)
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0, doc
    # Bytecode of the patched file, compiled by the node's own python (its cache tag, its
    # __pycache__ name), in the plain and the optimized flavour; and bytecode of a module rollback
    # does not touch.
    compile_all = (
        "import py_compile, sys\n"
        "for path in sys.argv[1:]:\n"
        "    for level in (-1, 1):\n"
        "        print(py_compile.compile(path, doraise=True, optimize=level))\n"
    )
    other = target.parent / "__init__.py"
    proc = subprocess.run(
        [str(node.python), "-c", compile_all, str(target), str(other)],
        capture_output=True,
        text=True,
        check=True,
    )
    made = [Path(line) for line in proc.stdout.split()]
    stale = [p for p in made if p.name.startswith(target.stem + ".")]
    kept = [p for p in made if p.name.startswith("__init__.")]
    assert len(stale) == 2 and len(kept) == 2 and all(p.exists() for p in made), made
    assert all(p.parent == target.parent / "__pycache__" for p in made)

    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback")
    assert rc == 0, doc
    assert items(doc, "rollback")[GENERATOR]["status"] == "changed"
    assert sha256(target) == record_sha256(site_packages(node.venv), GENERATOR)
    assert [p for p in stale if p.exists()] == [], (
        "bytecode of the patched source survived the rollback"
    )
    assert all(p.exists() for p in kept), "rollback removed bytecode of a module it did not restore"


# ---------------------------------------------------------------- atomic writes keep mode and owner
def test_patch_and_rollback_replace_the_file_atomically_keeping_mode_and_owner(lab):
    node = lab.node("lab01")
    site = site_packages(node.venv)
    targets = [node.module_file(GENERATOR), node.module_file(WORKER)]
    # A mode and (as root) an owner no default would give, so keeping them cannot happen by chance.
    for i, target in enumerate(targets):
        target.chmod(0o640 if i == 0 else 0o604)
        if os.geteuid() == 0:
            os.chown(target, 4321 + i, 5432 + i)
    before = {t: t.stat() for t in targets}

    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0, doc
    for target in targets:
        st, old = target.stat(), before[target]
        assert st.st_ino != old.st_ino, (
            f"{target.name} was rewritten in place, not replaced by a rename"
        )
        assert oct(st.st_mode & 0o7777) == oct(old.st_mode & 0o7777), target.name
        assert (st.st_uid, st.st_gid) == (old.st_uid, old.st_gid), target.name
    assert [p.name for p in targets[0].parent.iterdir() if TMP_MARK in p.name] == []

    patched = {t: t.stat() for t in targets}
    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback")
    assert rc == 0, doc
    for target, module in zip(targets, (GENERATOR, WORKER)):
        st, old = target.stat(), before[target]
        assert st.st_ino != patched[target].st_ino, (
            f"{target.name} was restored in place, not by a rename"
        )
        assert oct(st.st_mode & 0o7777) == oct(old.st_mode & 0o7777), target.name
        assert (st.st_uid, st.st_gid) == (old.st_uid, old.st_gid), target.name
        assert sha256(target) == record_sha256(site, module)
    assert [p.name for p in targets[0].parent.iterdir() if TMP_MARK in p.name] == []


# ---------------------------------------------------------------- lab.reset
def test_lab_reset_gives_a_drifted_node_the_files_pip_installed(lab):
    n1, n2 = lab.node("lab01"), lab.node("lab02")
    site1 = site_packages(n1.venv)
    gen, worker = n1.module_file(GENERATOR), n1.module_file(WORKER)
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0, doc
    gen.write_text(gen.read_text() + "\n# a local edit on top of the patch\n")
    worker.unlink()
    (gen.parent / "stray_module.py").write_text("x = 1\n")
    # any name: reset replaces the whole package
    pyc = gen.parent / "__pycache__" / f"{gen.stem}.stale.pyc"
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(b"stale")
    n2_gen = n2.module_file(GENERATOR)
    n2_gen.write_text(n2_gen.read_text() + "\n# lab02's own drift\n")
    n2_drifted = sha256(n2_gen)
    assert len(record_mismatches(site1)) == 3
    try:
        proc = run_fab(lab.root, "lab.reset", "--node", "lab01")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "lab01: packages reset" in proc.stdout and "lab02" not in proc.stdout
        # every file of the package as pip installed it, nothing more
        assert record_mismatches(site1) == []
        assert sha256(gen) == record_sha256(site1, GENERATOR)
        assert sha256(worker) == record_sha256(site1, WORKER)
        assert not (gen.parent / "stray_module.py").exists() and not pyc.exists()
        assert sha256(n2_gen) == n2_drifted  # --node lab01 leaves other nodes alone
        rc, doc = fab_json(lab.root, "-H", "lab01", "verify", "--kinds", "grep")
        assert rc == 1  # the node really reads the pristine (unpatched) file again
    finally:
        lab.reset_packages(n2)


# ---------------------------------------------------------------- lab.down [--purge]
def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody reaped yet (sshd daemonizes; the reaper may be
    slow)."""
    if not pid_alive(pid):
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_lab_down_stops_its_sshds_and_purge_removes_everything(lab_project, tmp_path):
    # A throwaway lab of its own: purging the session's shared lab would break every other test.
    project = make_project(tmp_path / "throwaway")
    (project / ".lab").mkdir()
    # skip making the extract model
    (project / ".lab" / "no-tiny-model").write_text("not needed here\n")
    throwaway = Lab(project)
    throwaway.up(1, progress=lambda m: print(m, file=sys.stderr))
    node = throwaway.node("lab01")
    pid, port = node.pid(), node.port
    assert pid and node.running() and port_open(port)
    shared = Lab(lab_project).node("lab01")
    assert shared.running()
    status = run_fab(project, "lab.status")
    # fab really acts on the throwaway project
    assert f"127.0.0.1:{port}" in status.stdout, status.stdout

    try:
        proc = run_fab(project, "lab.down")
        assert proc.returncode == 0 and "stopped: lab01" in proc.stdout, proc.stdout + proc.stderr
        assert gone(pid) and not port_open(port)
        # without --purge the files stay
        assert node.venv.exists() and throwaway.hosts_file.exists()

        throwaway.start_node(node)
        pid = node.pid()
        assert pid and node.running()
        proc = run_fab(project, "lab.down", "--purge")
        assert proc.returncode == 0 and "stopped: lab01" in proc.stdout, proc.stdout + proc.stderr
        assert gone(pid) and not port_open(port)
        assert not (project / ".lab").exists(), sorted(
            str(p) for p in (project / ".lab").rglob("*")
        )[:20]
        assert not throwaway.hosts_file.exists()
        # only the lab's own files
        assert (project / "fabfile.py").exists() and (project / "hosts").is_dir()
        assert shared.running(), "lab.down in one project stopped another project's node"
        again = run_fab(project, "lab.down", "--purge")
        assert again.returncode == 0 and "nothing running" in again.stdout
    finally:
        throwaway.down(purge=True)
