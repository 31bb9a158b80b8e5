"""The lab's own commands at 80 columns, in a real terminal (tmux, 80x40): the command `lab.up`
suggests is whole on the screen, in the program the operator ran, and runs when typed back exactly
as printed."""

from __future__ import annotations

import pytest

from fleetops.lab import Lab

pytestmark = pytest.mark.lab


@pytest.mark.parametrize("program", ["fab", "fleet"])
def test_lab_up_suggests_its_next_command_whole_in_the_program_run(term, lab: Lab, program: str):
    rc, _ = term.run(f"{program} lab.up")
    assert rc == 0
    # as the terminal drew them: a command cut across two lines is not whole
    drawn = term.visible().splitlines()
    suggested = f"{program} -H lab01 patch verify"
    inventory = next(n for n, line in enumerate(drawn) if "inventory:" in line)
    said = " ".join(line.strip() for line in drawn[inventory:])
    path = str(lab.hosts_file)
    if len(path) < 80:
        assert path in said.split(), drawn  # the path, whole, as a word of its own
    # longer than the screen: it can break only at the edge, where it starts a line of its own
    else:
        assert any(
            line.strip() == path[: len(line.strip())]
            for line in drawn[inventory + 1 :]
            if line.strip()
        ) and path in "".join(line.strip() for line in drawn[inventory:]), drawn
    assert any(
        line.strip().endswith(suggested) and (line.strip() == suggested or len(line) < 80)
        for line in drawn[inventory:]
    ), drawn
    # as printed, less the change it makes
    rc, screen = term.run(suggested.replace("patch verify", "ping"))
    assert rc == 0, screen
