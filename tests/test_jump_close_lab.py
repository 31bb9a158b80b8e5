"""Closing a paramiko connection that goes through a jump host, against the lab's sshd: the
target's connection rides a channel of the jump host's, so it is closed first, while the jump
host's still carries its goodbye. Closed the other way round, the target's transport thread wrote
its last close on the dead jump connection and the thread's exception reached the terminal as a
traceback. Every connection is to 127.0.0.1."""

from __future__ import annotations

import threading

import pytest
from test_jump_keys_lab import write_host

from fleetops.plans.inventory import load_inventory
from fleetops.wire.ssh import NodeConnection

pytestmark = pytest.mark.lab

ROUNDS = 12


def test_a_jumped_connection_closes_with_no_exception_in_any_thread(lab, tmp_path):
    jump = lab.node("lab02")
    path = write_host(lab, tmp_path, "behind", lab.known_hosts, f"{lab.user}@127.0.0.1:{jump.port}")
    raised: list[str] = []
    before = threading.excepthook
    threading.excepthook = lambda args: raised.append(f"{args.thread}: {args.exc_value!r}")
    try:
        inventory = load_inventory(lab.root / "hosts")
        host = inventory.hosts["behind"]
        for _ in range(ROUNDS):
            node = NodeConnection(host, inventory)
            answer, _ = node.call("ping", {})
            assert answer.get("ok") is not False, answer
            node.close()
        # the transports' threads end after close(): give them their moment to say anything
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and "paramiko" in repr(type(thread)):
                thread.join(5)
    finally:
        threading.excepthook = before
        path.unlink()
    assert raised == []
