"""Resource faults on a real lab node (tiny tmpfs mounts, so root only): the disk full while the
backup or the temp file is written, and a read-only package directory. Each gives a clear error and
leaves the original."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import pytest
from conftest import GENERATOR, fab_json

pytestmark = [pytest.mark.lab, pytest.mark.root("mounting a tmpfs needs root")]


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def mount_tmpfs(path, size: str, ro: bool = False, mode: str = "0755") -> None:
    # A tmpfs root is 1777 unless told: a state dir (backups/) on it would be refused as writable by
    # others.
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode={mode}", "tmpfs", str(path)], check=True
    )
    if ro:
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


def umount(path) -> None:
    subprocess.run(["umount", str(path)], check=True)


def test_disk_full_while_writing_the_backup(lab):
    node = lab.node("lab01")
    target = node.module_file(GENERATOR)
    before = sha(target)
    backups = node.state_dir / "backups"
    backups.mkdir(exist_ok=True)
    # smaller than the original file that must be saved first
    mount_tmpfs(backups, "4k", mode="0700")
    try:
        rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
        # the failed write's own temp
        leftovers = [n for n in os.listdir(backups) if ".fleetops-tmp-" in n]
    finally:
        umount(backups)
    assert rc == 1
    msg = doc["results"][0]["items"][0]["msg"]
    # The set is checked whole before any write: the backup's file system is too small, so nothing
    # is written at all. A write that fails anyway puts back what was written
    # (test_patch_integrity_lab.py).
    assert "not enough free space" in msg and "state/backups" in msg and "nothing written" in msg, (
        msg
    )
    assert sha(target) == before and leftovers == []
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0 and doc["results"][0]["status"] == "changed"


def _package_dir_on_tmpfs(target, size: str, ro: bool = False):
    pkg = target.parent
    saved = pkg.with_name(pkg.name + ".saved")
    shutil.copytree(pkg, saved)
    mount_tmpfs(pkg, size)
    for entry in saved.iterdir():
        if entry.is_file():
            shutil.copy2(entry, pkg / entry.name)
    if ro:
        subprocess.run(["mount", "-o", "remount,ro", str(pkg)], check=True)
    return pkg, saved


def test_disk_full_while_writing_the_temp_file(lab):
    node = lab.node("lab01")
    target = node.module_file(GENERATOR)
    before = sha(target)
    pkg, saved = _package_dir_on_tmpfs(target, "200k")
    try:
        filler = pkg / "filler"
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={filler}", "bs=4k", "count=1000"], capture_output=True
        )
        rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
        after = sha(target)
        leftovers = [n for n in os.listdir(pkg) if ".fleetops-tmp-" in n]
    finally:
        umount(pkg)
        shutil.rmtree(saved)
    assert rc == 1
    msg = doc["results"][0]["items"][0]["msg"]
    assert "not enough free space" in msg and "0 free" in msg and "nothing written" in msg, msg
    assert after == before and leftovers == []


def test_read_only_package_directory(lab):
    node = lab.node("lab01")
    target = node.module_file(GENERATOR)
    before = sha(target)
    pkg, saved = _package_dir_on_tmpfs(target, "1m", ro=True)
    try:
        rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
        after = sha(target)
    finally:
        umount(pkg)
        shutil.rmtree(saved)
    assert rc == 1
    msg = doc["results"][0]["items"][0]["msg"]
    assert "read-only file system" in msg and "nothing written" in msg, msg
    assert after == before
