"""Ctrl-C while `fleet` starts (imports, parsing, reading the project, planning): one line, exit 130, never a
traceback, whatever the moment. No node: the command's only host is the example inventory's, refused (exit 2)
once planned, so every moment of the sweep falls in start-up or after the program ended."""

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
    for delay in sweep_over(run_span(argv, tmp_path), 12):
        moment = sigint_at(argv, tmp_path, delay)
        if moment.finished_first:
            assert moment.code == 2 and "Traceback" not in moment.stderr, moment.describe()
            continue
        if moment.before_the_program:  # the interpreter's own site start-up: see interrupts.py
            continue
        assert "Traceback" not in moment.stderr, moment.describe()
        assert moment.code == 130, moment.describe()
        assert moment.stderr.strip().splitlines()[-1] == \
            "interrupted (Ctrl-C) while starting: no host was contacted, nothing ran", moment.describe()
        ours += 1
    assert ours >= 4, "too few SIGINTs landed while fleet ran: the sweep tested nothing"
