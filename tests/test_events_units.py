"""Progress as typed events: the job tasks emit values, only report/ words them; and each event
reads exactly as the console printed it before the words moved out of the tasks."""

from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest
from rich.console import Console

from fleetops.report.console import Reporter
from fleetops.report.events import event_text
from fleetops.results.events import (
    ControllerBack,
    ControllerGone,
    CopyRestarted,
    Detached,
    Event,
    FleetSummary,
    JobAttached,
    JobEnded,
    JobLine,
    LinesSkipped,
    Said,
    SlurmDetached,
    SlurmState,
    TailEnd,
    Waiting,
)

TASKS = Path(__file__).resolve().parent.parent / "fleetops" / "tasks"

# Task modules outside the job family that still call the reporter; each leaves this list when it
# emits events instead (the test fails on any module not listed, and on a listed one that is clean).
NOT_YET: set[str] = set()


def _touches_reporter(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ("reporter", "_reporter")
    ]


def test_no_task_module_touches_the_reporter() -> None:
    touching = {
        str(p.relative_to(TASKS)): lines
        for p in sorted(TASKS.rglob("*.py"))
        if (lines := _touches_reporter(p))
    }
    assert not {k: v for k, v in touching.items() if k not in NOT_YET}
    assert set(touching) == NOT_YET  # one migrated: take it off NOT_YET


def test_the_scan_sees_a_reporter_attribute(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f(run):\n    r = run.reporter\n    self._reporter.note('x')\n")
    assert _touches_reporter(bad) == [2, 3]


NOTES: list[tuple[Event, str]] = [
    (TailEnd("n1", "j1", "succeeded (exit 0)"), "n1 | job j1 succeeded (exit 0)"),
    (Detached("n1", "j1"), "n1 | detached: job j1 is still running"),
    (Detached("n1", None), "n1 | detached: job (the latest) is still running"),
    (
        SlurmDetached("n1", "j1"),
        "n1 | detached: Slurm job j1 keeps running (fab -H n1 tail to re-attach)",
    ),
    (
        LinesSkipped("n1", "j1", 12, 3400),
        "n1 | job j1: 12 earlier lines not shown (3400 bytes); --from-start replays them",
    ),
    (
        LinesSkipped("n1/1", "j1", None, 3400),
        "n1/1 | job j1: the earlier lines not shown (3400 bytes); --from-start replays them",
    ),
    (
        ControllerGone("n1", "slurmctld unreachable"),
        "n1 | slurmctld unreachable; the job may still be running: following its log until Slurm "
        "answers again (Ctrl-C detaches)",
    ),
    (ControllerBack("n1"), "n1 | Slurm's controller answers again"),
    (SlurmState("n1", "42", "pending (Resources)"), "n1 | Slurm job 42: pending (Resources)"),
    (
        SlurmState("n1", "42", "running", ("c1", "c2")),
        "n1 | Slurm job 42: running on c1, c2",
    ),
    (
        FleetSummary("3/4 shards", 2, 4, "/p/plan.json"),
        "fleet | 3/4 shards; 2/4 shards complete; plan /p/plan.json",
    ),
    (
        FleetSummary("3/4 shards", 2, 4, "/p/plan.json", "/p/plan.json not written: full"),
        "fleet | 3/4 shards; 2/4 shards complete; plan /p/plan.json "
        "(/p/plan.json not written: full)",
    ),
    (
        CopyRestarted("n1", "job j1 outputs/x.pt"),
        "n1 | job j1 outputs/x.pt: the partial copy did not match the node's file; "
        "downloading it again from byte 0",
    ),
    (
        Said("n1 | connection lost (reset); reconnecting in 1.0s"),
        "n1 | connection lost (reset); reconnecting in 1.0s",
    ),
]


@pytest.mark.parametrize(("event", "text"), NOTES)
def test_a_note_event_reads_as_before(event: Event, text: str) -> None:
    assert event_text(event) == text
    out, rep = _reporter()
    rep.emit(event)
    assert out.getvalue() == text + "\n"


@pytest.mark.parametrize(
    "event",
    [
        JobLine("n1", "x", False),
        JobAttached("n1", "j1", "running"),
        JobEnded("n1", "ok"),
        Waiting("n1", "gpu", "idle", 5.0),
    ],
)
def test_a_drawing_event_has_no_note(event: Event) -> None:
    assert event_text(event) is None


def _reporter() -> tuple[io.StringIO, Reporter]:
    out = io.StringIO()
    return out, Reporter(console=Console(file=out, width=130, highlight=False, soft_wrap=True))


def test_job_lines_print_with_their_label() -> None:
    out, rep = _reporter()
    rep.emit(JobLine("n1", "step 3 done", False))
    rep.emit(JobLine("n1", "Traceback: boom", True))
    rep.emit(JobLine("n1", "50%", False, {"done": 5, "total": 10}))
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["n1 | step 3 done", "n1 | Traceback: boom"]
    assert lines[2].startswith("n1 | ") and lines[2].endswith(" 50%")


def test_waiting_says_the_wait_once_then_each_change() -> None:
    out, rep = _reporter()
    rep.emit(Waiting("n1", "gpu", "busy", 30.0))
    rep.emit(Waiting("n1", "gpu", "busy", 29.0))
    rep.emit(Waiting("n1", "gpu", "idle soon", 20.0))
    assert out.getvalue().splitlines() == [
        "n1 | gpu | waiting up to 30s: busy",
        "n1 | gpu | waiting: idle soon (20s left)",
    ]


def test_attach_and_end_reach_the_tail_view() -> None:
    out, rep = _reporter()
    rep.emit(JobAttached("n1", "j1", "running"))
    row = rep.tail.hosts["n1"]
    assert (row.job_id, row.state) == ("j1", "running")
    rep.emit(JobEnded("n1", "succeeded"))
    assert (row.state, row.eta) == ("succeeded", 0.0)
    assert out.getvalue() == ""  # piped: the tail view draws nothing of its own
