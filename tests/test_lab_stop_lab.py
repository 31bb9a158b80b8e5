"""The lab stops what it started even when sshd's pid file is missing: sshd writes it only after
forking into the background, so a `lab.up` interrupted in between leaves a listener that only its
command line names."""

from __future__ import annotations

import pytest

from fleetops.lab import sshd
from fleetops.lab.common import port_open

pytestmark = pytest.mark.lab


def test_a_node_whose_pid_file_is_missing_is_still_stopped(lab):
    node = lab.node("lab02")
    pid = node.pid()
    assert pid and node.running() and port_open(node.port)
    node.pid_file.unlink()
    try:
        assert lab.stop_node(node), "stop found no sshd without its pid file"
        assert sshd.exited(pid) and not port_open(node.port)
    finally:
        for stray in sshd.listeners(node):  # old code: leave no listener behind for the next module
            sshd.stop(node)
            assert sshd.exited(stray)
    lab.start_node(node)
    assert node.running() and port_open(node.port)
