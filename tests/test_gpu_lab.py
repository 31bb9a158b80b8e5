"""`gpu` and `facts` over real SSH against lab nodes whose nvidia-smi replays recorded H200 output;
a GPU is busy exactly as long as a real process holding it is alive (read from /proc by the
simulation)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, fab_json, run_fab
from polling import Follower, proc_state, wait_for

from fleetops.lab import HOLDER_MARK
from fleetops.results import (
    EXIT_GPU_BUSY,
    EXIT_GPU_UNHEALTHY,
    EXIT_NO_NVIDIA_SMI,
    EXIT_NVIDIA_SMI_FAILED,
)

pytestmark = pytest.mark.lab
ENV = {"PYTHONPATH": str(REPO), "COLUMNS": "300"}
JOBS = str(REPO / "tests" / "playbooks" / "jobs.yaml")
# With nvidia-smi absent on lab02, these facts must differ between lab01 and lab02 and the others
# must not.
DIFFERENT_FACTS = {"driver", "cuda", "gpus"}
SAME_FACTS = {"os", "python", "vllm", "speculators", "torch", "transformers"}


@pytest.fixture
def gpus(lab):
    yield lab
    for node in lab.nodes():
        lab.set_gpu_state(node, "idle")


@pytest.mark.parametrize(
    "state, code, word, says, next_",
    [
        ("idle", 0, "OK", "OK: 2/2 selected GPUs free", None),
        (
            "busy",
            EXIT_GPU_BUSY,
            "WARN",
            "WARN: 0/2 selected GPUs free; 2 busy",
            "fab -H lab01 gpu --wait 600",
        ),
        (
            "missing",
            EXIT_GPU_UNHEALTHY,
            "CRITICAL",
            "CRITICAL: 1/1 selected GPUs free; expected 2 GPUs, saw 1: missing GPU 1",
            "fab -H lab01 diagnose",
        ),
        (
            "driver_error",
            EXIT_NVIDIA_SMI_FAILED,
            "UNKNOWN",
            (
                "UNKNOWN: nvidia-smi failed (exit 18): Failed to "
                "initialize NVML: Driver/library version mismatch"
            ),
            "fab -H lab01 diagnose",
        ),
        (
            "absent",
            EXIT_NO_NVIDIA_SMI,
            "UNKNOWN",
            "UNKNOWN: nvidia-smi not found",
            "fab -H lab01 run 'command -v nvidia-smi'",
        ),
    ],
)
def test_each_simulated_state_gives_its_verdict_exit_status_and_next_action(
    gpus, state, code, word, says, next_
):
    gpus.set_gpu_state(gpus.node("lab01"), state)
    rc, doc = fab_json(gpus.root, "-H", "lab01", "gpu")
    r = doc["results"][0]
    assert rc == code, doc
    assert r["msg"].startswith(says), r["msg"]
    assert r["data"]["verdict"] == word, r["data"]
    if next_ is None:
        assert not r["data"]["next"], r["data"]
    else:
        assert r["data"]["next"]["commands"] == [next_], r["data"]
    if state in ("idle", "busy", "missing"):
        assert r["data"]["simulated"] is True


@pytest.mark.parametrize(
    "states, code",
    [
        (("busy", "absent"), EXIT_NO_NVIDIA_SMI),  # UNKNOWN beats WARN
        (("missing", "absent"), EXIT_GPU_UNHEALTHY),  # CRITICAL beats UNKNOWN, though 12 > 11
        (("missing", "driver_error"), EXIT_GPU_UNHEALTHY),
    ],
)
def test_the_exit_status_is_the_worst_verdict_across_hosts(gpus, states, code):
    for name, state in zip(("lab01", "lab02"), states):
        gpus.set_gpu_state(gpus.node(name), state)
    proc = run_fab(
        gpus.root, "-H", "lab01,lab02", "gpu", env={"COLUMNS": "300", "FLEETOPS_NO_LIVE": "1"}
    )
    assert proc.returncode == code, proc.stdout + proc.stderr
    summary = re.findall(r"^│ (lab0[12]) +│ (\w+) +│", proc.stdout, re.M)
    words = {"busy": "WARN", "missing": "CRITICAL", "absent": "UNKNOWN", "driver_error": "UNKNOWN"}
    assert sorted(summary) == [("lab01", words[states[0]]), ("lab02", words[states[1]])], (
        proc.stdout
    )


def test_hosts_that_differ_only_by_name_fold_with_one_next_action(gpus):
    for name in ("lab01", "lab02"):
        gpus.set_gpu_state(gpus.node(name), "missing")
    proc = run_fab(
        gpus.root,
        "-H",
        "lab01,lab02",
        "gpu",
        env={"COLUMNS": "300", "FLEETOPS_NO_LIVE": "1", "FLEETOPS_FOLD": "1"},
    )
    out = proc.stdout
    assert proc.returncode == EXIT_GPU_UNHEALTHY, out + proc.stderr
    assert (
        "lab[01-02] (2) | gpu | failed | CRITICAL: 1/1 selected GPUs free; expected 2 GPUs, "
        "saw 1: missing GPU 1"
    ) in out, out
    assert out.count("| gpu |") == 1, out  # one group
    lines = [ln.strip() for ln in out.splitlines()]
    nexts = [(ln, lines[n + 1]) for n, ln in enumerate(lines) if ln.startswith("next:")]
    # one next for the group, its command naming the group's hosts: it runs as printed
    assert nexts == [
        (
            "next: Xid events, ECC, row remapping; keep work off the node until it is fixed",
            "fab -H 'lab[01-02]' diagnose",
        )
    ], out


def test_gpus_held_by_a_fleetops_job_point_at_stop(gpus):
    rc, doc = fab_json(gpus.root, "-H", "lab01", "extract", "--job", "spawner", "--playbook", JOBS)
    assert rc == 0, doc
    try:

        def busy() -> dict | None:  # the simulated GPU shows the job's process once it runs
            rc, doc = fab_json(gpus.root, "-H", "lab01", "gpu")
            return doc if rc == EXIT_GPU_BUSY else None

        r = wait_for(busy, "the job's process on a GPU", 120)["results"][0]
        assert r["data"]["verdict"] == "WARN", r
        assert r["data"]["next"] == {
            "why": "a fleetops job holds them: see it, and stop it if it should not run",
            "commands": ["fab -H lab01 jobs", "fab -H lab01 stop"],
        }, r["data"]
    finally:
        run_fab(gpus.root, "-H", "lab01", "stop", "--grace", "5")


def test_busy_lists_the_real_holder_process(gpus):
    config = gpus.set_gpu_state(gpus.node("lab01"), "busy")
    rc, doc = fab_json(gpus.root, "-H", "lab01", "gpu")
    assert rc == EXIT_GPU_BUSY
    procs = [p for i in doc["results"][0]["items"] for p in i["details"]["processes"]]
    assert [p["pid"] for p in procs] == config["holder_pids"]
    assert all(
        p["user"] == gpus.user and p["visible"] and HOLDER_MARK in p["command"] for p in procs
    )
    assert all(p["job"] is None for p in procs)  # not launched by fleetops: foreign


def test_a_gpu_is_held_exactly_as_long_as_its_holder_process_lives(gpus):
    holders = gpus.set_gpu_state(gpus.node("lab01"), "busy")["holder_pids"]
    # Kill GPU 1's holder from outside the lab (no state switch): its memory is released, GPU 0's is
    # not.
    os.kill(holders[1], signal.SIGKILL)
    os.waitpid(holders[1], 0)  # our child: reap it, so /proc has no entry left for it at all
    assert proc_state(holders[1]) == "gone"
    rc, doc = fab_json(gpus.root, "-H", "lab01", "gpu")
    r = doc["results"][0]
    assert rc == EXIT_GPU_BUSY and r["msg"] == "WARN: 1/2 selected GPUs free; 1 busy", r["msg"]
    states = {
        i["label"]: (i["details"]["state"], [p["pid"] for p in i["details"]["processes"]])
        for i in r["items"]
    }
    assert states == {
        "GPU 0 NVIDIA H200": ("busy", [holders[0]]),
        "GPU 1 NVIDIA H200": ("free", []),
    }
    # the recordings
    assert {g["index"]: g["memory_used_mib"] for g in r["data"]["gpus"]} == {0: 21099, 1: 0}
    os.kill(holders[0], signal.SIGKILL)
    os.waitpid(holders[0], 0)
    rc, doc = fab_json(gpus.root, "-H", "lab01", "gpu")
    assert rc == 0 and doc["results"][0]["msg"] == "OK: 2/2 selected GPUs free", doc


def test_threshold_and_selection_options(gpus):
    gpus.set_gpu_state(gpus.node("lab01"), "busy")
    rc, doc = fab_json(gpus.root, "-H", "lab01", "gpu", "--gpus", "1", "--threshold", "100000")
    assert rc == EXIT_GPU_BUSY  # a process on it still makes it busy
    assert [i["label"] for i in doc["results"][0]["items"]] == ["GPU 1 NVIDIA H200"]


def test_wait_passes_when_gpus_turn_free_mid_wait(gpus):
    node = gpus.node("lab01")
    gpus.set_gpu_state(node, "busy")
    with Follower(gpus.root, ["-H", "lab01", "gpu", "--wait", "300"], ENV) as gate:
        # Evidence that the gate has seen the GPUs busy and is waiting, then free them.
        gate.wait_line(
            r"^lab01 \| gpu \| waiting up to \d+s: 0/2 selected GPUs free; 2 busy",
            "the gate waiting on busy GPUs",
        )
        gpus.set_gpu_state(node, "idle")
        rc, out, err = gate.finish(timeout=300)
    assert rc == 0, out + err
    assert re.search(r"^lab01 \| gpu \| ok \| OK: 2/2 selected GPUs free$", out, re.M), out


def test_wait_fails_at_the_deadline_listing_holders(gpus):
    holders = gpus.set_gpu_state(gpus.node("lab01"), "busy")["holder_pids"]
    proc = run_fab(
        gpus.root, "-H", "lab01", "gpu", "--wait", "6", env={"COLUMNS": "300"}, timeout=300
    )
    out = proc.stdout
    assert proc.returncode == EXIT_GPU_BUSY, out + proc.stderr
    # What it waits for, said once: the GPUs stay busy, so one line, not one a poll.
    waiting = re.findall(r"^lab01 \| gpu \| waiting.*$", out, re.M)
    assert len(waiting) == 1 and re.fullmatch(
        r"lab01 \| gpu \| waiting up to [56]s: 0/2 selected GPUs free; "
        r"2 busy",
        waiting[0],
    ), (waiting, out)
    assert "lab01 | gpu | failed | WARN: still busy after waiting 6s: GPU 0: pid" in out, out
    # once, not per GPU
    assert [ln.strip() for ln in out.splitlines()].count("fab -H lab01 gpu --wait 600") == 1, out
    assert all(f"pid {pid} python3" in out for pid in holders), out


def test_wait_verdict_comes_at_the_deadline_not_before(gpus):
    gpus.set_gpu_state(gpus.node("lab01"), "busy")
    rc, doc = fab_json(gpus.root, "-H", "lab01", "gpu", "--wait", "3")
    assert rc == EXIT_GPU_BUSY, doc
    # waited_s counts from the node's first answer to the verdict: never before the deadline; the
    # last poll may be in flight when the deadline passes, and one exec on a loaded 2-core machine
    # can take seconds, so the ceiling is generous but still far below what a gate that forgot its
    # deadline would take (the test's 300 s timeout).
    waited = doc["results"][0]["data"]["waited_s"]
    assert 3.0 <= waited < 3.0 + 30, waited


def _node_versions(python: Path) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in "
        "('vllm', 'speculators', 'torch', 'transformers')}))"
    )
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _facts_table(out: str) -> tuple[list[str], dict[str, tuple[list[str], bool]]]:
    """The facts table of a colour run: its host columns, and per fact its values and whether the
    row is styled bold yellow (rich's SGR 1;33 around each cell's text)."""
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    lines = out.splitlines()
    start = next(
        i
        for i, ln in enumerate(lines)
        if "facts (rows that differ between hosts are highlighted)" in ln
    )
    hosts: list[str] = []
    rows: dict[str, tuple[list[str], bool]] = {}
    for raw in lines[start + 1 :]:
        plain = ansi.sub("", raw)
        if "│" not in plain and "┃" not in plain:
            if rows:
                break
            continue
        cells = [c.strip() for c in re.split(r"[│┃]", plain)[1:-1]]
        if cells[0] == "fact":
            hosts = cells[1:]
            continue
        # Highlighted: the fact's name and every value are printed bold yellow.
        yellow = {
            text.strip()
            for sgr, text in re.findall(r"\x1b\[([0-9;]*)m([^\x1b]*)\x1b\[0m", raw)
            if sgr == "1;33"
        }
        highlighted = set(cells) <= yellow
        rows[cells[0]] = (cells[1:], highlighted)
    return hosts, rows


def test_facts_report_the_real_versions_and_highlight_exactly_the_rows_that_differ(gpus):
    gpus.set_gpu_state(gpus.node("lab02"), "absent")
    rc, doc = fab_json(gpus.root, "-H", "lab01,lab02", "facts")
    assert rc == 0, doc
    by_host = {r["host"]: r["data"]["facts"] for r in doc["results"]}  # hosts finish in any order
    for name in ("lab01", "lab02"):
        # What the node's own interpreter says is installed, asked directly (not through fleetops).
        assert by_host[name]["packages"] == _node_versions(gpus.node(name).python), name
    f1, f2 = by_host["lab01"], by_host["lab02"]
    assert f1["packages"]["vllm"] == "0.16.0" and f1["packages"]["speculators"] == "0.3.0"
    assert f1["driver"] == "580.159.04" and f1["cuda"] == "13.0" and f1["gpu_count"] == 2, f1
    assert f2["driver"] is None and f2["gpu_count"] == 0

    # Colour forced (no terminal here), the live view off: the table's styling is in the output as
    # SGR codes.
    human = run_fab(
        gpus.root,
        "-H",
        "lab01,lab02",
        "facts",
        env={"FORCE_COLOR": "1", "FLEETOPS_NO_LIVE": "1", "COLUMNS": "300"},
    )
    assert human.returncode == 0, human.stdout + human.stderr
    hosts, rows = _facts_table(human.stdout)
    assert sorted(hosts) == ["lab01", "lab02"], human.stdout
    assert set(rows) >= SAME_FACTS | DIFFERENT_FACTS, rows
    for fact, (values, highlighted) in rows.items():
        # The rule, read off the printed table: a row is highlighted if and only if its values
        # differ.
        assert highlighted == (len(set(values)) > 1), (fact, values, highlighted)
    assert {f for f, (_, hl) in rows.items() if hl} & (
        SAME_FACTS | DIFFERENT_FACTS
    ) == DIFFERENT_FACTS, rows
    column = {h: i for i, h in enumerate(hosts)}
    assert (
        rows["driver"][0][column["lab01"]] == "580.159.04"
        and rows["driver"][0][column["lab02"]] == "not found"
    )


def test_lab_status_names_the_simulation(gpus):
    out = run_fab(gpus.root, "lab.status").stdout
    assert "GPUs: simulated 2x H200 (replayed nvidia-smi recordings), state idle" in out


def test_lab_gpu_task_switches_state(gpus):
    out = run_fab(gpus.root, "lab.gpu", "--state", "busy", "--node", "lab02").stdout
    assert "lab02: simulated GPUs now busy (held by pids" in out
    pids = gpus.gpu_state(gpus.node("lab02"))["holder_pids"]
    assert len(pids) == 2 and all(proc_state(pid) not in ("Z", "gone") for pid in pids)
    run_fab(gpus.root, "lab.gpu", "--state", "idle", "--node", "lab02")
    for pid in pids:  # killed; at most its exit status is left for init to collect
        wait_for(lambda pid=pid: proc_state(pid) in ("Z", "gone"), f"holder {pid} to be killed")
    rc, doc = fab_json(gpus.root, "-H", "lab02", "gpu")
    assert rc == 0, doc
