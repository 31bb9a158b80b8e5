"""--junit: a run's results as JUnit XML, read back by a real JUnit reader (junitparser, as CI
plugins read it), from results recorded off real lab runs (tests/fixtures/runs/)."""

from __future__ import annotations

import junitparser
import pytest
from test_metrics_units import recorded

from fleetops.report.junit import MAX_TEXT, junit_xml
from fleetops.results import Evidence, Item, Result, Status


def read(text: str, tmp_path) -> junitparser.JUnitXml:
    path = tmp_path / "report.xml"
    path.write_text(text, encoding="utf-8")
    return junitparser.JUnitXml.fromfile(str(path))


def test_each_host_and_check_is_a_case_and_failures_carry_the_hosts_message(tmp_path):
    results = recorded("verify")
    doc = read(junit_xml(results), tmp_path)
    [suite] = list(doc)
    assert suite.name == "verify"
    cases = {(c.classname, c.name): c for c in suite}
    wanted = {(r.host, i.label): i for r in results for i in r.items}
    assert set(cases) == set(wanted)
    failed = {
        key
        for key, case in cases.items()
        if any(isinstance(x, junitparser.Failure) for x in case.result)
    }
    assert (
        failed == {key for key, item in wanted.items() if item.status is Status.FAILED} and failed
    )
    for key in failed:
        [failure] = cases[key].result
        assert failure.message == wanted[key].msg
    assert suite.tests == len(wanted) and suite.failures == len(failed) and suite.errors == 0


def test_an_unreachable_host_is_an_error_and_the_others_still_count(tmp_path):
    doc = read(junit_xml(recorded("verify-unreachable")), tmp_path)
    [suite] = list(doc)
    errors = [c for c in suite if any(isinstance(x, junitparser.Error) for x in c.result)]
    assert [(c.classname, c.name) for c in errors] == [("lab02", "verify")] and suite.errors == 1
    assert {c.classname for c in suite} == {"lab01", "lab02"} and doc.errors == 1


def test_one_suite_per_task_in_a_run_of_several(tmp_path):
    doc = read(
        junit_xml([*recorded("patch"), *recorded("gpu-busy"), *recorded("status")]), tmp_path
    )
    assert [s.name for s in doc] == ["patch", "gpu", "status"]
    status = next(s for s in doc if s.name == "status")
    # lab02 had never run a job: status says failed
    assert status.tests == 2 and status.failures == 1


@pytest.mark.parametrize(
    "evil", ["\x1b[2J\x00\x07boom", "]]></failure><testcase name='forged'/>", "x" * 100_000]
)
def test_node_text_cannot_break_the_document_or_grow_it(evil: str, tmp_path):
    r = Result(
        "lab01",
        "verify",
        Status.FAILED,
        evil,
        [Item("check [grep]", Status.FAILED, evil)],
        Evidence(evil, 3, [evil] * 50),
    )
    text = junit_xml([r])
    doc = read(text, tmp_path)
    [suite] = list(doc)
    [case] = list(suite)
    assert case.name == "check [grep]" and "forged" not in {c.name for c in suite}
    assert len(text) < 3 * MAX_TEXT + 2000
    assert "\x1b" not in text and "\x00" not in text
