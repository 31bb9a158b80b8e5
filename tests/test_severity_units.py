"""Severities are named: a finding's verdict is a Severity (one ordering, least to most severe), its
rank is passed by name, every reader sorts by that one ordering, and --json writes each severity as
its name. No lab."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import fleetops
from fleetops.plans.gpugate import VERDICT_FOR
from fleetops.plans.jobverdict import job_verdict
from fleetops.report.rows import fleet_sections
from fleetops.results import Severity
from fleetops.tasks import diagnose
from fleetops.tasks.findings import Finding

PACKAGE = Path(fleetops.__file__).parent


def finding_calls_with_bare_values(root: Path) -> list[str]:
    """`Finding(...)` (and `HealthFinding(...)`) calls that pass a severity as a string, or anything
    past the fourth field by position."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = getattr(node, "func", None)
            if not (
                isinstance(node, ast.Call)
                and getattr(name, "id", getattr(name, "attr", "")).endswith("Finding")
            ):
                continue
            where = f"{path.relative_to(root)}:{node.lineno}"
            if len(node.args) > 4:
                found.append(f"{where} passes {ast.unparse(node.args[4])} by position")
            if node.args and isinstance(node.args[0], ast.Constant):
                found.append(f"{where} passes the severity {node.args[0].value!r} as a literal")
    return found


def test_no_finding_passes_a_bare_rank_or_severity():
    assert finding_calls_with_bare_values(PACKAGE) == []


def test_the_check_sees_bare_values(tmp_path):
    (tmp_path / "a.py").write_text(
        'Finding(WARN, "disk", "low", [], 42, {}, "why")\n'
        'f.Finding("CRITICAL", "gpu", "gone", [])\n'
        'Finding(OK, "load", "fine", [], rank=98)\n'
        'HealthFinding("WARN", gpu, "throttled", "look")\n'
    )
    assert finding_calls_with_bare_values(tmp_path) == [
        "a.py:1 passes 42 by position",
        "a.py:2 passes the severity 'CRITICAL' as a literal",
        "a.py:4 passes the severity 'WARN' as a literal",
    ]


def test_a_finding_refuses_an_unnamed_severity_or_a_positional_rank():
    with pytest.raises(TypeError, match="Severity"):
        Finding("CRITICAL", "gpu", "gone", [])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Finding(Severity.WARN, "disk", "low", [], 42)  # type: ignore[misc]
    assert Finding(Severity.WARN, "disk", "low", [], rank=42).order == (-Severity.WARN.level, 42)


def test_one_ordering_least_to_most_severe():
    assert sorted(Severity, reverse=True) == [
        Severity.CRITICAL,
        Severity.UNKNOWN,
        Severity.WARN,
        Severity.OK,
    ]
    assert max([Severity.WARN, Severity.UNKNOWN, Severity.OK]) is Severity.UNKNOWN
    # the exit statuses rise with it, so the largest code of a run is its worst host
    assert sorted(diagnose.EXIT_FOR, key=diagnose.EXIT_FOR.__getitem__) == sorted(Severity)
    assert Severity.named("WARN") is Severity.WARN and Severity.named("warn") is None
    assert Severity.named(["WARN"]) is None  # a bad node answer's word is no severity, and no crash


def test_every_reader_gets_a_severity():
    assert {type(v) for v in VERDICT_FOR.values()} == {Severity}
    assert isinstance(job_verdict("failed").health, Severity) and isinstance(
        job_verdict("running").health, Severity
    )
    fs = [
        Finding(diagnose.WARN, "disk", "low", ["x"]),
        Finding(diagnose.CRITICAL, "gpu", "gone", ["y"]),
    ]
    assert diagnose.verdict_of(fs) is Severity.CRITICAL and diagnose.verdict_of([]) is Severity.OK


def test_json_writes_each_severity_by_name_as_before():
    fs = [
        Finding(diagnose.UNKNOWN, "gpu", "no smi", ["y"], rank=55),
        Finding(diagnose.OK, "load", "fine", ["z"]),
    ]
    doc = json.loads(json.dumps(diagnose._result("h1", fs, {}).to_json()))
    assert doc["data"]["verdict"] == "UNKNOWN"
    assert [f["verdict"] for f in doc["data"]["findings"]] == ["UNKNOWN", "OK"]
    assert [i["details"]["verdict"] for i in doc["items"]] == ["UNKNOWN", "OK"]
    assert doc["data"]["summary_row"][1] == "UNKNOWN" and doc["msg"].startswith("UNKNOWN: no smi")


def test_the_fleet_summary_sorts_worst_first_by_the_same_ordering():
    words = {
        "h1": diagnose.OK,
        "h2": diagnose.CRITICAL,
        "h3": diagnose.WARN,
        "h4": diagnose.UNKNOWN,
    }
    results = [
        diagnose._result(host, [Finding(word, "disk", f"{word} disk", ["x"])], {})
        for host, word in words.items()
    ]
    section = next(
        s for s in fleet_sections(results, fold=False) if s["title"].startswith("diagnose")
    )
    assert [row[0] for row in section["rows"]] == ["h2", "h4", "h3", "h1"]
