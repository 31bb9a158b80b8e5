"""Typed results, pure parts: each task family answers with a payload of its own type
(fleetops/results/), the report layer picks a result's table and lines by that type (never by the
task's name), and --json writes the payload through one function (results.to_data): the keys and
values of each family's document, an optional key absent while it holds nothing. No sshd."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fleetops.plans.gpugate import Gate
from fleetops.report.lines import draw
from fleetops.report.rows import fleet_sections
from fleetops.results import Item, Next, Payload, Result, Severity, Status, shape_of, to_data
from fleetops.results.adhoc import CommandOutput
from fleetops.results.diagnose import Diagnosis, Finding, NodeDiagnosis, SummaryRow
from fleetops.results.drain import Drained
from fleetops.results.gpu import Facts, GpuGate
from fleetops.results.node import Ping
from fleetops.results.refusal import DrainedRefusal, KindedRefusal
from fleetops.tasks.adhoc import _interpret_run
from fleetops.tasks.gpu import _interpret_facts, _interpret_gpu
from fleetops.tasks.node import _interpret_ping
from fleetops.tasks.plan import Plan, agent_error, drained
from fleetops.tasks.registry import declared_tasks

GPU = {
    "index": 0,
    "name": "NVIDIA H200",
    "uuid": "GPU-0",
    "memory_used_mib": 0,
    "memory_total_mib": 143771,
    "memory_free_mib": 143771,
    "ecc_uncorrected": 0,
    "processes": [],
}


def _text(result: Result, verbose: bool = False) -> str:
    lines, _ = draw(result, verbose)
    return "\n".join("".join(seg for seg, _ in line) for line in lines)


def test_each_family_answers_with_its_own_payload_type():
    ping = _interpret_ping(
        "n1", Plan("ping", {}, 60, None), {"python": "/usr/bin/python3", "version": "3.12.3"}
    )
    assert ping.payload == Ping("/usr/bin/python3", "3.12.3")
    run = _interpret_run(
        "n1",
        Plan("run", {}, 60, None, options={"command": "true"}),
        {
            "exit_code": 0,
            "stdout": "hi\n",
            "stderr": "",
            "timed_out": False,
            "stdout_dropped_bytes": 0,
            "stderr_dropped_bytes": 0,
        },
    )
    assert isinstance(run.payload, CommandOutput) and run.payload.exit_code == 0
    gpu = _interpret_gpu(
        "n1",
        Plan("gpu", {}, 60, None, options={"gate": Gate(1024, None), "wait": 0}),
        {"ok": True, "gpus": [GPU]},
    )
    assert isinstance(gpu.payload, GpuGate) and gpu.payload.verdict == "OK"
    facts = _interpret_facts("n1", Plan("facts", {}, 60, None), {"ok": False, "error": "no venv"})
    assert isinstance(facts.payload, Facts) and isinstance(facts.payload.next, Next)


def test_declared_tasks_name_their_payload_type_and_it_is_the_one_they_return():
    declared = declared_tasks()
    for name, kind in [
        ("ping", Ping),
        ("run", CommandOutput),
        ("gpu", GpuGate),
        ("facts", Facts),
        ("drain", Drained),
    ]:
        assert declared[name].result is kind, name
        # A host that never answered (no payload) is placed by its task's declared type.
        assert shape_of(Result("n1", name, Status.UNREACHABLE, "no route")) is kind


def test_payloads_are_frozen_and_carry_swaps_the_data_with_the_payload():
    result = Result(
        "n1",
        "drain",
        Status.CHANGED,
        "drained",
        payload=Drained({"by": "ops"}, None),
        data={"node_warnings": ["w"]},
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.payload.drain = {}  # type: ignore[misc,union-attr]
    assert result.data == {"drain": {"by": "ops"}, "running_job": None, "node_warnings": ["w"]}
    payload = result.payload
    result.carry(dataclasses.replace(payload, slurm={"node": "c1"}))  # type: ignore[type-var]
    assert result.data == {
        "drain": {"by": "ops"},
        "running_job": None,
        "slurm": {"node": "c1"},
        "node_warnings": ["w"],
    }


def test_json_writes_each_familys_keys_and_leaves_out_what_is_absent():
    """The documents --json writes: each family's keys with their values, optional keys absent while
    empty."""
    gpu = _interpret_gpu(
        "n1",
        Plan("gpu", {}, 60, None, options={"gate": Gate(1024, None), "wait": 0}),
        {"ok": True, "gpus": [GPU]},
    )
    doc = json.loads(json.dumps(gpu.to_json()))
    assert set(doc) == {
        "host",
        "task",
        "status",
        "msg",
        "items",
        "evidence",
        "code",
        "data",
        "seconds",
        "changed",
    }
    # no waited_s yet
    assert set(doc["data"]) == {"table", "gpus", "holders", "error_kind", "verdict", "next"}
    assert doc["data"]["next"] is None and doc["data"]["verdict"] == "OK"
    assert json.loads(
        json.dumps(
            agent_error(
                "n1", "verify", {"error": "x", "error_kind": None}, with_kind=True
            ).to_json()
        )
    )["data"] == {"error_kind": None}
    assert agent_error("n1", "verify", {"error": "x"}).to_json()["data"] == {}
    refused = drained("n1", "patch", {"by": "ops", "at": "t", "reason": "xid"}, "patch")
    assert isinstance(refused.payload, DrainedRefusal)
    assert list(refused.to_json()["data"]) == ["error_kind", "drain", "next"]
    assert refused.to_json()["data"]["next"] == {
        "why": "put it back in service once it is fixed",
        "commands": ["fab -H n1 undrain"],
    }


def test_one_serialiser_for_payloads_items_and_findings():
    finding = Finding(Severity.CRITICAL, "xid", "Xid 79", ["fab -H n1 diagnose"], rank=1)
    row = SummaryRow("n1", Severity.CRITICAL, "xid", "Xid 79", "fab -H n1 diagnose")
    payload = NodeDiagnosis(
        Severity.CRITICAL, [finding], row, reach={"reached": True}, kernel_source=None
    )
    data = Result("n1", "diagnose", Status.FAILED, "CRITICAL: Xid 79", payload=payload).to_json()[
        "data"
    ]
    assert data["summary_row"] == ["n1", "CRITICAL", "xid", "Xid 79", "fab -H n1 diagnose"]
    # one shape wherever it is
    assert to_data({"nested": payload})["nested"] == to_data(payload) == payload.data()
    assert data["findings"][0] == dataclasses.asdict(finding)
    assert "kernel_source" in data and data["kernel_source"] is None and "error_kind" not in data
    assert json.dumps(data["verdict"]) == '"CRITICAL"'
    assert to_data(KindedRefusal("drained")) == {"error_kind": "drained"}


def test_report_picks_tables_and_lines_by_payload_type_not_by_task_name():
    """A task of any name that answers with a family's payload is drawn as that family: the fleet
    tables and the output lines follow the type; a task named like a family but answering with
    another type does not."""
    gate = _interpret_gpu(
        "n1",
        Plan("gpu", {}, 60, None, options={"gate": Gate(1024, None), "wait": 0}),
        {"ok": True, "gpus": [GPU]},
    ).payload
    assert isinstance(gate, GpuGate)
    renamed = [
        Result(h, "preflight-gpus", Status.OK, "OK: 1/1", payload=gate) for h in ("n1", "n2")
    ]
    [summary] = [s for s in fleet_sections(renamed) if s["title"] == "GPU fleet summary"]
    assert [row[:2] for row in summary["rows"]] == [["n1", "OK"], ["n2", "OK"]]
    # a result called "gpu" that carries no gate answer and is not unanswered is no GPU host
    other = [Result(h, "gpu", Status.OK, "pong", payload=Ping("/p", "3")) for h in ("n1", "n2")]
    assert not [s for s in fleet_sections(other) if s["title"] == "GPU fleet summary"]
    out = Result(
        "n1",
        "shell",
        Status.OK,
        "'x': exit 0",
        payload=CommandOutput("x", 0, "line one\n", "warn\n", False, 0, 0),
    )
    text = _text(out)
    assert "| line one" in text and "! warn" in text
    plain = Result("n1", "run", Status.OK, "'x': exit 0", data={"stdout": "not output\n"})
    assert "not output" not in _text(plain)
    diag = [
        Result(
            h,
            "health",
            Status.FAILED,
            "CRITICAL",
            payload=Diagnosis(
                Severity.CRITICAL, [], SummaryRow(h, Severity.CRITICAL, "xid", "Xid", "-")
            ),
        )
        for h in ("n1", "n2")
    ]
    assert [s["title"] for s in fleet_sections(diag)] == ["diagnose: fleet summary (worst first)"]


def test_next_is_one_type_whether_a_payload_or_plain_data_carries_it():
    nxt = Next("undrain it", ["fab -H n1 undrain"])
    typed = Result("n1", "drain", Status.FAILED, "x", payload=Drained({}, None, next=nxt))
    plain = Result("n1", "fetch", Status.FAILED, "x", data={"next": nxt.to_data()})
    assert typed.next == plain.next == nxt
    assert "fab -H n1 undrain" in _text(typed) and "fab -H n1 undrain" in _text(plain)


def test_every_payload_module_is_checked_by_mypy_strict():
    from pathlib import Path

    try:
        import tomllib
    except ImportError:  # Python 3.10: the dev lock's tomli
        import tomli as tomllib

    config = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    strict = [o for o in config["tool"]["mypy"]["overrides"] if o.get("disallow_untyped_defs")]
    assert any("fleetops.results.*" in o["module"] for o in strict)
    assert issubclass(Ping, Payload)


def test_an_items_next_is_a_next_in_process_and_its_data_in_json():
    finding = Result(
        "n1",
        "diagnose",
        Status.FAILED,
        "x",
        [Item("xid", Status.FAILED, "Xid 79", {"next": Next("drain it", ["fab -H n1 drain"])})],
    )
    assert finding.items[0].next == Next("drain it", ["fab -H n1 drain"])
    assert json.loads(json.dumps(finding.to_json()))["items"][0]["details"]["next"] == {
        "why": "drain it",
        "commands": ["fab -H n1 drain"],
    }
    assert "fab -H n1 drain" in _text(finding)
