"""The live view on a terminal: what it draws under each printed line is the hosts' state now."""

from __future__ import annotations

import io
import re

from rich.console import Console

from fleetops.report.console import Reporter
from fleetops.results import Result, Status

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_a_line_printed_right_after_the_start_is_followed_by_running_not_the_stale_queued_frame():
    # The defect: rich redraws under each printed line the table it built at its last refresh (4 a
    # second); a job's first line within 250 ms of the start showed the host `queued` under it.
    out = io.StringIO()
    rep = Reporter(
        console=Console(file=out, width=120, force_terminal=True, highlight=False, soft_wrap=True)
    )
    rep.live_start(["lab01"])
    try:
        assert rep.live is not None
        rep.task_started("lab01", "tail")
        rep.job_attached("lab01", "job-1", "running")
        before = len(out.getvalue())
        rep.job_line("lab01", "warming up", False, None)
        after = ANSI.sub("", out.getvalue()[before:])
    finally:
        rep.live_stop()
    assert "warming up" in after
    drawn = after[after.index("warming up") :]
    assert "queued" not in drawn, drawn
    assert re.search(r"lab01\s+│\s+tail job-1\s+│\s+running", drawn), drawn


def test_the_live_view_waits_for_prepare_when_rich_is_not_loaded_yet(monkeypatch):
    """A run draws nothing before its first result, so rich (and the console) load in prepare(),
    which the main thread calls while the first connections are in their handshakes. The live view
    asked for by live_start starts there, on a terminal only."""
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich: a terminal
    monkeypatch.delenv("FLEETOPS_NO_LIVE", raising=False)
    monkeypatch.setattr("sys.stdout", io.StringIO())
    rep = Reporter()
    rep.live_start(["lab01"])
    assert rep.live is None and rep._console is None  # nothing drawn, nothing loaded yet
    rep.prepare()
    try:
        assert rep.live is not None and rep.console.is_terminal
    finally:
        rep.live_stop()
    monkeypatch.delenv("FORCE_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    plain = Reporter()
    plain.live_start(["lab01"])
    plain.prepare()
    assert plain.live is None and not plain.console.is_terminal  # a pipe or a file: no live view


def test_prepare_loads_the_console_for_a_piped_run_without_the_live_view_too(monkeypatch):
    """With no live view (FLEETOPS_NO_LIVE=1, as runbooks and the bench run it, or a pipe) prepare()
    returned before touching the console, so rich was imported by the first result's print: ~40 ms
    after the first host answered instead of during the handshakes (`fab -H lab01 patch verify` at
    50 ms RTT: 58 ms slower than with --json, 20 alternating runs). A --json run still loads
    nothing."""
    monkeypatch.setenv("FLEETOPS_NO_LIVE", "1")
    monkeypatch.setattr("sys.stdout", io.StringIO())
    rep = Reporter()
    rep.live_start(["lab01"])
    assert rep._console is None
    rep.prepare()
    assert rep._console is not None and rep.live is None  # loaded, and still no live view
    quiet = Reporter(json_mode=True)
    quiet.live_start(["lab01"])
    quiet.prepare()
    assert quiet._console is None


def test_a_host_whose_wait_ended_shows_its_step_not_the_countdown():
    out = io.StringIO()
    rep = Reporter(
        console=Console(file=out, width=120, force_terminal=True, highlight=False, soft_wrap=True)
    )
    rep.live_start(["lab01"])
    try:
        rep.task_started("lab01", "gpu")
        rep.waiting("lab01", "gpu", "0/2 selected GPUs free; 2 busy", 0.4)
        assert rep.rows["lab01"]["task"].startswith("gpu waiting 0s more")
        rep.result(Result("lab01", "gpu", Status.FAILED, "WARN: still busy after waiting 6s"))
        assert rep.rows["lab01"]["task"] == "gpu", rep.rows
    finally:
        rep.live_stop()
