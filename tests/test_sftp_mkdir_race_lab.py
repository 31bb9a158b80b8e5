"""Runs at once at a node that has never seen fleetops each upload the agent into its state dir's
`bin/`, which none of them finds: each makes the missing folders. The one that loses the race for a
folder (another made it between its look and its mkdir, which SFTP then refuses) goes on with the
folder that is there, as `mkdir -p` does, instead of failing the host. Against the lab's real sshd,
both transports; every connection is to 127.0.0.1."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prockit import control_dir

from fleetops.plans.inventory import load_inventory
from fleetops.wire.openssh import OpenSSHConnection
from fleetops.wire.ssh import NodeConnection

pytestmark = pytest.mark.lab

AT_ONCE = 8


@pytest.fixture
def cm(monkeypatch) -> Iterator[str]:
    yield from control_dir(monkeypatch, "fo-r-")


@pytest.mark.parametrize("kind", [OpenSSHConnection, NodeConnection])
def test_uploads_at_once_into_missing_folders_all_land(lab, kind, cm):
    node = lab.node("lab01")
    inventory = load_inventory(lab.root / "hosts")
    host = inventory.hosts["lab01"]
    fresh = f"{node.state_dir}/race-{uuid.uuid4().hex[:8]}"
    connections = [kind(host, inventory) for _ in range(AT_ONCE)]
    for connection in connections:
        connection.open()
    start = threading.Barrier(AT_ONCE)
    failed: list[str] = []

    def upload(i: int) -> None:
        start.wait()
        try:
            connections[i].upload(f"{fresh}/a/b/file{i}", b"x" * 1000)
        except Exception as exc:
            failed.append(f"{i}: {exc!r}")

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(AT_ONCE)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        for connection in connections:
            connection.close()
    assert failed == []
    landed = sorted(p.name for p in (Path(fresh) / "a" / "b").iterdir())
    assert landed == sorted(f"file{i}" for i in range(AT_ONCE))
    assert (Path(fresh) / "a").stat().st_mode & 0o777 == 0o700
