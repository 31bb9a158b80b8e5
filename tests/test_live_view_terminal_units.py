"""The live view on a real terminal (tmux, 80x40): whatever a worker prints while the view redraws
itself lands whole, once, above the view, and the view leaves nothing behind, however slowly a
starved CPU draws a frame."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import terminal

LINES = 80

DRIVER = f"""
import sys, threading, time
sys.path.insert(0, {str(terminal.REPO)!r})
from fleetops.report import liveview
from fleetops.report.console import Reporter

drawn = liveview.frame


def starved(*args):
    time.sleep(0.03)  # a frame drawn on a CPU shared with busier processes: the refresh lands \
mid-print
    return drawn(*args)


liveview.frame = starved
rep = Reporter()
rep.live_start(["lab01"])
rep.prepare()
rep.task_started("lab01", "gpu")
for n in range({LINES}):
    # the host's row changes height as its text grows and shrinks, as a countdown's fold does
    rep.waiting("lab01", "gpu", "0/8 selected GPUs free; 8 busy" + " held" * (8 * (n % 2)), \
{LINES} - n)
    rep.note(f"line {{n:03d}} printed")
    time.sleep(0.01)
rep.live_stop()
print("done")
"""


@pytest.fixture
def term(tmp_path: Path):
    if not terminal.available():
        pytest.skip("needs tmux (Debian's tmux package; scripts/setup installs it)")
    with terminal.Terminal(tmp_path) as t:
        yield t


def test_lines_printed_while_the_live_view_redraws_are_all_there_and_no_frame_row_is_left(
    tmp_path: Path, term: terminal.Terminal
):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    rc, screen = term.run(f"{sys.executable} {script}", timeout=120)
    assert rc == 0, screen
    printed = re.findall(r"^line (\d{3}) printed$", screen, re.M)
    # none erased by a redraw, none twice
    assert printed == [f"{n:03d}" for n in range(LINES)], screen
    assert "waiting" not in screen and "│" not in screen and "current task" not in screen, screen
    assert screen.rstrip().endswith("done"), screen
