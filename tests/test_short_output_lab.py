"""Short by default, on real sshd lab nodes: a host whose checks all pass is one line, a failing
host shows its failures and what to run next (-v/--verbose shows the rest), two hosts that answered
alike print once, and `gpu --wait` says what it waits for once, not once a second."""

from __future__ import annotations

import re

import pytest
from conftest import run_fab

from fleetops.lab import Lab

pytestmark = pytest.mark.lab


def lines(stdout: str) -> list[str]:
    return [ln for ln in stdout.splitlines() if ln.strip()]


def test_a_healthy_host_is_one_line_and_two_alike_print_once(lab: Lab):
    run_fab(lab.root, "-H", "lab01,lab02", "patch", check=True)
    one = run_fab(lab.root, "-H", "lab01", "verify", env={"COLUMNS": "80"})
    assert one.returncode == 0, one.stdout + one.stderr
    shown = lines(one.stdout)
    assert shown[0] == "lab01 | verify | ok | 18/18 checks passed", one.stdout
    assert len(shown) <= 5 and "proves:" not in one.stdout, one.stdout
    both = run_fab(
        lab.root, "-H", "lab01,lab02", "verify", "--kinds", "grep,compile", env={"COLUMNS": "80"}
    )
    assert both.returncode == 0, both.stdout + both.stderr
    results = [ln for ln in lines(both.stdout) if " | verify | " in ln]
    assert results == ["lab[01-02] (2) | verify | ok | 14/14 checks passed"], both.stdout


def test_a_failing_host_shows_its_failures_and_verbose_shows_the_rest(lab: Lab):
    short = run_fab(lab.root, "-H", "lab01", "verify", "--kinds", "requires,grep")
    assert short.returncode == 1, short.stdout + short.stderr
    assert "    failed  prefix-caching-off [grep]" in short.stdout, short.stdout
    assert "requires [requires]" not in short.stdout and "no-block-hasher" not in short.stdout, (
        short.stdout
    )
    assert "    2 passed, not shown: -v shows them" in short.stdout, short.stdout
    # the agent answered fine: its command line is noise
    assert "<fleetops bootstrap>" not in short.stdout
    for flag in ("-v", "--verbose"):
        loud = run_fab(lab.root, "-H", "lab01", "verify", "--kinds", "requires,grep", flag)
        assert loud.returncode == 1, loud.stdout + loud.stderr
        assert "    ok      requires [requires]: all requirements met" in loud.stdout, loud.stdout
        assert (
            "    ok      no-block-hasher [grep]" in loud.stdout and "not shown" not in loud.stdout
        ), loud.stdout
        assert "<fleetops bootstrap>" in loud.stdout, loud.stdout


def test_gpu_wait_piped_says_what_it_waits_for_once_not_once_a_second(lab: Lab):
    node = lab.node("lab01")
    lab.set_gpu_state(node, "busy")
    try:
        proc = run_fab(
            lab.root, "-H", "lab01", "gpu", "--wait", "5", env={"COLUMNS": "200"}, timeout=300
        )
        assert proc.returncode == 10, proc.stdout + proc.stderr
        waiting = re.findall(r"^lab01 \| gpu \| waiting.*$", proc.stdout, re.M)
        assert len(waiting) == 1, proc.stdout  # five polls, one state: one line
        assert re.fullmatch(
            r"lab01 \| gpu \| waiting up to [45]s: 0/2 selected GPUs free; 2 busy", waiting[0]
        ), waiting
        assert "lab01 | gpu | failed | WARN: still busy after waiting 5s" in proc.stdout, (
            proc.stdout
        )
    finally:
        lab.set_gpu_state(node, "idle")
