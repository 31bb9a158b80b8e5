"""`gpu`'s verdicts: each host's verdict word (OK / WARN / CRITICAL / UNKNOWN), the exit status of
the worst verdict across hosts, and the finding's next action printed once per host result. No sshd:
the gate runs on nvidia-smi output recorded on a 2×H200 machine (tests/fixtures/nvidia-smi)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from fleetops.plans.gpugate import Gate
from fleetops.report.console import Reporter
from fleetops.report.fold import plain
from fleetops.report.rows import fleet_sections
from fleetops.results import (
    EXIT_FAILED,
    EXIT_GPU_BUSY,
    EXIT_GPU_UNHEALTHY,
    EXIT_NO_NVIDIA_SMI,
    EXIT_NVIDIA_SMI_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    Result,
    Status,
    exit_status,
)
from fleetops.tasks.gpu import _interpret_gpu
from fleetops.tasks.plan import Plan
from remote_scripts.health import nvsmi

FIX = Path(__file__).parent / "fixtures" / "nvidia-smi" / "h200x2"
PLAN = Plan("gpu", {}, 60, None, options={"gate": Gate(expected=2), "wait": 0.0})


def snapshot(state: str, job: str | None = None) -> dict:
    """What the agent answers in each simulated state (the lab's states, built from the
    recordings)."""
    if state == "absent":
        return {
            "ok": False,
            "error_kind": "no_nvidia_smi",
            "error": "nvidia-smi not found on the node (PATH=/usr/bin)",
        }
    if state == "driver_error":
        return {
            "ok": False,
            "error_kind": "nvidia_smi_failed",
            "exit_code": 18,
            "error": (
                "nvidia-smi failed (exit 18): Failed to "
                "initialize NVML: Driver/library version mismatch"
            ),
        }
    kind = "busy" if state == "busy" else "idle"
    gpus = nvsmi.parse_query((FIX / f"{kind}_query.csv").read_text())
    nvsmi.join_processes(gpus, nvsmi.parse_apps((FIX / f"{kind}_apps.csv").read_text()))
    for p in (p for g in gpus for p in g["processes"]):
        p.update(user="alice", age_s=60, command="python3 hold.py", job=job)
    if state == "missing":
        gpus = gpus[:1]
    if state == "ecc":
        gpus[1]["ecc_uncorrected"] = 3
    return {"ok": True, "gpus": gpus}


def gpu_result(host: str, state: str, job: str | None = None) -> Result:
    return _interpret_gpu(host, PLAN, snapshot(state, job))


def drawn(r: Result) -> list[str]:
    lines, _table = Reporter().draw(r)
    return [plain(line, r.host) for line in lines]


@pytest.mark.parametrize(
    "state, word, code, status",
    [
        ("idle", "OK", EXIT_OK, Status.OK),
        # still fails the step: a chain `gpu extract` stops
        ("busy", "WARN", EXIT_GPU_BUSY, Status.FAILED),
        ("missing", "CRITICAL", EXIT_GPU_UNHEALTHY, Status.FAILED),
        ("ecc", "CRITICAL", EXIT_GPU_UNHEALTHY, Status.FAILED),
        ("absent", "UNKNOWN", EXIT_NO_NVIDIA_SMI, Status.FAILED),
        ("driver_error", "UNKNOWN", EXIT_NVIDIA_SMI_FAILED, Status.FAILED),
    ],
)
def test_each_state_has_its_verdict_word_exit_status_and_step_status(state, word, code, status):
    r = gpu_result("lab01", state)
    assert (r.data["verdict"], r.code, r.status) == (word, code, status)
    assert r.msg.startswith(f"{word}: "), r.msg
    assert r.to_json()["data"]["verdict"] == word  # what --json shows


def test_the_result_line_says_the_verdict():
    assert (
        drawn(gpu_result("lab01", "busy"))[0]
        == "lab01 | gpu | failed | WARN: 0/2 selected GPUs free; 2 busy"
    )
    assert drawn(gpu_result("lab01", "idle"))[0] == "lab01 | gpu | ok | OK: 2/2 selected GPUs free"


@pytest.mark.parametrize(
    "state, command",
    [
        ("busy", "fab -H lab01 gpu --wait 600"),
        ("missing", "fab -H lab01 diagnose"),
        ("ecc", "fab -H lab01 diagnose"),
        ("absent", "fab -H lab01 run 'command -v nvidia-smi'"),
        ("driver_error", "fab -H lab01 diagnose"),
    ],
)
def test_each_finding_prints_its_next_action_once_per_host_not_per_gpu(state, command):
    lines = drawn(gpu_result("lab01", state))
    nexts = [n for n, ln in enumerate(lines) if ln.strip().startswith("next:")]
    assert len(nexts) == 1, lines
    # whole, alone, the last thing read
    assert [ln.strip() for ln in lines[nexts[0] + 1 :]] == [command], lines


def test_busy_gpus_held_by_our_own_job_point_at_stop():
    r = gpu_result("lab01", "busy", job="20261130-170000-abcd")
    assert r.data["next"]["commands"] == ["fab -H lab01 jobs", "fab -H lab01 stop"], r.data["next"]
    # someone else's
    assert not any("stop" in c for c in gpu_result("lab01", "busy").data["next"]["commands"])


def test_ok_has_no_next_action():
    r = gpu_result("lab01", "idle")
    assert not r.data.get("next") and not [ln for ln in drawn(r) if "next:" in ln]


def test_a_host_name_that_needs_quoting_is_quoted_in_the_command():
    assert gpu_result("odd name", "missing").data["next"]["commands"] == [
        "fab -H 'odd name' diagnose"
    ]


# ---------------------------------------------------------------- the exit status: the worst
# verdict wins
def run_of(*codes: int) -> list[Result]:
    return [
        Result(f"h{i}", "gpu", Status.OK if c == EXIT_OK else Status.FAILED, "", code=c)
        for i, c in enumerate(codes)
    ]


@pytest.mark.parametrize(
    "codes, expected",
    [
        # CRITICAL beats UNKNOWN
        ((EXIT_GPU_BUSY, EXIT_GPU_UNHEALTHY, EXIT_NO_NVIDIA_SMI), EXIT_GPU_UNHEALTHY),
        ((EXIT_GPU_UNHEALTHY, EXIT_NVIDIA_SMI_FAILED), EXIT_GPU_UNHEALTHY),
        ((EXIT_GPU_BUSY, EXIT_NO_NVIDIA_SMI), EXIT_NO_NVIDIA_SMI),  # UNKNOWN beats WARN
        ((EXIT_NVIDIA_SMI_FAILED, EXIT_GPU_BUSY), EXIT_NVIDIA_SMI_FAILED),
        ((EXIT_OK, EXIT_GPU_BUSY, EXIT_OK), EXIT_GPU_BUSY),
        ((EXIT_OK, EXIT_OK), EXIT_OK),
        ((EXIT_GPU_BUSY, EXIT_FAILED), EXIT_GPU_BUSY),
    ],
)
def test_exit_status_follows_the_worst_gpu_verdict(codes, expected):
    assert exit_status(run_of(*codes)) == expected
    assert exit_status(run_of(*reversed(codes))) == expected  # whatever order the hosts finished in


def test_other_exit_statuses_keep_their_order():
    unreachable = Result("h9", "gpu", Status.UNREACHABLE, "no route", code=EXIT_UNREACHABLE)
    assert exit_status([unreachable, *run_of(EXIT_GPU_BUSY)]) == EXIT_GPU_BUSY  # as before
    assert exit_status([unreachable, *run_of(EXIT_OK)]) == EXIT_UNREACHABLE

    def diag(code: int) -> Result:
        return Result("d", "diagnose", Status.FAILED if code == 22 else Status.OK, "", code=code)

    # diagnose's, unchanged
    for codes, expected in (((20, 21), 21), ((22, 21, 20), 22), ((20,), 20)):
        assert exit_status([diag(c) for c in codes]) == expected
    # numbers across tasks, as before
    assert exit_status([diag(20), *run_of(EXIT_GPU_UNHEALTHY)]) == 20
    assert (
        exit_status([Result("t", "tail", Status.OK, "", code=130), *run_of(EXIT_GPU_UNHEALTHY)])
        == 130
    )


# ---------------------------------------------------------------- the fleet summary
def test_gpu_fleet_summary_shows_the_verdict_word():
    results = [
        gpu_result("lab01", "idle"),
        gpu_result("lab02", "busy"),
        gpu_result("lab03", "absent"),
        Result("lab04", "gpu", Status.UNREACHABLE, "connection refused", code=EXIT_UNREACHABLE),
    ]
    [section] = [s for s in fleet_sections(results) if s["title"] == "GPU fleet summary"]
    assert section["columns"] == ["host", "verdict", "GPUs"]
    # worst first: a host the gate could not judge ranks with UNKNOWN
    assert [row[:2] for row in section["rows"]] == [
        ["lab03", "UNKNOWN"],
        ["lab04", "unreachable"],
        ["lab02", "WARN"],
        ["lab01", "OK"],
    ]
    folded = [
        s
        for s in fleet_sections(results + [gpu_result("lab05", "idle")], fold=True)
        if s["title"] == "GPU fleet summary"
    ][0]
    assert folded["columns"] == ["hosts", "verdict", "GPUs"]
    assert folded["rows"][-1] == ["lab[01,05] (2)", "OK", "2 free"], folded["rows"]


def test_the_printed_result_line_says_critical_for_a_missing_gpu():
    out = io.StringIO()
    rep = Reporter(console=Console(file=out, width=200, highlight=False, soft_wrap=True))
    r = gpu_result("lab01", "missing")
    rep.result(r)
    assert (
        "lab01 | gpu | failed | CRITICAL: 1/1 selected "
        "GPUs free; expected 2 GPUs, saw 1: missing GPU 1"
    ) in out.getvalue()
