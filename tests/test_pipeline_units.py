"""Pipelining, without a lab: which steps may go ahead (read-only ops only, one request fixed at
plan time), and how a host's chain uses that: the steps sent ahead go out with the step before them,
a failed step drops their answers and reports them skipped exactly as before, and the chain's end
closes the host's connector. The wire itself is tested against real sshd in
tests/test_agent_session_lab.py."""

from __future__ import annotations

from functools import partial

from fleetops.plans.inventory import Host
from fleetops.results import Evidence, Status
from fleetops.rollout import Step, run_fleet
from fleetops.state import RunState
from fleetops.tasks.plan import Plan
from fleetops.tasks.registry import TASKS, ahead_request, run_task, send_ahead
from fleetops.wire.connector import TransportError
from remote_scripts.core.protocol import OPS, READ_ONLY_OPS

HOST = Host("n1", "127.0.0.1")
WRITERS = (
    "patch",
    "rollback",
    "job_start",
    "job_stop",
    "run",
    "capture",
    "fetch_plan",
    "slurm",
    "shards",
    "drain",
    "undrain",
    "schedule",
)
NOT_LISTED = ("preflight",)  # extract's own first call: never a step of its own


def test_only_read_only_ops_may_go_ahead():
    assert not READ_ONLY_OPS & set(WRITERS)
    # a new op must be placed on one side
    assert set(OPS) == READ_ONLY_OPS | set(WRITERS) | set(NOT_LISTED)
    for name in TASKS:
        for op in OPS:
            plan = Plan(op, {"x": 1}, 60, None)
            if op not in READ_ONLY_OPS:
                assert ahead_request(name, plan, HOST) is None, (name, op)


def test_a_step_goes_ahead_only_as_one_request_fixed_at_plan_time():
    assert ahead_request("verify", Plan("verify", {"checks": []}, 900, None), HOST) == {
        "checks": []
    }
    assert ahead_request("facts", Plan("facts", {}, 60, None), HOST) == {}
    gpu = Plan("gpu", {}, 60, None, options={"wait": 0.0})
    assert ahead_request("gpu", gpu, HOST) == {}
    # it polls
    assert ahead_request("gpu", Plan("gpu", {}, 60, None, options={"wait": 30.0}), HOST) is None
    # Slurm answers
    assert ahead_request("gpu", gpu, Host("n2", "127.0.0.1", scheduler="slurm")) is None
    for name, op in (
        ("status", "job_status"),
        ("logs", "job_logs"),
        ("tail", "job_tail"),
        ("diagnose", "diagnose"),
    ):
        assert op in READ_ONLY_OPS  # read-only, but their own run() builds requests as it goes
        assert ahead_request(name, Plan(op, {}, 60, None), HOST) is None


class FakePending:
    def __init__(self, node: FakeNode, op: str) -> None:
        self.node, self.op, self.read, self.dropped = node, op, False, False

    def result(self) -> tuple[dict, Evidence]:
        self.read = True
        return self.node.answer(self.op)

    def discard(self) -> None:
        self.dropped = True


class FakeNode:
    """Records what goes on the wire: a submitted request goes out right behind the next call."""

    nodes: dict[str, FakeNode] = {}

    def __init__(self, host: Host, inventory: object) -> None:
        self.host, self.wire, self.held, self.pending, self.closed = host, [], [], [], 0
        FakeNode.nodes[host.name] = self

    def answer(self, op: str) -> tuple[dict, Evidence]:
        if op == "ping" and self.host.name == "bad":
            raise TransportError("remote", f"{self.host.name}: the node agent failed on ping: boom")
        return {"ok": True, "python": "python3", "version": "3.11"}, Evidence("(fake)", 0, [], 0.0)

    def call(self, op: str, request: dict, timeout: float = 300) -> tuple[dict, Evidence]:
        self.wire.append(("sent", op))
        self.wire += [("sent_ahead", p.op) for p in self.held]
        self.held = []
        return self.answer(op)

    def submit(self, op: str, request: dict, timeout: float = 300) -> FakePending:
        pending = FakePending(self, op)
        self.held.append(pending)
        self.pending.append(pending)
        return pending

    def close(self) -> None:
        self.closed += 1


def chain(tmp_path, hosts: list[Host], names: list[str], serial: int = 0) -> RunState:
    state = RunState(tmp_path, {}, connector=FakeNode)
    state.reporter.json_mode = True
    plans = [(name, TASKS[name].plan(state, {})) for name in names]
    steps = [
        Step(
            name, partial(run_task, state, name, plan), ahead=partial(send_ahead, state, name, plan)
        )
        for name, plan in plans
    ]
    run_fleet(state, hosts, steps, serial=serial)
    return state


def test_read_only_steps_go_out_with_the_step_before_them(tmp_path):
    state = chain(tmp_path, [HOST], ["ping", "facts", "ping"])
    node = FakeNode.nodes["n1"]
    assert node.wire == [("sent", "ping"), ("sent_ahead", "facts"), ("sent_ahead", "ping")]
    assert [(r.task, r.status) for r in state.results] == [
        ("ping", Status.OK),
        ("facts", Status.OK),
        ("ping", Status.OK),
    ]
    assert all(p.read for p in node.pending) and node.closed == 1  # closed when its chain ended


def test_a_failed_step_drops_the_answers_sent_ahead_and_skips_as_before(tmp_path):
    bad = Host("bad", "127.0.0.1")
    state = chain(tmp_path, [bad, HOST], ["ping", "facts", "gpu"], serial=1)
    node = FakeNode.nodes["bad"]
    assert node.wire == [("sent", "ping"), ("sent_ahead", "facts"), ("sent_ahead", "gpu")]
    assert all(p.dropped and not p.read for p in node.pending)
    got = [(r.host, r.task, r.status, r.msg) for r in state.results]
    assert got[1:3] == [
        ("bad", "facts", Status.SKIPPED, "skipped: ping failed on this host"),
        ("bad", "gpu", Status.SKIPPED, "skipped: ping failed on this host"),
    ]
    # serial: the failed batch stops the roll-out, as before; the host never contacted was never
    # closed
    assert [r.status for r in state.results if r.host == "n1"] == [Status.SKIPPED] * 3
    assert node.closed == 1 and "n1" not in state.pool.nodes
