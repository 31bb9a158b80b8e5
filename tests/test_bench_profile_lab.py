"""The bench's profile measures the node side as fleetops runs it: bench/profile_node.py starts the
agent through the verifying bootstrap (the zip refuses to run by its path) and reads the agent's own
time from every answer."""

from __future__ import annotations

import sys

import pytest
from conftest import REPO, run_fab

pytestmark = pytest.mark.lab


def test_node_costs_run_the_agent_as_fleetops_does(lab):
    node = lab.node("lab01")
    assert run_fab(lab.root, "-H", "lab01", "ping").returncode == 0  # the agent is on the node
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from profile_node import node_costs
    finally:
        sys.path.remove(str(REPO / "bench"))
    costs = node_costs(node, str(lab.client_key), str(lab.known_hosts), reps=1)
    for step in ("agent ping", "agent patch (steady state)", "agent verify grep,compile"):
        wall, node_cpu, own = costs[step]
        assert own is not None and 0 < own < wall, (step, costs[step])
    total, _, modules = costs["agent_imports_verify"]
    assert total > 0 and any(m.startswith("remote_scripts.") for m in modules), costs[
        "agent_imports_verify"
    ]
