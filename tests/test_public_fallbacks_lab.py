"""The lab run with every private name of paramiko and Invoke switched off (FLEETOPS_PUBLIC_ONLY=1,
the escape hatch when a new paramiko breaks one): patch, verify, an ad-hoc command and a host behind
a jump host all pass; and in-process, each public path is the one taken (paramiko's own login
order)."""

from __future__ import annotations

import json

import paramiko
import pytest
from conftest import fab_json, run_fab
from logintap import login_order
from paramiko.auth_handler import AuthHandler

from fleetops import compat
from fleetops.plans.inventory import load_inventory

pytestmark = pytest.mark.lab

PUBLIC_ONLY = {compat.SWITCH: "1"}


@pytest.fixture
def behind(lab):
    """lab01 again, reached through lab02 (the inventory's jump)."""
    n1 = lab.node("lab01")
    extra = lab.root / "hosts" / "behind.yaml"
    extra.write_text(
        f"hosts:\n  behind:\n    address: 127.0.0.1\n    port: {n1.port}\n    user: {lab.user}\n"
        f"    known_hosts: {lab.known_hosts}\n    identity_file: {lab.client_key}\n"
        f"    python: {n1.python}\n    state_dir: {n1.state_dir}\n    jump: lab02\n"
    )
    yield "behind"
    extra.unlink()


def test_patch_verify_run_and_a_jump_host_pass_with_public_apis_only(lab, behind):
    rc, doc = fab_json(lab.root, "-H", "lab01,lab02", "patch", "verify", env=PUBLIC_ONLY)
    assert rc == 0, doc
    outcome = {(r["host"], r["task"]): r["status"] for r in doc["results"]}
    assert outcome == {
        ("lab01", "patch"): "changed",
        ("lab02", "patch"): "changed",
        ("lab01", "verify"): "ok",
        ("lab02", "verify"): "ok",
    }, doc
    proc = run_fab(lab.root, "-H", "lab01,lab02", "run", "uname -s", "--no-fold", env=PUBLIC_ONLY)
    assert proc.returncode == 0 and proc.stdout.count("Linux") == 2, proc.stdout + proc.stderr
    rc, doc = fab_json(lab.root, "-H", behind, "verify", "rollback", env=PUBLIC_ONLY)
    assert rc == 0 and [r["status"] for r in doc["results"]] == ["ok", "changed"], json.dumps(doc)
    proc = run_fab(lab.root, "-H", behind, "run", "uname -s", env=PUBLIC_ONLY)
    assert proc.returncode == 0 and "Linux" in proc.stdout, proc.stdout + proc.stderr


def _wire(monkeypatch) -> list[str]:
    """What each login of this test sent and received, in order, and each exec_command paramiko was
    asked for."""
    order = login_order(monkeypatch, paramiko.Transport, AuthHandler)
    exec_command = paramiko.Channel.exec_command

    def waited_exec(self, command):
        order.append("exec_command")
        return exec_command(self, command)

    monkeypatch.setattr(paramiko.Channel, "exec_command", waited_exec)
    return order


def _ping(lab) -> dict:
    from fleetops.wire.ssh import NodeConnection

    inventory = load_inventory(lab.root / "hosts")
    conn = NodeConnection(inventory.resolve("lab01"), inventory)
    try:
        answer, _ = conn.call("ping", {})
    finally:
        conn.close()
    return answer


def test_switched_off_the_login_and_the_agents_exec_go_paramikos_own_way(lab, monkeypatch):
    order = _wire(monkeypatch)
    assert _ping(lab)["ok"]
    assert (
        order.index("sent userauth-request")
        < order.index("sent channel-open")
        < order.index("got userauth-success")
    ), order
    del order[:]
    try:
        monkeypatch.setenv(compat.SWITCH, "1")
        compat.recheck()
        assert _ping(lab)["ok"]
    finally:
        monkeypatch.delenv(compat.SWITCH)
        compat.recheck()
    assert order == [
        "sent service-request",
        "got service-accept",
        "sent userauth-request",
        "got userauth-success",
        "sent channel-open",
        "exec_command",
    ], order
