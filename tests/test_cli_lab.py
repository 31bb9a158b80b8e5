"""The front end against real lab sshd nodes: ad-hoc commands through the inventory (`fleet -H x --
cmd`, `fab -H x run CMD`), Ctrl-C (first SIGINT: nothing new starts, running agent calls stop
cleanly on the node, exit 130), --dry, the short-flag scheme, usage errors exit 2, --diff, and the
run options with `fleet` and Fabric's `fab`.

A module of its own with a 3-node lab (a throwaway project), so SIGINTs and half-done patches never
touch the session's shared lab. The failpoint `pause` action holds the agents at known points; no
sleeps."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, fab_json, run_fab
from faultkit import (
    agents_of,
    file_sha,
    fresh_nodes,
    independent_forms,
    temp_files,
    wait_for,
)
from pausekit import NO_LIVE, fab_paused_at, running_fab

NODES = ("lab01", "lab02", "lab03")


@pytest.fixture(scope="module")
def lab3(lab_factory):
    return lab_factory.shared(3, __name__)


@pytest.fixture
def lab(lab3):
    return fresh_nodes(lab3)


def fleet(project: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The `fleet` entry point (fleetops.cli), as the operator types it."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "fleetops.cli", *args],
        cwd=project,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=600,
    )


def installed_fab(
    project: Path, *args: str, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Fabric's own `fab` script, as installed beside fleetops (which leaves it alone)."""
    script = Path(sys.executable).parent / "fab"
    assert "from fabric.main import program" in script.read_text(), (
        f"{script} is not Fabric's fab: run scripts/setup"
    )
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [str(script), *args], cwd=project, capture_output=True, text=True, env=full_env, timeout=600
    )


# How each program runs an ad-hoc command through the inventory: Fabric's `fab -H x -- cmd` (no
# task) loads no project at all, so with `fab` it is the `run` task.
PROGRAMS = {"fleet": (fleet, ["--", "uname", "-a"]), "fab": (installed_fab, ["run", "uname -a"])}


def history(project: Path, host: str) -> list[dict]:
    proc = run_fab(project, "history", "--host", host, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def lock_free(state_dir: Path) -> bool:
    """The node lock is free when we can take it ourselves (flock, as the agent does)."""
    path = state_dir / "lock"
    if not path.exists():
        return True
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


# ---------------------------------------------------------------- item 1: ad-hoc commands
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_fabric_adhoc_syntax_runs_through_the_inventory(lab, program):
    # The first quote: plain `fab -H lab01 -- uname -a` crashed with socket.gaierror
    # (Fabric's own fab loaded no fabfile and looked the inventory name up in DNS).
    call, command = PROGRAMS[program]
    proc = call(lab.root, "-H", "lab01,lab02", *command)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Both answered the same: one group, its lines prefixed with the range of hosts that printed
    # them.
    assert any(line.startswith("lab[01-02] (2) | Linux") for line in proc.stdout.splitlines()), (
        proc.stdout
    )
    assert "Traceback" not in proc.stderr
    entries = [e for e in history(lab.root, "lab01") if e.get("task") == "run"]
    assert entries and "uname -a" in entries[-1]["msg"], entries


def test_run_task_on_a_group_gives_json_per_host(lab):
    rc, doc = fab_json(
        lab.root, "-H", "@lab", "run", "nvidia-smi --query-gpu=memory.used --format=csv"
    )
    assert rc == 0, doc
    got = {r["host"]: r for r in doc["results"]}
    assert set(got) == set(NODES)
    for r in got.values():
        assert r["status"] == "ok" and r["data"]["exit_code"] == 0
        assert "memory.used" in r["data"]["stdout"], r["data"]


def test_run_failure_gives_exit_code_stderr_and_exit_status_1(lab):
    rc, doc = fab_json(lab.root, "-H", "lab01,lab02", "run", "echo to-out; echo to-err >&2; exit 3")
    assert rc == 1
    for r in doc["results"]:
        assert r["status"] == "failed"
        assert (r["data"]["exit_code"], r["data"]["stdout"], r["data"]["stderr"]) == (
            3,
            "to-out\n",
            "to-err\n",
        )
    human = run_fab(lab.root, "-H", "lab01", "run", "echo to-out; echo to-err >&2; exit 3")
    assert (
        human.returncode == 1
        and "lab01 | to-out" in human.stdout
        and "lab01 ! to-err" in human.stdout
    )


def test_run_masks_secrets(lab, tmp_path):
    token = "hf_cli_test_secret_93475"
    node = lab.node("lab01")
    extra = lab.root / "hosts" / "secret.yaml"
    extra.write_text(
        f"hosts:\n  sec01:\n    address: 127.0.0.1\n    port: {node.port}\n    user: {lab.user}\n"
        f"    identity_file: {lab.client_key}\n    known_hosts: {lab.known_hosts}\n"
        f"    python: {node.python}\n    state_dir: {node.state_dir}\n"
        f"    env:\n      HF_TOKEN: {{secret: {token}}}\n"
    )
    try:
        human = run_fab(lab.root, "-H", "sec01", "run", f"echo token={token}")
        rc, doc = fab_json(lab.root, "-H", "sec01", "run", f"echo token={token}")
        hist = run_fab(lab.root, "history", "--host", "sec01", "--json")
    finally:
        extra.unlink()
    assert human.returncode == 0 and "token=[secret]" in human.stdout
    assert rc == 0 and doc["results"][0]["data"]["stdout"] == "token=[secret]\n"
    for text in (human.stdout, human.stderr, json.dumps(doc), hist.stdout):
        assert token not in text


def test_adhoc_to_a_host_whose_key_is_unknown_is_refused(lab, tmp_path):
    node = lab.node("lab01")
    marker = tmp_path / "must-not-exist"
    # not in the inventory: only ~/.ssh/known_hosts may vouch
    target = f"{lab.user}@127.0.0.1:{node.port}"
    via_run = run_fab(lab.root, "-H", target, "run", f"touch {marker}")
    via_fleet = fleet(lab.root, "-H", target, "-i", str(lab.client_key), "--", "touch", str(marker))
    via_fab = installed_fab(
        lab.root, "-H", target, "-i", str(lab.client_key), "run", f"touch {marker}"
    )
    for proc in (via_run, via_fleet, via_fab):
        assert proc.returncode == 4, proc.stdout + proc.stderr
        assert "host key" in proc.stdout and "Traceback" not in proc.stderr
    assert not marker.exists()  # the command never ran


def test_adhoc_honours_the_example_guard_and_inventory_flag(lab, tmp_path):
    node = lab.node("lab01")
    marker = tmp_path / "must-not-exist"
    inv = tmp_path / "example.yaml"
    inv.write_text(
        f"example: true\nhosts:\n  ex01:\n    address: 127.0.0.1\n    port: {node.port}\n    "
        f"user: {lab.user}\n    identity_file: {lab.client_key}\n    known_hosts: "
        f"{lab.known_hosts}\n    python: {node.python}\n    state_dir: {node.state_dir}\n"
    )
    proc = run_fab(lab.root, "-H", "ex01", "run", f"touch {marker}", "--inventory", str(inv))
    assert proc.returncode == 2 and "ex01 is an example host" in proc.stderr, (
        proc.stdout + proc.stderr
    )
    assert not marker.exists()
    env_proc = run_fab(lab.root, "-H", "ex01", "ping", env={"FLEETOPS_INVENTORY": str(inv)})
    assert env_proc.returncode == 2 and "example host" in env_proc.stderr
    missing = run_fab(lab.root, "-H", "lab01", "ping", "--inventory", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


# ---------------------------------------------------------------- item 3: --dry, Ctrl-C
def test_dry_rollback_changes_nothing(lab):
    forms = independent_forms(lab.node("lab01"))
    rc, _ = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0
    rc, doc = fab_json(lab.root, "--dry", "-H", "lab01", "rollback")
    assert rc == 0 and all(r["data"]["check_mode"] for r in doc["results"]), doc
    for module, form in forms.items():
        assert file_sha(lab.node("lab01"), module) == form["patched"], module


@pytest.mark.parametrize("task", [["run", "true"], ["stop"], ["extract"]])
def test_dry_is_refused_where_a_task_has_no_check_mode(lab, task):
    proc = run_fab(lab.root, "--dry", "-H", "lab01", *task, env={"COLUMNS": "80"})
    assert proc.returncode == 2 and "no check mode" in proc.stderr, proc.stdout + proc.stderr
    # One line (not wrapped at 80 columns), naming the task's help once.
    assert proc.stderr.count("\n") == 1 and proc.stderr.count(f"fab --help {task[0]}") == 1, (
        proc.stderr
    )


# Where the agents are held when the SIGINT comes: before any write, after a backup, mid-write of a
# target (temp file written, not yet renamed), and after the first target is renamed in.
MOMENTS = [
    ("lock.acquired", 0),
    ("patch.after_backup", 0),
    ("patch.target.before_rename", 0),
    ("patch.target.after_rename", 0),
]


@pytest.mark.parametrize("point,skip", MOMENTS)
def test_ctrl_c_during_patch_on_three_nodes(lab, point, skip):
    nodes = lab.nodes()
    forms = independent_forms(nodes[0])
    with fab_paused_at(
        lab.root, nodes, point, ["-H", "@lab", "patch"], seconds=120, skip=skip, env=NO_LIVE
    ) as proc:
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert time.monotonic() - started < 30
    assert "interrupted" in out + err and "Traceback" not in err
    for node in nodes:  # the agents stop on their own (the client closed the link), lock released
        wait_for(lambda node=node: lock_free(node.state_dir), f"{node.name}'s lock to be released")
        wait_for(lambda node=node: not temp_files(node), f"{node.name}'s temp files to be gone")
        for module, form in forms.items():
            assert file_sha(node, module) in (form["pristine"], form["patched"]), (
                node.name,
                module,
            )
    rc, doc = fab_json(lab.root, "-H", "@lab", "patch")  # and the next run simply finishes the job
    assert rc == 0, doc
    assert not any("took over" in json.dumps(r) for r in doc["results"])


def test_ctrl_c_interrupts_a_running_command_and_kills_it_on_the_node(lab, tmp_path):
    token = "97.5312"  # a sleep nobody else runs: found in /proc by its exact argument

    def sleepers() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if (
                    entry.name.isdigit()
                    and (entry / "cmdline").read_bytes() == f"sleep\0{token}\0".encode()
                ):
                    found.append(int(entry.name))
            except OSError:
                pass
        return found

    with running_fab(lab.root, "-H", "@lab", "run", f"sleep {token}", env=NO_LIVE) as proc:
        wait_for(
            lambda: len(sleepers()) == 3 or proc.poll() is not None, "the command to run on 3 nodes"
        )
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    wait_for(lambda: not sleepers(), "the interrupted command to be killed on the nodes")


def test_a_second_ctrl_c_exits_at_once(lab):
    """The first SIGINT waits FLEETOPS_INTERRUPT_GRACE_S (here 300 s) for polling tasks before it
    closes the links; the second must not wait for that: it exits 130 at once."""
    nodes = lab.nodes()
    with fab_paused_at(
        lab.root,
        nodes,
        "lock.acquired",
        ["-H", "@lab", "patch"],
        seconds=120,
        env={**NO_LIVE, "FLEETOPS_INTERRUPT_GRACE_S": "300"},
        what="every node's agent to pause with the lock held",
    ) as proc:
        proc.send_signal(signal.SIGINT)
        first = ""
        while "starting nothing new" not in first:  # the first one is handled: now the second
            line = proc.stderr.readline()
            assert line, "fab ended before it said it was interrupted"
            first += line
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "second Ctrl-C" in err, out + err
    assert time.monotonic() - started < 30
    for node in nodes:  # the client vanished: each agent still unwinds and frees its lock
        wait_for(lambda node=node: lock_free(node.state_dir), f"{node.name}'s lock to be released")
        assert not (node.state_dir / "lock.json").exists()


def test_ctrl_c_during_verify_then_ping_exits_130_and_starts_nothing_new(lab):
    """The issue's run: `verify ping` and one SIGINT said `skipped: interrupted` and exited 0."""
    node = lab.node("lab01")
    # An agent still unwinding from an earlier test would pass for verify's and the SIGINT would
    # come too soon.
    wait_for(lambda: not agents_of(node), "earlier tests' agents on lab01 to stop", timeout=150)
    with running_fab(lab.root, "-H", "lab01", "verify", "ping", "--json", env=NO_LIVE) as proc:
        wait_for(
            lambda: agents_of(node) or proc.poll() is not None, "verify's agent to run on lab01"
        )
        assert proc.poll() is None, proc.communicate()
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert time.monotonic() - started < 30  # not the whole verify: the running call was interrupted
    doc = json.loads(out)
    assert doc["exit_status"] == 130
    got = {r["task"]: r for r in doc["results"]}
    assert got["verify"]["data"]["error_kind"] == "interrupted"
    assert got["ping"]["status"] == "skipped" and "not started" in got["ping"]["msg"]
    # loaded CI box
    wait_for(lambda: not agents_of(node), "verify's agent to stop on the node", timeout=180)


# ---------------------------------------------------------------- item 4: flags and exit statuses
def test_usage_errors_exit_2_with_a_hint(lab):
    proc = run_fab(lab.root, "-H", "lab01", "ping", "--serial", "abc")
    hint = "--serial 'abc' is not a whole number; see `fab --help ping`"
    assert proc.returncode == 2 and hint in proc.stderr and "Traceback" not in proc.stderr, (
        proc.stderr
    )


def test_fleet_usage_errors_exit_2(lab):
    assert fleet(lab.root, "--chek", "-H", "lab01", "ping").returncode == 2
    assert fleet(lab.root, "-H", "lab01", "ping", "--chek").returncode == 2
    assert fleet(lab.root, "--serial", "x", "-H", "lab01", "ping").returncode == 2
    assert fleet(lab.root, "-H", "lab01", "pach").returncode == 2
    proc = fleet(lab.root, "-H", "lab01", "run")  # its command missing: Invoke's parser tells
    assert proc.returncode == 2 and "fleet --help run" in proc.stderr, proc.stderr
    # Fabric's own `fab` answers what its parser cannot read as Invoke does: exit 1, before anything
    # runs
    for args, said in (
        (["-H", "lab01", "ping", "--chek"], "No idea what '--chek' is!"),
        (["-H", "lab01", "pach"], "No idea what 'pach' is!"),
        (["-H", "lab01", "run"], "'run' did not receive required positional arguments"),
    ):
        proc = installed_fab(lab.root, *args)
        assert proc.returncode == 1 and said in proc.stderr and "Traceback" not in proc.stderr, proc


def test_run_options_before_the_task_with_fleet_after_it_with_fab(lab):
    # Where Fabric users put core flags: `fleet` takes the run options there; Fabric's `fab` after a
    # task.
    for proc in (
        fleet(lab.root, "--serial", "1", "--forks", "2", "-H", "@lab", "ping"),
        installed_fab(lab.root, "-H", "@lab", "ping", "--serial", "1", "--forks", "2"),
    ):
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "batch 1/3" in proc.stdout and "batch 3/3" in proc.stdout
    proc = fleet(lab.root, "--limit", "lab0*,!lab02", "-H", "@lab", "ping", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(r["host"] for r in json.loads(proc.stdout)["results"]) == ["lab01", "lab03"]
    # The fold options are core flags too: FLEETOPS_FOLD=1 would fold these 3 hosts; --no-fold wins.
    proc = fleet(
        lab.root, "--no-fold", "--odd", "-H", "lab[01-03]", "ping", env={"FLEETOPS_FOLD": "1"}
    )
    assert proc.returncode == 0 and "lab[01-03] (3)" not in proc.stdout, proc.stdout + proc.stderr
    assert all(f"{n} | ping | ok" in proc.stdout for n in NODES), proc.stdout
    folded = installed_fab(lab.root, "-H", "lab[01-03]", "ping", env={"FLEETOPS_FOLD": "1"})
    assert folded.returncode == 0 and "lab[01-03] (3) | ping | ok" in folded.stdout, folded.stdout


def test_short_flags_mean_the_same_on_every_task(lab):
    for task in ("ping", "status", "logs"):  # -j was --job-id on status/logs: now --json everywhere
        proc = run_fab(lab.root, "-H", "lab01", task, "-j")
        assert json.loads(proc.stdout)["results"][0]["task"] == task, proc.stdout + proc.stderr
    assert json.loads(run_fab(lab.root, "history", "-j", "--last", "1").stdout) is not None
    assert run_fab(lab.root, "history", "-h").returncode == 0  # -h is help, never --host


def test_patch_diff_shows_the_diff_when_applying(lab):
    plain = run_fab(lab.root, "-H", "lab02", "patch")
    # without --diff: no diff when applying
    assert plain.returncode == 0 and "@@ -" not in plain.stdout
    proc = run_fab(lab.root, "-H", "lab01", "patch", "--diff")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "@@ -" in proc.stdout and "| patch | changed" in proc.stdout, proc.stdout
    rc, doc = fab_json(lab.root, "-H", "lab01", "rollback", "--diff")
    assert rc == 0 and doc["results"][0]["status"] == "changed"


def test_serial_forks_limit_with_plain_fab(lab):
    proc = run_fab(lab.root, "-H", "@lab", "ping", "--serial", "1", "--forks", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "batch 1/3" in proc.stdout and "batch 3/3" in proc.stdout
    rc, doc = fab_json(lab.root, "-H", "@lab", "ping", "--limit", "lab0*,!lab02")
    assert rc == 0 and sorted(r["host"] for r in doc["results"]) == ["lab01", "lab03"]
