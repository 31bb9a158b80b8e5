"""--metrics: a run's results as the Prometheus text format, from results recorded off real lab runs
(tests/fixtures/runs/: `verify`, `patch --check`, `gpu`, `status` on the lab, one node stopped for
verify-unreachable), checked by Prometheus' own `promtool check metrics`."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from fleetops.report.files import write_atomically
from fleetops.report.metrics import MAX_LABEL, exposition, label_value
from fleetops.results import Evidence, Item, Result, Status

RUNS = Path(__file__).parent / "fixtures" / "runs"
NOW = 1796617800.0
SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")


def recorded(name: str) -> list[Result]:
    """The results of a recorded `--json` run, as the run had them."""
    doc = json.loads((RUNS / f"{name}.json").read_text())
    out = []
    for r in doc["results"]:
        items = [Item(i["label"], Status(i["status"]), i["msg"], i["details"]) for i in r["items"]]
        evidence = Evidence(**r["evidence"]) if r.get("evidence") else None
        out.append(
            Result(
                r["host"],
                r["task"],
                Status(r["status"]),
                r["msg"],
                items,
                evidence,
                r["code"],
                r["data"],
                r["seconds"],
            )
        )
    return out


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, line
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m["labels"] or ""))
        out.append((m["name"], labels, float(m["value"])))
    return out


def promtool_accepts(text: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install Debian's prometheus package (scripts/setup does)"
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_check_run_is_one_series_with_its_verdict_and_skipped_checks_none():
    results = recorded("verify")
    text = exposition(results, playbook="speculators-0.3.0-vllm-0.16", now=NOW)
    got = {
        (s[1]["host"], s[1]["check"], s[1]["kind"]): s[2]
        for s in samples(text)
        if s[0] == "fleetops_check_ok"
    }
    wanted = {}
    for r in results:
        for item in r.items:
            if item.status in (Status.OK, Status.FAILED):
                check, kind = re.fullmatch(r"(.+) \[([a-z]+)\]", item.label).groups()
                wanted[(r.host, check, kind)] = 1.0 if item.status is Status.OK else 0.0
    assert got == wanted and 0.0 in got.values() and 1.0 in got.values()
    assert {s[1]["playbook"] for s in samples(text) if s[0] == "fleetops_check_ok"} == {
        "speculators-0.3.0-vllm-0.16"
    }
    seconds = {s[1]["host"]: s[2] for s in samples(text) if s[0] == "fleetops_verify_seconds"}
    assert seconds == {r.host: round(r.seconds, 3) for r in results} and all(
        v > 0 for v in seconds.values()
    )
    promtool_accepts(text)


def test_an_unreachable_host_is_reachable_0_and_has_no_check_series():
    text = exposition(recorded("verify-unreachable"), playbook="p", now=NOW)
    reach = {s[1]["host"]: s[2] for s in samples(text) if s[0] == "fleetops_host_reachable"}
    assert reach == {"lab01": 1.0, "lab02": 0.0}
    assert {s[1]["host"] for s in samples(text) if s[0] == "fleetops_check_ok"} == {"lab01"}
    assert ("fleetops_last_run_timestamp_seconds", {"task": "verify"}, NOW) in samples(text)
    promtool_accepts(text)


def test_patch_state_is_a_set_of_series_one_of_them_1_per_file():
    text = exposition(recorded("patch"), playbook="p", now=NOW)
    states: dict[tuple[str, str], dict[str, float]] = {}
    for name, labels, value in samples(text):
        if name == "fleetops_patch_state":
            states.setdefault((labels["host"], labels["file"]), {})[labels["state"]] = value
    assert states and all(sum(v.values()) == 1 and len(v) == 4 for v in states.values())
    # patched by the recording
    assert {host for (host, _), v in states.items() if v["patched"] == 1} == {"lab01"}
    # would apply: original
    assert {host for (host, _), v in states.items() if v["original"] == 1} == {"lab02"}
    # modules the playbook names, not the node's paths
    assert not any("/" in file for _, file in states)
    promtool_accepts(text)


def test_gpu_memory_in_bytes_per_gpu_and_job_state_of_the_latest_job():
    text = exposition([*recorded("gpu-busy"), *recorded("status")], playbook="p", now=NOW)
    mem = {s[1]["gpu"]: s[2] for s in samples(text) if s[0] == "fleetops_gpu_memory_used_bytes"}
    gpus = recorded("gpu-busy")[0].data["gpus"]
    assert (
        mem == {str(g["index"]): g["memory_used_mib"] * 1024 * 1024 for g in gpus}
        and min(mem.values()) > 0
    )
    jobs = [
        (s[1]["host"], s[1]["job_name"], s[1]["state"])
        for s in samples(text)
        if s[0] == "fleetops_job_state" and s[2] == 1
    ]
    assert jobs == [("lab01", "extract", "running")]  # lab02 had never run a job: no series
    assert "job=" not in text  # Prometheus' own target label is left alone
    promtool_accepts(text)


def test_node_text_never_becomes_a_label_and_operator_text_is_escaped_and_bounded():
    evil = 'x"} fleetops_host_reachable{host="forged"} 1\n\x1b[2J'
    results = [
        Result(
            "lab01",
            "verify",
            Status.FAILED,
            "",
            [Item(f"{evil}{'y' * 300} [grep]", Status.FAILED, evil)],
            seconds=0.5,
        ),
        Result(
            "lab01",
            "gpu",
            Status.OK,
            "",
            data={
                "gpus": [
                    {"index": evil, "memory_used_mib": 5},
                    {"index": True, "memory_used_mib": 5},
                    {"index": 3, "memory_used_mib": evil},
                    {"index": 2, "memory_used_mib": 7},
                ]
            },
        ),
        Result("lab01", "status", Status.OK, "", data={"job": {"name": evil}, "state": evil}),
    ]
    text = exposition(results, playbook=evil, now=NOW)
    assert "forged" not in {s[1].get("host") for s in samples(text)}
    assert "\x1b" not in text and text.count("\n") == len(text.splitlines())
    [check] = [s for s in samples(text) if s[0] == "fleetops_check_ok"]
    assert len(check[1]["check"]) <= MAX_LABEL + text.count('\\"') and check[1]["check"].endswith(
        "..."
    )
    assert [s[1]["gpu"] for s in samples(text) if s[0] == "fleetops_gpu_memory_used_bytes"] == ["2"]
    assert {s[1]["job_name"] for s in samples(text) if s[0] == "fleetops_job_state"} == {"unknown"}
    assert [s[1]["state"] for s in samples(text) if s[0] == "fleetops_job_state" and s[2] == 1] == [
        "unknown"
    ]
    assert label_value("a\tb\x00c") == "a?b?c"
    promtool_accepts(text)


def test_the_file_is_replaced_whole_readable_by_a_collector_and_no_temp_is_left(tmp_path: Path):
    target = tmp_path / "fleetops.prom"
    target.write_text("old\n")
    seen_inode = target.stat().st_ino
    text = exposition(recorded("verify"), playbook="p", now=NOW)
    write_atomically(target, text)
    # renamed over, never rewritten
    assert target.read_text() == text and target.stat().st_ino != seen_inode
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleetops.prom"]

    with pytest.raises(TypeError):
        # a failed write leaves the old file and no temp
        write_atomically(target, 5)  # type: ignore[arg-type]
    assert target.read_text() == text and sorted(os.listdir(tmp_path)) == ["fleetops.prom"]
