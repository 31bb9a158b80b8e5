"""Every flag the programs list works as its help says or is refused, and every bad value is a usage
error, with `fleet` (fleetops' own program) and Fabric's `fab` in a project alike. No lab: the
project's one host is 127.0.0.1 on a port nobody listens on, so a flag or value that slipped through
would end in "connection refused" (exit 4) instead of the usage error (exit 2) asked for; no name is
ever looked up.

What needs a real node (that -i, -u, --port, -t and -T reach the connection; --json before the task
on a real answer; a closed stdout in the middle of a run) is in test_honest_flags_lab.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

BIN = Path(sys.executable).parent
FLEET, FAB = BIN / "fleet", BIN / "fab"
PROGRAMS = {"fleet": FLEET, "fab": FAB}


def run(
    program: Path,
    cwd: Path,
    *args: str,
    env: dict | None = None,
    stdin: str = "",
    stdout: int | None = None,
) -> subprocess.CompletedProcess:
    full_env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "COLUMNS": "200",
        "FLEETOPS_NO_LIVE": "1",
        **(env or {}),
    }
    for name in (
        "FLEETOPS_SERIAL",
        "FLEETOPS_FORKS",
        "FLEETOPS_LIMIT",
        "FLEETOPS_INVENTORY",
        "SSH_AUTH_SOCK",
    ):
        if name not in (env or {}):
            full_env.pop(name, None)
    return subprocess.run(
        [str(program), *args],
        cwd=cwd,
        input=stdin,
        text=True,
        env=full_env,
        timeout=120,
        stdout=subprocess.PIPE if stdout is None else stdout,
        stderr=subprocess.PIPE,
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A project made by `fleet init` (its example inventory: gpu01, refused as a target) plus
    node01: loopback, a closed port."""
    top = tmp_path_factory.mktemp("honest-flags")
    made = run(FLEET, top, "init", "ops")
    assert made.returncode == 0, made.stdout + made.stderr
    root = top / "ops"
    (root / "hosts" / "local.yaml").write_text(
        f"hosts:\n  node01:\n    address: 127.0.0.1\n    port: {closed_port()}\n    "
        f"connect_timeout: 2\n    known_hosts: {top / 'known_hosts'}\n    groups: [local]\n"
    )
    return root


def usage_error(proc: subprocess.CompletedProcess, *named: str) -> None:
    both = proc.stdout + proc.stderr
    assert proc.returncode == 2, f"rc={proc.returncode}\n{both}"
    for word in named:
        assert word in proc.stderr, (word, proc.stderr)
    assert "Traceback" not in both and "invalid literal" not in both, both
    # nothing ran: no failed host, no re-run line
    assert "re-run" not in both and "RECAP" not in proc.stdout, both


# ---------------------------------------------------------------- Fabric's core flags that fleetops
# does not use
REFUSED = [
    (["-w"], "--warn-only"),
    (["-e"], "--echo"),
    (["--hide", "both"], "--hide"),
    (["--prompt-for-sudo-password"], "--prompt-for-sudo-password"),
    (["--prompt-for-login-password"], "--prompt-for-login-password"),
]


@pytest.mark.parametrize("program", sorted(PROGRAMS))
@pytest.mark.parametrize("flag,name", REFUSED)
def test_a_fabric_flag_fleetops_does_not_use_is_refused_naming_it_and_why(
    project, program, flag, name
):
    proc = run(PROGRAMS[program], project, *flag, "-H", "node01", "ping", stdin="secret\n")
    usage_error(proc, name, "fleetops")


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_pty_is_refused_and_fleet_has_p_as_the_playbook(project, program):
    # fab's core -p is Fabric's --pty; fleet's is --playbook
    flag = "-p" if program == "fab" else "--pty"
    proc = run(PROGRAMS[program], project, flag, "-H", "node01", "ping")
    usage_error(proc, "--pty")
    if program == "fab":
        assert "-p PLAYBOOK after the task" in proc.stderr, proc.stderr


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_command_timeout_is_the_adhoc_commands_and_refused_elsewhere(project, program):
    proc = run(PROGRAMS[program], project, "-T", "5", "-H", "node01", "ping")
    usage_error(proc, "-T/--command-timeout", "run")


def test_fleet_help_lists_only_what_works_and_says_what_it_does_here(project):
    proc = run(FLEET, project, "--help")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for gone in (
        "--warn-only",
        "--echo",
        "--hide",
        "--pty",
        "--prompt-for-sudo-password",
        "--prompt-for-login-password",
        "Echo commands instead of running",
        "--fold ",
    ):
        assert gone not in text, gone
    flat = " ".join(text.split())
    for there in (
        "-R, --dry check mode",
        "-u STRING, --user=STRING",
        "--port=INT",
        "-p STRING, --playbook=STRING",
        "-j, --json",
        "--no-fold",
        "--odd",
        "--identity",
        "-t INT, --connect-timeout=INT",
        "-T INT, --command-timeout=INT",
    ):
        assert there in flat, (there, text)
    for word in ("--user", "--port", "--identity", "--connect-timeout"):
        line = flat.split(word, 1)[1][:400]
        assert "command line wins" in line, (word, line)


def test_one_meaning_per_flag_diff_files_odd_majority_no_fold_the_fold_flag(project):
    from fleetops.fab.tasks import ns

    for name in ns.task_names:
        if name.startswith("lab."):
            continue
        args = {a.name for a in ns[name].get_arguments()}
        # a file's diff, nowhere else
        assert ("diff" in args) == (name in ("patch", "rollback")), name
        assert "fold" not in args, name  # `--fold` did nothing (folding is the default)
        if getattr(ns[name].body, "fleetops_task", None):
            assert {"odd", "no_fold"} <= args, name
    for bad, instead in (("--diff", "--odd"), ("--fold", "--no-fold")):
        usage_error(run(FLEET, project, "-H", "node01", "ping", bad), bad, instead)
        # Fabric's own `fab` answers a word its parser does not know as Invoke does, before any task
        # runs.
        proc = run(FAB, project, "-H", "node01", "ping", bad)
        assert proc.returncode == 1 and f"No idea what '{bad}' is!" in proc.stderr, (
            proc.stdout + proc.stderr
        )


# ---------------------------------------------------------------- bad values: exit 2, naming the
# option
BAD_VALUES = [
    (["-H", "node01", "gpu", "--threshold", "lots"], {}, "--threshold"),
    (["-H", "node01", "tail", "--lines", "abc"], {}, "--lines"),
    (["-H", "node01", "logs", "--lines", "-3"], {}, "--lines"),
    (["-H", "node01", "stop", "--grace", "-1"], {}, "--grace"),
    (["-H", "node01", "run", "true", "--timeout", "0"], {}, "--timeout"),
    (["-H", "node01", "ping", "--forks", "0"], {}, "--forks"),
    (["-H", "node01", "ping", "--serial", "-1"], {}, "--serial"),
    (["-H", "node01", "ping", "--serial", "abc"], {}, "--serial"),
    (["-H", "node01", "ping", "--port", "70000"], {}, "--port"),
    (["-H", "node01", "ping", "--user", "a b"], {}, "--user"),
    (["-t", "0", "-H", "node01", "ping"], {}, "--connect-timeout"),
    (["-H", ",", "ping"], {}, "-H"),
    (["-H", "node01", "ping"], {"FLEETOPS_SERIAL": "abc"}, "FLEETOPS_SERIAL"),
    (["-H", "node01", "ping"], {"FLEETOPS_FORKS": "0"}, "FLEETOPS_FORKS"),
]


@pytest.mark.parametrize("program", sorted(PROGRAMS))
@pytest.mark.parametrize(
    "args,env,name", BAD_VALUES, ids=[" ".join(a) + str(e) for a, e, _ in BAD_VALUES]
)
def test_every_bad_value_exits_2_naming_the_option(project, program, args, env, name):
    usage_error(run(PROGRAMS[program], project, *args, env=env), name)


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_a_bad_transport_is_a_usage_error_of_one_line_naming_the_choices(project, program):
    proc = run(PROGRAMS[program], project, "-H", "node01", "ping", "--transport", "ssh")
    usage_error(proc, "--transport", "'ssh'", "openssh", "paramiko")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize(
    "args,name",
    [
        (["--forks", "0"], "--forks"),
        (["--serial", "-1"], "--serial"),
        (["--port", "0"], "--port"),
        (["-u", "a b"], "--user"),
        (["--serial", "x"], "--serial"),
    ],
)
def test_bad_core_flag_values_of_fleet_exit_2_naming_the_option(project, args, name):
    usage_error(run(FLEET, project, *args, "-H", "node01", "ping"), name)


def test_the_example_host_is_bad_input_naming_where_it_is_and_an_unknown_host_where_fleetops_looked(
    project,
):
    for program in (FLEET, FAB):
        proc = run(program, project, "-H", "gpu01", "patch", "verify", "extract")
        usage_error(proc, "gpu01", "example", str(project / "hosts" / "example.yaml"))
        proc = run(program, project, "-H", "gpu99", "ping")
        usage_error(proc, "unknown host 'gpu99'", str(project / "hosts"))


# ---------------------------------------------------------------- core flags before or after the
# task
@pytest.mark.parametrize(
    "args",
    [
        ["fleet", "--json", "-H", "node01", "ping"],
        ["fleet", "-j", "-H", "node01", "ping"],
        ["fleet", "-H", "node01", "ping", "--json"],
        ["fleet", "-H", "node01", "--json", "ping"],
        ["fab", "-H", "node01", "ping", "--json"],
        ["fleet", "--limit", "node01", "--json", "-H", "@local", "ping"],
        ["fab", "-H", "@local", "ping", "--limit", "node01", "--json"],
        ["fleet", "--odd", "--no-fold", "-j", "-H", "node01", "ping"],
        ["fab", "-H", "node01", "ping", "--odd", "--no-fold", "-j"],
    ],
)
def test_json_and_the_run_options_go_before_or_after_the_task(project, args):
    """Before or after it with `fleet` (its core flags); after it with Fabric's own `fab`, which
    parses the words before the task as Fabric's core flags."""
    proc = run(PROGRAMS[args[0]], project, *args[1:])
    # a JSON document for the unreachable node
    assert proc.returncode == 4, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert [(r["host"], r["task"], r["status"]) for r in doc["results"]] == [
        ("node01", "ping", "unreachable")
    ]


def test_a_core_playbook_no_task_reads_is_refused(project):
    proc = run(
        FLEET, project, "-p", "playbooks/speculators-0.3.0-vllm-0.16.yaml", "-H", "node01", "ping"
    )
    usage_error(proc, "-p/--playbook", "ping")


# ---------------------------------------------------------------- a closed stdout (`| head`)
@pytest.mark.parametrize(
    "args",
    [
        ["fab", "--list"],
        ["fleet", "--list"],
        ["fab", "-H", "node01", "ping"],
        ["fleet", "-H", "node01", "ping"],
        ["fleet", "--help"],
        ["fleet", "history"],
        ["fab", "runbooks"],
    ],
)
def test_a_closed_stdout_ends_the_program_quietly_with_141(project, args):
    read, write = os.pipe()
    os.close(read)  # the reader (`head`) is gone before the first write
    try:
        proc = run(PROGRAMS[args[0]], project, *args[1:], stdout=write)
    finally:
        os.close(write)
    # Fabric's own `fab` prints its task list before any fleetops code could catch the closed pipe:
    # it ends as `yes | head` ends, killed by SIGPIPE (the shell's $? is 141 all the same);
    # everything else exits 141.
    listing = args == ["fab", "--list"]
    assert proc.returncode in ((141, -signal.SIGPIPE) if listing else (141,)), proc.stderr
    assert proc.stderr == "", proc.stderr


UNHEARD = [
    (["--serial", "2", "history"], "--serial"),
    (["-u", "bob", "runbooks"], "--user"),
    (["--odd", "history"], "--odd"),
    (["-i", "/nonexistent", "history"], "--identity"),
    (["--json", "lab.status"], "--json"),
    (["--dry", "lab.down"], "--dry"),
    (["--dry", "init", "elsewhere"], "--dry"),
]


@pytest.mark.parametrize("args,name", UNHEARD)
def test_a_core_flag_no_task_of_the_command_acts_on_is_refused(project, args, name):
    usage_error(run(FLEET, project, *args), name)
    assert not (project / "elsewhere").exists()


def test_core_json_reaches_a_local_task(project):
    proc = run(FLEET, project, "--json", "history", "--last", "1")
    assert proc.returncode == 0, proc.stderr
    assert isinstance(json.loads(proc.stdout), list)
