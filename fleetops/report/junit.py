"""A run's results as JUnit XML, the report CI systems gate a pipeline on (GitLab, Jenkins, GitHub's
test reporters): one test suite per task, one test case per host and item (a check of `verify`, a
file of `patch`, a GPU of `gpu`), or per host where a task has no items. A failed item is a
<failure> with the host's message; an unreachable host is an <error>; a skipped one <skipped>. The
evidence (command, exit code, stderr tail) goes in the failure's text, where CI shows it.

Node text is data: characters XML 1.0 cannot carry (control characters a node printed) become `?`,
and every text is bounded, so the file always parses and never grows with what a node chose to
print."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable

from ..results import Evidence, Result, Status

MAX_TEXT = 4000  # characters of one message or failure text
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: object, limit: int = MAX_TEXT) -> str:
    value = _NOT_XML.sub("?", str(text))
    return value if len(value) <= limit else value[: limit - 3] + "..."


def junit_xml(results: Iterable[Result], *, name: str = "fleetops") -> str:
    """The results of one run as a JUnit XML document (a <testsuites> root)."""
    by_task: dict[str, list[Result]] = {}
    for r in results:
        by_task.setdefault(r.task, []).append(r)
    root = ET.Element("testsuites", name=xml_text(name, 200))
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for task, task_results in by_task.items():
        suite = ET.SubElement(root, "testsuite", name=xml_text(task, 200))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        seconds = 0.0
        for r in task_results:
            seconds += r.seconds
            for case_name, status, msg, time_s in _cases(r):
                case = ET.SubElement(
                    suite,
                    "testcase",
                    classname=xml_text(r.host, 200),
                    name=xml_text(case_name, 500),
                    time=f"{time_s:.3f}",
                )
                counts["tests"] += 1
                if status is Status.UNREACHABLE:
                    counts["errors"] += 1
                    fault = ET.SubElement(case, "error", message=xml_text(msg), type="unreachable")
                    fault.text = _evidence_text(msg, r.evidence)
                elif status is Status.FAILED:
                    counts["failures"] += 1
                    fault = ET.SubElement(case, "failure", message=xml_text(msg), type="failed")
                    fault.text = _evidence_text(msg, r.evidence)
                elif status is Status.SKIPPED:
                    counts["skipped"] += 1
                    ET.SubElement(case, "skipped", message=xml_text(msg))
                elif msg:
                    ET.SubElement(case, "system-out").text = xml_text(msg)
        suite.set("time", f"{seconds:.3f}")
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _cases(r: Result) -> list[tuple[str, Status, str, float]]:
    """(name, status, message, seconds) for each test case of one host's result."""
    if r.status is Status.UNREACHABLE or not r.items:
        return [(r.task, r.status, r.msg, r.seconds)]
    out = []
    for item in r.items:
        seconds = item.details.get("seconds")
        time_s = (
            float(seconds)
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
            else 0.0
        )
        out.append((item.label, item.status, item.msg, max(time_s, 0.0)))
    return out


def _evidence_text(msg: str, evidence: Evidence | None) -> str:
    lines = [msg]
    if evidence is not None:
        lines.append(f"command: {evidence.command}")
        lines.append(f"exit code: {'-' if evidence.exit_code is None else evidence.exit_code}")
        lines += ["stderr:", *evidence.stderr_tail] if evidence.stderr_tail else []
    return xml_text("\n".join(lines))
