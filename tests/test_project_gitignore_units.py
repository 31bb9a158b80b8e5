"""What fleetops writes into the checkout (the failed hosts and shard plans in .fleetops/, fetched
files, the ssh_config the first-day runbook exports, the lab's keys and inventory) is ignored by the
checkout's git: its .gitignore, judged by git itself in a repository of its own."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import REPO

WRITTEN = [
    ".fleetops/last-failed",
    ".fleetops/shards/extract.json",
    "fetched/lab01/extract-1/output.log",
    "fleet.ssh_config",
    ".lab/id_ed25519",
    "hosts/lab.yaml",
]


def ignored(tmp_path, path: str) -> bool:
    """git's own verdict on `path` under the checkout's .gitignore, in a repository of the test's
    own."""
    if not (tmp_path / ".git").exists():
        shutil.copy(REPO / ".gitignore", tmp_path / ".gitignore")
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    proc = subprocess.run(["git", "-C", str(tmp_path), "check-ignore", "--no-index", "-q", path])
    assert proc.returncode in (0, 1), proc
    return proc.returncode == 0


@pytest.mark.parametrize("path", WRITTEN)
def test_the_checkout_ignores_what_fleetops_writes(tmp_path, path):
    assert ignored(tmp_path, path), f"{path} is not ignored by {REPO / '.gitignore'}"


def test_the_checkout_keeps_its_own_files(tmp_path):
    for path in ("hosts/example.yaml", "playbooks/speculators-0.3.0-vllm-0.16.yaml", "fabfile.py"):
        assert not ignored(tmp_path, path), path
