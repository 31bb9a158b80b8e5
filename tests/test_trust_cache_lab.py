"""The agent zip's verdict over real SSH (remote_scripts/core/bootstrap.py: _verdict): once a run
has kept it, the zip changed in place (its size and mtime put back), or bin/ swapped for a copy that
carries the old verdict beside a changed zip, is refused as any changed zip is, naming the path and
both sha256; nothing of the changed bytes runs."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import fab_json_output

from fleetops.lab import Lab, Node
from fleetops.wire.bundle import agent_bundle

pytestmark = pytest.mark.lab

EXIT_FAILED = 1


def fab(lab: Lab, *args: str) -> tuple[int, dict, str]:
    return fab_json_output(lab.root, "-H", "lab01", *args, timeout=600)


def _ping_ok(lab: Lab) -> None:
    rc, doc, both = fab(lab, "ping")
    assert rc == 0 and doc["results"][0]["status"] == "ok", both


def _refused(lab: Lab, zip_path: Path) -> str:
    rc, doc, both = fab(lab, "ping")
    (result,) = doc["results"]
    assert rc == EXIT_FAILED and result["status"] == "failed", both
    msg = result["msg"]
    assert f"{zip_path} is not the agent fleetops sent" in msg, msg
    assert f"expected {agent_bundle().sha256}" in msg, msg
    return msg


def _with_verdict(lab: Lab, node: Node) -> Path:
    """The node's zip, uploaded more than 2 s ago and run since: its verdict kept."""
    _ping_ok(lab)
    pyz = node.state_dir / "bin" / agent_bundle().filename
    age = time.time() - pyz.stat().st_ctime
    if age < 2.2:
        time.sleep(2.2 - age)
    _ping_ok(lab)
    verdict = Path(f"{pyz}.verdict")
    assert verdict.is_file() and agent_bundle().sha256 in verdict.read_text()
    assert verdict.stat().st_mode & 0o777 == 0o600
    return pyz


def _flip_one_byte(pyz: Path) -> None:
    """One byte of the zip changed where it stands, its size and mtime as they were."""
    before = pyz.stat()
    with open(pyz, "r+b") as f:
        f.seek(before.st_size // 2)
        byte = f.read(1)
        f.seek(before.st_size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(pyz, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (pyz.stat().st_size, pyz.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)


@pytest.fixture
def node(lab) -> Iterator[Node]:
    node = lab.node("lab01")
    yield node
    # the next test (or module) gets a clean bin/: fleetops uploads the zip again
    shutil.rmtree(node.state_dir / "bin", ignore_errors=True)
    shutil.rmtree(node.state_dir / "bin.before", ignore_errors=True)


def test_a_zip_changed_in_place_after_its_verdict_is_refused(lab, node):
    pyz = _with_verdict(lab, node)
    _flip_one_byte(pyz)
    _refused(lab, pyz)
    _refused(lab, pyz)  # the verdict no longer names it, however often asked
    pyz.unlink()
    _ping_ok(lab)  # a fresh copy is uploaded and runs


def test_bin_swapped_for_a_copy_with_the_old_verdict_beside_a_changed_zip_is_refused(lab, node):
    pyz = _with_verdict(lab, node)
    bin_dir = pyz.parent
    copy = bin_dir.with_name("bin.copy")
    shutil.copytree(bin_dir, copy)  # copy2: modes and mtimes kept; new inodes and ctimes
    _flip_one_byte(copy / pyz.name)
    os.rename(bin_dir, bin_dir.with_name("bin.before"))
    os.rename(copy, bin_dir)
    _refused(lab, pyz)
