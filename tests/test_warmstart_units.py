"""Which command lines have their agents started before the program's start-up (wire/warmstart.py),
and which never do: only `-H HOSTS` with host tasks and options that change nothing about which
hosts are reached, how, or as whom. Anything else (a user, a port, a key, --limit, --inventory, the
ad-hoc command, a local task, a Fabric config beyond the project's) leaves every start to the run:
an agent started for the wrong login or an excluded host is never made. The lists it reads the
command line by are held to the program's own task table here."""

from __future__ import annotations

import dataclasses
import os

import pytest

from fleetops.fab.tasks import ns
from fleetops.plans.host import Host
from fleetops.wire import parked, warmstart


@pytest.mark.parametrize(
    "argv, hosts",
    [
        (["-H", "lab01", "ping"], "lab01"),
        (["-H", "lab01", "patch", "verify", "--kinds", "grep,compile"], "lab01"),
        (["-H", "lab01", "patch", "verify", "--kinds=grep"], "lab01"),
        (["--hosts=lab01,lab02", "ping", "--json"], "lab01,lab02"),
        (["--hosts", "@lab", "verify", "-j", "--no-fold", "--odd", "--verbose"], "@lab"),
        (["-H", "lab[01-04]", "patch", "--check", "--diff"], "lab[01-04]"),
    ],
)
def test_a_plain_command_line_names_its_hosts(argv, hosts):
    assert warmstart.hosts_word(argv) == hosts


@pytest.mark.parametrize(
    "argv",
    [
        ["-H", "lab01"],  # no task: --help, --list, a usage error
        ["ping"],  # no host
        ["-H", "lab01", "--", "uname", "-a"],  # the ad-hoc command
        ["-H", "lab01", "run", "true"],
        ["-u", "bob", "-H", "lab01", "ping"],  # another login
        ["-H", "lab01", "ping", "--user", "bob"],
        ["-H", "lab01", "ping", "--port", "2222"],
        ["-i", "/keys/other", "-H", "lab01", "ping"],  # another key
        ["-H", "lab01", "ping", "--limit", "lab02"],  # an excluded host
        ["-H", "lab01", "ping", "--inventory", "staging/"],
        ["-H", "lab01", "ping", "--allow-insecure-venv"],
        ["-H", "lab01", "ping", "--ask-become-pass"],
        ["-S", "other_config", "-H", "lab01", "ping"],
        ["--transport", "paramiko", "-H", "lab01", "ping"],
        ["-r", "elsewhere", "-H", "lab01", "ping"],
        ["-H", "lab01", "lab.down"],  # a local task
        ["-H", "lab01", "extract"],  # a job: its own launcher
        ["-H", "lab01", "ping", "-H", "lab02"],
        ["-H", "lab01", "gpu", "--wait", "600"],  # an option it does not know
        ["-H", "lab01", "ping", "nosuchtask"],
        ["-H"],
    ],
)
def test_any_other_command_line_starts_nothing_early(argv):
    assert warmstart.hosts_word(argv) is None


def test_the_tasks_it_starts_agents_for_are_host_tasks_of_the_program():
    for name in warmstart.TASKS:
        assert name in ns.tasks, name
        assert getattr(ns.tasks[name].body, "fleetops_task", None) == name, name


def test_each_harmless_option_is_an_option_of_those_tasks_taking_a_value_as_read():
    options: dict[str, bool] = {}
    for name in warmstart.TASKS:
        for arg in ns.tasks[name].get_arguments():
            for flag in arg.names:
                options["-" + flag if len(flag) == 1 else "--" + flag.replace("_", "-")] = (
                    arg.takes_value
                )
    for flag, takes_value in warmstart.HARMLESS.items():
        assert flag in options, flag
        assert options[flag] == takes_value, flag


@pytest.mark.parametrize(
    "env",
    [
        {warmstart.OFF_ENV: "0"},
        {"FLEETOPS_LIMIT": "lab02"},
        {"FABRIC_USER": "bob"},
        {"INVOKE_RUN_ECHO": "1"},
    ],
)
def test_the_environment_can_say_more_than_it_reads(env, monkeypatch):
    read: list[str] = []
    monkeypatch.setattr(warmstart, "_start", lambda word: read.append(word) or [word])
    assert warmstart.begin(["-H", "lab01", "ping"], environ={**os.environ, **env}) == []
    assert read == []  # not even the project was read
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FABRIC_", "INVOKE_"))}
    clean.pop("FLEETOPS_LIMIT", None)
    clean.pop(warmstart.OFF_ENV, None)
    assert warmstart.begin(["-H", "lab01", "ping"], environ=clean) == ["lab01"]


@pytest.mark.parametrize(
    "text",
    [
        "user: bob\nfleetops:\n  inventory: hosts\n",  # Fabric's own login settings
        "connect_kwargs:\n  key_filename: /keys/other\n",
        "fleetops: [1, 2]\n",
    ],
)
def test_a_fabric_yaml_that_sets_more_than_fleetops_settings_starts_nothing(text, tmp_path):
    (tmp_path / "fabric.yaml").write_text(text)
    assert warmstart._settings(tmp_path) is None


def test_the_projects_fleetops_section_is_what_it_reads(tmp_path):
    (tmp_path / "fabric.yaml").write_text(
        "tasks:\n  executor_class: fleetops.fab.executor.FleetExecutor\n"
        "fleetops:\n  inventory: staging\n"
    )
    assert warmstart._settings(tmp_path) == {"inventory": "staging"}
    (tmp_path / "fabric.yml").write_text("fleetops: {}\n")  # Invoke would read another file
    assert warmstart._settings(tmp_path) is None


class _Connector:
    """A parked connector's stand-in: what take() and discard_all() do to it."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_a_parked_connection_is_taken_only_for_the_very_host_it_was_made_for():
    host = Host(name="lab01", address="127.0.0.1", port=2201, user="root")
    made = _Connector(host)
    parked.park(host, made)  # type: ignore[arg-type]
    assert parked.take(host) is made and not made.closed
    assert parked.take(host) is None  # taken once
    parked.park(host, made)  # type: ignore[arg-type]
    other = dataclasses.replace(host, python="/opt/other/bin/python")
    assert parked.take(other) is None and made.closed  # made for another interpreter: closed
    left = _Connector(host)
    parked.park(host, left)  # type: ignore[arg-type]
    parked.discard_all()
    assert left.closed and parked.names() == []


def test_within_stored_answers_only_no_ssh_g_process_runs(monkeypatch):
    from fleetops.wire import sshcmd

    ran: list[list[str]] = []
    monkeypatch.setenv("FLEETOPS_SSH_G_CACHE", "0")  # no store: every answer would be a process
    monkeypatch.setattr(sshcmd, "_ssh_g", lambda argv: ran.append(argv) or b"hostname x\n")
    argv = ["ssh", "-o", "BatchMode=yes", "--", "lab01"]
    with sshcmd.stored_answers_only():
        assert sshcmd.resolved_all(argv) == {}
    assert ran == []
    assert sshcmd.resolved_all(argv) == {"hostname": ["x"]} and len(ran) == 1


@pytest.mark.parametrize("field", [{"become": "sudo"}, {"persist": 0}])
def test_become_and_persist_0_hosts_are_never_started_early(field, monkeypatch):
    """Before anything is resolved or opened: under become the password handshake is the run's, and
    a persist-0 host's live master is another run's (this run's end would close it)."""
    from fleetops.wire.openssh import OpenSSHConnection

    monkeypatch.setattr(
        OpenSSHConnection, "_command", lambda self: pytest.fail("resolved a host it must skip")
    )
    host = Host(name="lab01", address="127.0.0.1", port=2201, user="root", **field)
    assert OpenSSHConnection(host).start_on_live_master() is False
