"""Every failed or refused result says its cause and ends with a `next:` that is right for it, on
real sshd lab nodes: a failed verify, a drifted `patch --check` (pointing at the line that was
edited), a refused `extract` (never `--force`: the runbooks forbid it), a job the OOM killer took
(`status` names it with the kernel's line, `diagnose` knows an earlier job of the node as the node's
own), Ctrl-C in `tail` (an interrupt, not a lost link)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import GENERATOR, REPO, fab_json, run_fab
from polling import wait_for

from fleetops.lab import Lab

JOBS = "tests/playbooks/jobs.yaml"
pytestmark = pytest.mark.lab


def block(stdout: str, head: str) -> list[str]:
    """The lines of the result that starts with `head`: that line and the indented ones under it."""
    lines = stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(head))
    out = [lines[start]]
    for ln in lines[start + 1 :]:
        if not ln.startswith(" "):
            break
        out.append(ln)
    return out


def next_commands(lines: list[str]) -> list[str]:
    """The commands of the block's `next:`: the lines after it holding a command and nothing
    else."""
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith("next:"))
    return [ln.strip() for ln in lines[at + 1 :] if ln.strip().startswith("fab ")]


def ends_with_next(lines: list[str]) -> list[str]:
    """The block's last part is its `next:` (a why, then the commands): returns the commands."""
    commands = next_commands(lines)
    assert commands, lines
    assert lines[-1].strip() == commands[-1], lines
    return commands


def test_a_failed_verify_says_first_what_to_run_next(lab: Lab):
    proc = run_fab(lab.root, "-H", "lab01", "verify", "--kinds", "grep")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = block(proc.stdout, "lab01 | verify | failed")
    # right under the result's line, above the failed checks
    assert lines[1].strip().startswith("next:"), lines
    commands = next_commands(lines)
    assert commands == ["fab -H lab01 patch --check", "fab -H lab01 patch verify"], proc.stdout
    assert [ln.strip() for ln in lines[2:4]] == commands, lines
    again = run_fab(lab.root, *commands[0].split()[1:])
    # the command runs as printed
    assert again.returncode == 0 and "would apply" in again.stdout, again.stdout


def test_a_drifted_patch_check_points_at_the_edited_line_and_says_what_next(lab: Lab):
    run_fab(lab.root, "-H", "lab01", "patch", check=True)
    target = lab.node("lab01").module_file(GENERATOR)
    lines = target.read_text().splitlines(keepends=True)
    assert lines[171].strip() == "enable_prefix_caching=False,"  # line 172
    lines[171] = lines[171].replace("False", "True")
    target.write_text("".join(lines))
    proc = run_fab(lab.root, "-H", "lab01", "patch", "--check")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    mine = block(proc.stdout, "lab01 | patch | failed")
    text = "\n".join(mine)
    assert "line 172: expected '            enable_prefix_caching=False,'" in text, text
    assert "line 169" not in text, text
    commands = ends_with_next(mine)
    assert "fab history --host lab01" in commands and "fab -H lab01 rollback --force" in commands, (
        commands
    )
    assert commands[-1] == "fab -H lab01 patch verify", commands
    history = run_fab(lab.root, "history", "--host", "lab01")
    assert history.returncode == 0, history.stdout + history.stderr


def test_a_refused_extract_says_what_to_do_instead_of_force(lab: Lab):
    proc = run_fab(lab.root, "-H", "lab01", "extract")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    mine = block(proc.stdout, "lab01 | extract | failed")
    assert "--force" not in proc.stdout + proc.stderr, proc.stdout
    commands = ends_with_next(mine)
    assert commands == ["fab -H lab01 patch verify", "fab -H lab01 extract"], mine


def start_spawner(lab: Lab, host: str = "lab01") -> tuple[str, int]:
    rc, doc = fab_json(lab.root, "-H", host, "extract", "--job", "spawner", "--playbook", JOBS)
    assert rc == 0, doc
    job_id = doc["results"][0]["data"]["job"]["id"]

    def running() -> int | None:
        _, st = fab_json(lab.root, "-H", host, "status", "--job-id", job_id, "--playbook", JOBS)
        data = st["results"][0]["data"]
        return data.get("job", {}).get("pid") if data.get("state") == "running" else None

    return job_id, wait_for(running, "the spawner job running with its pid", timeout=120, every=0.5)


def oom_kill(lab: Lab, host: str, job_id: str) -> None:
    run_fab(lab.root, "lab.kernel", "--node", host, "--clear", "--readable", "dmesg", check=True)
    run_fab(lab.root, "lab.kernel", "--node", host, "--oom", check=True)

    def ended() -> bool:
        _, st = fab_json(lab.root, "-H", host, "status", "--job-id", job_id, "--playbook", JOBS)
        return st["results"][0]["data"].get("state") == "killed"

    wait_for(ended, "the job's wrapper recording the SIGKILL", timeout=120, every=0.5)


def test_status_after_an_oom_kill_names_the_oom_killer_with_the_kernels_line(lab: Lab):
    job_id, pid = start_spawner(lab)
    try:
        oom_kill(lab, "lab01", job_id)
        proc = run_fab(lab.root, "-H", "lab01", "status", "--job-id", job_id, "--playbook", JOBS)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        mine = block(proc.stdout, "lab01 | status | failed")
        text = "\n".join(mine)
        assert "killed by the kernel's OOM killer" in mine[0], text
        assert f"Killed process {pid} (python)" in text, text  # the kernel's own line, as evidence
        assert "killed by signal 9," not in mine[0], text
        commands = ends_with_next(mine)
        assert commands[0] == f"fab -H lab01 logs --job-id {job_id}", commands
        rc, doc = fab_json(
            lab.root, "-H", "lab01", "status", "--job-id", job_id, "--playbook", JOBS
        )
        cause = doc["results"][0]["data"]["oom"]
        assert cause["pid"] == pid and cause["lines"], cause
    finally:
        run_fab(lab.root, "-H", "lab01", "stop", "--job-id", job_id)


def test_diagnose_knows_an_oom_kill_of_an_earlier_job_as_this_nodes_own(lab: Lab):
    first, _pid = start_spawner(lab)
    oom_kill(lab, "lab01", first)
    run_fab(lab.root, "-H", "lab01", "stop", "--job-id", first)  # what it left behind
    second, _ = start_spawner(lab)
    try:
        rc, doc = fab_json(lab.root, "-H", "lab01", "diagnose", "--playbook", JOBS)
        found = doc["results"][0]["data"]["findings"]
        [oom] = [f for f in found if f["area"] == "oom"]
        assert first in oom["msg"] and "not this node's fleetops job" not in oom["msg"], oom
        assert "earlier" in oom["msg"], oom
        assert oom["next"][0] == f"fab -H lab01 logs --job-id {first}", oom
    finally:
        run_fab(lab.root, "-H", "lab01", "stop", "--job-id", second)


def test_ctrl_c_in_tail_is_reported_as_an_interrupt_not_a_lost_connection(lab: Lab):
    job_id, _ = start_spawner(lab)
    try:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "COLUMNS": "200",
            "FLEETOPS_INTERRUPT_GRACE_S": "0",
        }
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fabric",
                "-H",
                "lab01",
                "tail",
                "--job-id",
                job_id,
                "--playbook",
                JOBS,
            ],
            cwd=lab.root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        seen = []
        deadline = time.monotonic() + 120
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            seen.append(line)
            if "spawned" in line:
                break
        time.sleep(0.5)  # in the middle of a poll that waits for more lines
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
        out = "".join(seen) + rest
        assert proc.returncode == 130, out
        assert "connection lost" not in out and "reconnecting" not in out, out
        assert f"detached: job {job_id} is still running" in out, out
        assert f"fab -H lab01 tail --job-id {job_id}" in [ln.strip() for ln in out.splitlines()], (
            out
        )
    finally:
        run_fab(lab.root, "-H", "lab01", "stop", "--job-id", job_id)
