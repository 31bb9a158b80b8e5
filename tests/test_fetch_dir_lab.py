"""`fetch` of a directory against a real lab sshd: 1,000 files, the client SIGINTed in the middle of
a large one, then the command it printed run as printed. Every file's sha256 is checked against
hashlib over the node's own file and against the manifest with GNU `sha256sum -c`, never against
fleetops' own hashes only; the interrupt prints no traceback (paramiko's read-ahead thread included)
and names the partial file and the resume command. A symlink leading out of the fetched directory is
refused on the node, and a symlink planted in the local copy is never written through."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, fab_json, sha256

pytestmark = pytest.mark.lab
ENV = {"PYTHONPATH": str(REPO), "COLUMNS": "200", "FLEETOPS_NO_LIVE": "1"}
FILES = 1000
BIG_AT = 500  # file 0500 is the big one the interrupt lands in
BIG = 160 * 1000 * 1000


@pytest.fixture(scope="module")
def lab(lab_factory):
    return lab_factory.shared(1, __name__)


def _make_tree(top: Path) -> dict[str, str]:
    """1,000 files in 10 folders, random bytes; sha256 of each by its name in top."""
    want = {}
    for i in range(FILES):
        rel = f"shard-{i // 100:02d}/model-{i:04d}.safetensors"
        path = top / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        with open(path, "wb") as f:
            left = BIG if i == BIG_AT else 4096 + i * 37
            while left:
                chunk = os.urandom(min(left, 1 << 20))
                digest.update(chunk)
                f.write(chunk)
                left -= len(chunk)
        want[rel] = digest.hexdigest()
    return want


def fab(lab, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fabric", *args],
        cwd=lab.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **ENV},
        start_new_session=True,
    )


def test_a_directory_of_1000_files_interrupted_by_ctrl_c_resumes_and_every_sha256_matches(
    lab, tmp_path
):
    node = lab.node("lab01")
    top = node.state_dir / "outdir"
    want = _make_tree(top)
    dest = tmp_path / "dl"
    copy = dest / "lab01" / "state" / "outdir"
    big_rel = f"shard-{BIG_AT // 100:02d}/model-{BIG_AT:04d}.safetensors"
    part = copy / (big_rel + ".part")
    proc = fab(lab, "-H", "lab01", "fetch", "--path", "outdir", "--dest", str(dest))
    deadline = time.monotonic() + 600
    try:
        while not (part.exists() and part.stat().st_size >= 16 << 20):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the big file's copy never started"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    both = out + err
    assert proc.returncode == 130, both
    assert "Traceback" not in both and "Socket is closed" not in both, both
    partial = part.stat().st_size
    assert 16 << 20 <= partial < BIG, partial
    assert not (copy / big_rel).exists()
    line = next(x for x in out.splitlines() if "interrupted (Ctrl-C)" in x and "resume with:" in x)
    assert f"its partial copy {part} holds {partial:,} of {BIG:,} bytes" in line, line
    complete = [p for p in copy.rglob("*.safetensors") if p.is_file()]
    assert 0 < len(complete) < FILES
    assert (
        f"; {len(complete)} of {FILES} files complete in {dest / 'lab01'}; resume with: " in line
    ), line
    assert not (dest / "lab01" / "state" / "outdir.sha256").exists()  # no manifest for a half copy
    command = shlex.split(line.split("resume with: ", 1)[1])
    assert command == ["fab", "-H", "lab01", "fetch", "--path", "outdir", "--dest", str(dest)], (
        command
    )

    # The printed command, as printed: the complete files are skipped, the .part resumed.
    rc, doc = fab_json(lab.root, *command[1:])
    assert rc == 0, json.dumps(doc, indent=1)[:4000]
    files = {f["rel"]: f for f in doc["results"][0]["data"]["files"]}
    assert len(files) == FILES
    assert (
        files[big_rel]["resumed_from"] == partial
        and files[big_rel]["fetched_bytes"] == BIG - partial
    )
    kept = [rel for rel, f in files.items() if f["status"] == "ok"]
    assert len(kept) == len(complete) and all("same sha256" in files[r]["msg"] for r in kept)
    for rel, sha in want.items():
        assert sha256(copy / rel) == sha, rel  # hashlib over the node's bytes, not fleetops' answer
    assert not list(copy.rglob("*.part"))
    manifest = dest / "lab01" / "state" / "outdir.sha256"
    check = subprocess.run(
        ["sha256sum", "--check", "--strict", "--quiet", str(manifest)],
        cwd=copy,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert len(manifest.read_text().splitlines()) == FILES
    assert stat.S_IMODE(manifest.stat().st_mode) == 0o600  # as private as the files it lists
    line = doc["results"][0]["items"][0]["msg"]
    assert (
        f"{FILES} files" in line
        and f"{len(complete)} already there" in line
        and str(manifest) in line
    ), line
    # Again: nothing to copy.
    rc, doc = fab_json(lab.root, *command[1:])
    assert rc == 0 and doc["results"][0]["status"] == "ok", doc["results"][0]["msg"]
    assert all(f["fetched_bytes"] == 0 for f in doc["results"][0]["data"]["files"])


def test_symlinks_leading_out_are_refused_on_the_node_and_never_written_through_here(lab, tmp_path):
    node = lab.node("lab01")
    top = node.state_dir / "linked"
    (top / "sub").mkdir(parents=True)
    (top / "ok.txt").write_text("fine\n")
    (top / "sub" / "deep.txt").write_text("deep\n")
    outside = node.dir / "outside-secret.txt"
    outside.write_text("not for fetch\n")
    (top / "escape").symlink_to(outside)
    rc, doc = fab_json(
        lab.root, "-H", "lab01", "fetch", "--path", "linked", "--dest", str(tmp_path / "dl")
    )
    result = doc["results"][0]
    assert rc == 1 and result["status"] == "failed", result
    assert "linked/escape: a symlink that leads outside linked" in result["msg"], result["msg"]
    copy = tmp_path / "dl" / "lab01" / "state" / "linked"
    assert (copy / "ok.txt").read_text() == "fine\n" and not (copy / "escape").exists()
    assert not (tmp_path / "dl" / "lab01" / "state" / "linked.sha256").exists()
    (top / "escape").unlink()

    # A folder of the local copy replaced by a symlink elsewhere: nothing is written there.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (copy / "sub" / "deep.txt").unlink()
    (copy / "sub").rmdir()
    (copy / "sub").symlink_to(elsewhere)
    rc, doc = fab_json(
        lab.root, "-H", "lab01", "fetch", "--path", "linked", "--dest", str(tmp_path / "dl")
    )
    result = doc["results"][0]
    assert (
        rc == 1 and f"{copy / 'sub'} is a symlink; refusing to write through it" in result["msg"]
    ), result["msg"]
    assert list(elsewhere.iterdir()) == []
