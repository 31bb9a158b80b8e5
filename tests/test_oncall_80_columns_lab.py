"""On call at 80 columns, in a real terminal (tmux, 80x40) on real sshd lab nodes: `jobs`, `status`,
`diagnose` and `verify` read off the screen, and every job id and next command they print copied
back into the shell, exactly as printed: each runs. lab01 ran a job the OOM killer took; lab02 is
not patched."""

from __future__ import annotations

import json
import re
import shlex
import time

import pytest
import terminal
from conftest import run_fab
from test_oncall_causes_lab import JOBS, oom_kill, start_spawner

from fleetops.lab import Lab

pytestmark = pytest.mark.lab
JOB_ID = re.compile(r"\b[a-z][a-z0-9_]*-\d{8}T\d{6}-[0-9a-f]{4}\b")
# never typed by a test, whatever a screen says
HARMFUL = ("reboot", "--gpu-reset", "rollback --force")


def commands_on(screen: str) -> list[str]:
    """Every line of the screen that holds a command and nothing else, in order, once each."""
    out: list[str] = []
    for line in screen.splitlines():
        text = line.strip()
        if text.startswith("fab ") and text not in out:
            out.append(text)
    return out


def runs_as_printed(term: terminal.Terminal, command: str, timeout: float = 300) -> tuple[int, str]:
    assert not any(word in command for word in HARMFUL), command
    words = shlex.split(command)  # a shell can read it: quotes closed, nothing cut
    assert words[:2] == ["fab", "-H"] or words[:2] == ["fab", "history"], command
    rc, screen = term.run(command, timeout)
    assert rc not in (2, 127), f"`{command}` exited {rc}:\n{screen}"
    assert "Traceback" not in screen and "No idea what" not in screen, screen
    return rc, screen


def test_ids_and_next_commands_copied_off_an_80_column_screen_run_as_printed(
    lab: Lab, term: terminal.Terminal
):
    run_fab(lab.root, "-H", "lab01", "patch", check=True)
    job_id, _pid = start_spawner(lab)
    oom_kill(lab, "lab01", job_id)
    typed: list[str] = []

    # jobs: every id whole on the screen, and the next command with a real id
    rc, screen = term.run("fab -H lab01 jobs")
    assert rc == 0, screen
    assert job_id in JOB_ID.findall(screen), screen
    assert "…" not in screen and "{host}" not in screen, screen
    listed = commands_on(screen)
    assert f"fab -H lab01 status --job-id {job_id}" in listed, screen
    for command in listed:
        runs_as_printed(term, command)
        typed.append(command)

    # status: the OOM killer named, and what to run next
    rc, screen = term.run("fab -H lab01 status")
    assert rc == 1, screen
    assert "OOM killer" in screen and "…" not in screen, screen
    for command in commands_on(screen):
        runs_as_printed(term, command)
        typed.append(command)

    # verify on the unpatched node: its failures and what to run next, copied back
    rc, screen = term.run("fab -H lab02 verify --kinds grep")
    assert rc == 1, screen
    failing = commands_on(screen)
    assert "fab -H lab02 patch --check" in failing, screen

    # diagnose over both nodes: every next command whole, with its own host, never a placeholder
    rc, screen = term.run("fab -H @lab diagnose")
    assert rc == 22, screen
    assert "{host}" not in screen, screen
    found = commands_on(screen)
    assert f"fab -H lab01 logs --job-id {job_id}" in found, screen
    assert "fab -H lab02 patch verify" in found or "fab -H 'lab[02]' patch verify" in found, screen
    for command in [*failing, *found]:
        if command in typed:
            continue
        runs_as_printed(term, command)
        typed.append(command)

    # lab02 is patched and proven now (its next commands did that): a healthy host is one line
    rc, screen = term.run("fab -H lab02 verify")
    assert rc == 0, screen
    lines = [ln for ln in screen.splitlines() if ln.strip()]
    assert lines[0].startswith("lab02 | verify | ok | 18/18 checks passed"), screen
    assert len(lines) <= 5, screen
    assert len(typed) >= 5, typed


def cut_by_the_terminal(screen: str, width: int = 80) -> list[str]:
    """The lines the terminal wrapped (tmux joins them back): each must be a command alone on its
    line, which a copy gives back whole; prose, paths and ids are wrapped by fleetops between words,
    or fit."""
    return [
        line
        for line in screen.splitlines()
        if len(line) > width and not line.strip().startswith("fab ")
    ]


def test_only_commands_are_wrapped_by_the_terminal(lab: Lab, term: terminal.Terminal):
    node = lab.node("lab01")
    # a long verdict: each holder's pid, owner and command line (a path)
    lab.set_gpu_state(node, "busy")
    try:
        rc, screen = term.run("fab -H lab01 gpu")
        assert rc == 10, screen
        assert "still busy" in screen or "busy" in screen, screen
        assert cut_by_the_terminal(screen) == [], screen
        assert "fab -H lab01 gpu --wait 600" in commands_on(screen), screen
    finally:
        lab.set_gpu_state(node, "idle")
    # unpatched: failures, their evidence, next
    rc, screen = term.run("fab -H lab02 verify --kinds grep")
    assert rc == 1, screen
    assert cut_by_the_terminal(screen) == [], screen
    assert "fab -H lab02 patch --check" in commands_on(screen), screen


def test_a_failing_verify_fits_a_screen_with_what_to_run_next_first(
    lab: Lab, term: terminal.Terminal
):
    rc, screen = term.run("fab -H lab02 verify")  # lab02 is not patched: most checks fail
    assert rc == 1, screen
    lines = [line for line in screen.splitlines() if line.strip()]
    assert len(lines) <= 25, f"{len(lines)} lines:\n{screen}"
    first_failure = next(n for n, line in enumerate(lines) if line.lstrip().startswith("failed "))
    assert (
        lines.index(next(line for line in lines if line.lstrip().startswith("next:")))
        < first_failure
    ), screen
    assert "fab -H lab02 patch --check" in commands_on(screen), screen
    # what is not shown is counted
    assert re.search(r"\d+ more failed checks?, \d+ passed, not shown: -v shows them", screen), (
        screen
    )
    rc, everything = term.run("fab -H lab02 verify -v")
    assert rc == 1 and len(everything.splitlines()) > len(screen.splitlines()), everything


def test_next_commands_name_the_program_the_operator_ran(lab: Lab, term: terminal.Terminal):
    rc, screen = term.run("fleet -H lab02 verify --kinds grep")
    assert rc == 1, screen
    said = [
        line.strip() for line in screen.splitlines() if line.strip().startswith(("fab ", "fleet "))
    ]
    assert "fleet -H lab02 patch --check" in said, screen
    assert not [line for line in said if line.startswith("fab ")], screen
    assert not re.search(r"\bfab -H\b", screen), screen  # nor inside a line of prose


def test_rollback_force_shows_the_changes_it_says_it_discards(lab: Lab):
    run_fab(lab.root, "-H", "lab01", "patch", check=True)
    target = lab.node("lab01").module_file("speculators.data_generation.custom_worker")
    target.write_text(
        target.read_text().replace(
            "hidden_states = self.embed_input_ids(input_ids)",
            "hidden_states = self.embed_input_ids(input_ids)  # a local edit",
        )
    )
    proc = run_fab(lab.root, "-H", "lab01", "rollback", "--force")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the diff shows them" not in proc.stdout or re.search(
        r"^\s*-.*# a local edit$", proc.stdout, re.M
    ), proc.stdout  # said, then shown: the discarded edit is a removed line of the diff printed


def test_counts_in_words_are_plural_only_when_more_than_one(lab: Lab):
    proc = run_fab(lab.root, "-H", "lab02", "patch", "-v", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = json.dumps(json.loads(proc.stdout))
    assert re.search(r"applied (\d+ hunks?|[a-z])", said), said
    assert not re.search(r"\b1 hunks\b", said), said


def test_ctrl_c_leaves_no_live_table_behind(lab: Lab, term: terminal.Terminal):
    """Ctrl-C in a `tail` on two hosts: the live table goes, the interrupt is said, nothing is glued
    to it."""
    jobs = [start_spawner(lab, host)[0] for host in ("lab01", "lab02")]
    try:
        term.clear()
        term.type(
            f"fab -H lab01,lab02 tail --playbook {JOBS} --job spawner; echo {terminal.RC_MARK}$?"
        )
        term.keys("Enter")
        shown = ""
        for _ in range(300):
            shown = term.visible()
            if "current task" in shown:
                break
            time.sleep(0.2)
        assert "current task" in shown, shown  # the live view is up
        term.keys("C-c")
        rc, screen = term.wait_rc(120)
        assert rc == 130, screen
        # the live view is gone, whole
        assert "current task" not in screen and "┃ job" not in screen, screen
        assert "Ctrl-C: starting nothing new" in screen, screen
        for job_id in jobs:
            assert f"detached: job {job_id} is still running" in screen, screen
    finally:
        for host, job_id in zip(("lab01", "lab02"), jobs):
            run_fab(lab.root, "-H", host, "stop", "--job-id", job_id)


def test_gpu_wait_on_a_terminal_is_one_live_line(lab: Lab, term: terminal.Terminal):
    node = lab.node("lab01")
    lab.set_gpu_state(node, "busy")
    try:
        term.clear()
        term.type(f"fab -H lab01 gpu --wait 6; echo {terminal.RC_MARK}$?")
        term.keys("Enter")
        seen: list[list[str]] = []
        doubled: list[str] = []  # each screen that showed more than one such row, whole
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            shown = term.visible().splitlines()
            # the view's row (`lab01 │ gpu waiting 5s more: …`) or a piped line (`lab01 | gpu |
            # waiting …`); the result's own line (`… still busy after waiting 6s`), printed above
            # the view just before it goes, is neither
            seen.append([ln for ln in shown if "gpu waiting" in ln or "| gpu | waiting" in ln])
            if len(seen[-1]) > 1:
                doubled.append("\n".join(shown))
            if any(ln.startswith(terminal.RC_MARK) for ln in shown):
                break
            time.sleep(0.3)
        rc, screen = term.wait_rc(120)
        assert rc == 10, screen
        assert any(len(lines) == 1 for lines in seen), seen  # the host's one live row said it
        assert not doubled, "\n----\n".join(doubled)  # never a line a second
        # neither a piped line nor a row of the view left behind
        assert "| gpu | waiting" not in screen and "gpu waiting" not in screen, screen
        assert "lab01 | gpu | failed | WARN: still busy after waiting 6s" in screen, screen
    finally:
        lab.set_gpu_state(node, "idle")
