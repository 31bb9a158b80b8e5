"""Ctrl-C while `fleet` starts (imports, parsing, reading the project, planning): one line, exit
130, never a traceback, whatever the moment. No node: the command's only host is the example
inventory's, refused (exit 2) once planned, so every moment of the sweep falls in start-up or after
the program ended."""

from __future__ import annotations

import sys
from pathlib import Path

from interrupts import run_span, sigint_at, sweep_over

FLEET = Path(sys.executable).parent / "fleet"


def test_ctrl_c_at_any_moment_of_fleets_start_up_is_one_line_and_130(tmp_path):
    from fleetops.init import make_project

    make_project(tmp_path)
    argv = [str(FLEET), "-H", "lab01", "ping"]
    ours = 0
    # Up to three sweeps, each over a run measured just before it: the machine's load changes how
    # much of a run is Python's own start-up, where a signal tests nothing of fleet's.
    for _ in range(3):
        if ours >= 4:
            break
        for delay in sweep_over(run_span(argv, tmp_path), 12):
            ours += _one_moment(argv, tmp_path, delay)
    assert ours >= 4, "too few SIGINTs landed while fleet ran: the sweep tested nothing"


def _one_moment(argv: list[str], cwd, delay: float) -> int:
    """1 when the SIGINT landed while fleet ran (and was answered as it must be), 0 when it came
    before or after the program."""
    moment = sigint_at(argv, cwd, delay)
    if moment.before_the_program:  # the interpreter's own site start-up: see interrupts.py
        return 0
    assert "Traceback" not in moment.stderr, moment.describe()
    if moment.finished_first or (moment.code == 2 and "unknown host 'lab01'" in moment.stderr):
        # ended on its own, or the signal came while it exited with its answer already written
        assert moment.code == 2, moment.describe()
        return 0
    assert moment.code == 130, moment.describe()
    assert (
        moment.stderr.strip().splitlines()[-1]
        == "interrupted (Ctrl-C) while starting: no task ran on any host"
    ), moment.describe()
    return 1
