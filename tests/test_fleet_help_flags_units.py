"""Every flag `fleet --help` lists means the same before the task and after it, or is refused (exit
2): the command line is parsed by the real program (fleetops/cli.py's Fleet, in a project `fleet
init` made) and the run it would make is compared, as fleetops' executor reads it (its run options,
its steps and the core flags), for the flag given before the first task and after it. No connection
is made: nothing is executed.

A flag the list below does not know fails the test: a new flag says what value it takes here
first."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

FLEET = Path(sys.executable).parent / "fleet"
# A value each flag that takes one is given (the flags that take none are switches)
VALUES = {
    "forks": "3",
    "serial": "2",
    "port": "2222",
    "inventory": "hosts",
    "limit": "node01",
    "user": "bob",
    "playbook": "playbooks/speculators-0.3.0-vllm-0.16.yaml",
    "search-root": ".",
    "ssh-config": "ssh_config",
    "connect-timeout": "7",
    "command-timeout": "9",
    "hosts": "node01",
    "identity": "id_test",
    "config": "extra.yaml",
    "list-depth": "1",
    "list-format": "nested",
    "print-completion-script": "bash",
    "metrics": "fleetops.prom",
    "junit": "report.xml",
    "transport": "openssh",
    "help": None,
    "list": None,
}
# Flags that print something and end the program: the same exit, before or after the task
ENDS = {
    "help",
    "version",
    "list",
    "list-depth",
    "list-format",
    "complete",
    "print-completion-script",
    "list-agent-keys",
}


def help_text() -> str:
    env = {"PYTHONPATH": str(REPO), "COLUMNS": "200", "PATH": "/usr/bin:/bin"}
    text = subprocess.run(
        [str(FLEET), "--help"], capture_output=True, text=True, env=env, timeout=60
    ).stdout
    return text.split("Core options:", 1)[1].split("Subcommands:", 1)[0]


def help_flags() -> list[str]:
    """The long names in the first column of `fleet --help`'s core options."""
    columns = [m.group(1) for m in re.finditer(r"^  (-\S.*?)(?:\s{2,}|$)", help_text(), re.M)]
    return sorted(
        {name for column in columns for name in re.findall(r"--([a-z][a-z0-9-]*)", column)}
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    top = tmp_path_factory.mktemp("help-flags")
    made = subprocess.run(
        [str(FLEET), "init", "ops"],
        cwd=top,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert made.returncode == 0, made.stdout + made.stderr
    root = top / "ops"
    (root / "hosts" / "local.yaml").write_text(
        "hosts:\n  node01:\n    address: 127.0.0.1\n    port: 9\n"
    )
    (root / "ssh_config").write_text("Host nothing-here\n")
    (root / "extra.yaml").write_text("{}\n")
    (root / "id_test").write_text("")
    return root


def parsed(project: Path, argv: list[str]) -> Any:
    """What the run would be (run options, steps, core flags), or ("exit", code) where the parse
    ends it."""
    from fabric import Config
    from invoke import Call, Collection
    from invoke.exceptions import Exit

    from fleetops.cli import Fleet
    from fleetops.fab.decorators import RUN_OPTIONS, fleet_task_name
    from fleetops.fab.executor import FleetExecutor

    program = Fleet(
        name="fleetops",
        namespace=Collection(),
        executor_class=FleetExecutor,
        config_class=Config,
        binary="fleet",
        binary_names=["fleet"],
    )
    try:
        program.create_config()
        program.parse_core(["fleet", "-r", str(project), *argv])
        program.parse_collection()
        program.parse_tasks()
        program.parse_cleanup()
    except (Exit, SystemExit) as exc:
        return ("exit", getattr(exc, "code", None))
    executor = FleetExecutor(program.collection, program.config, program.core)
    calls = [c if isinstance(c, Call) else Call(task=c) for c in executor.normalize(program.tasks)]
    run_opts, steps = executor._steps([c for c in calls if fleet_task_name(c)])
    core = {
        name: arg.value
        for name, arg in program.core[0].args.items()
        if name.replace("-", "_") not in RUN_OPTIONS
        and name not in ("search-root", "json", "playbook")
    }
    return run_opts, steps, core


def words(flag: str) -> list[str]:
    value = VALUES.get(flag)
    return [f"--{flag}"] + ([value] if value else [])


def test_the_walk_knows_every_flag_fleet_help_lists():
    flags = help_flags()
    assert "ask-become-pass" in flags and "allow-insecure-venv" in flags and "hosts" in flags, flags
    text = help_text()
    takes = {f for f in flags if re.search(rf"--{f}=|--{f}\[=", text)}
    assert takes <= set(VALUES), sorted(takes - set(VALUES))


# -H and -r are in every parse below (the host and the project), before the task
WALKED = [flag for flag in help_flags() if flag not in ("hosts", "search-root")]


@pytest.mark.parametrize("flag", WALKED)
def test_each_flag_of_fleet_help_means_the_same_before_and_after_the_task(project, flag, capsys):
    before = parsed(project, [*words(flag), "-H", "node01", "ping"])
    after = parsed(project, ["-H", "node01", "ping", *words(flag)])
    capsys.readouterr()
    outcomes = []
    for result in (before, after):
        if result[0] == "exit":
            # a flag that prints and ends the program works by exiting 0; anything else must be a
            # usage error
            assert result[1] in ((0, None, 2) if flag in ENDS else (2,)), (flag, before, after)
            outcomes.append("refused" if result[1] == 2 else "ended")
        else:
            # listed as ending, yet ran the task
            assert flag not in ENDS or flag == "complete", (flag, result)
            outcomes.append("ran")
    if outcomes == ["ran", "ran"]:
        assert before == after, (before, after)
        assert before != parsed(project, ["-H", "node01", "ping"]), (
            f"--{flag} changed nothing the run reads"
        )
