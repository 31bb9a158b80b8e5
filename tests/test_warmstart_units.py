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
        # a task's own option after a task that does not take it, or before any task: the program
        # refuses the command line (exit 2), so no agent is started for it
        ["-H", "lab01", "ping", "--check"],
        ["-H", "lab01", "ping", "-c"],
        ["-H", "lab01", "ping", "--kinds", "grep"],
        ["--diff", "-H", "lab01", "patch"],
        ["-H", "lab01", "--kinds", "grep", "verify"],
        ["-H", "lab01", "verify", "--check"],
        ["-H", "lab01", "patch", "--check", "ping", "--diff"],
    ],
)
def test_any_other_command_line_starts_nothing_early(argv):
    assert warmstart.hosts_word(argv) is None


def test_the_tasks_it_starts_agents_for_are_host_tasks_of_the_program():
    for name in warmstart.TASKS:
        assert name in ns.tasks, name
        assert getattr(ns.tasks[name].body, "fleetops_task", None) == name, name


def _options_of(task: str) -> dict[str, bool]:
    """The program's options of this task, as typed (`--no-fold`, `-j`), and whether each takes a
    value."""
    options: dict[str, bool] = {}
    for arg in ns.tasks[task].get_arguments():
        for flag in arg.names:
            options["-" + flag if len(flag) == 1 else "--" + flag.replace("_", "-")] = (
                arg.takes_value
            )
    return options


def test_every_option_read_anywhere_is_taken_by_every_task_it_starts_agents_for():
    for task in warmstart.TASKS:
        options = _options_of(task)
        for flag, takes_value in warmstart.ANYWHERE.items():
            assert flag in options, (task, flag)
            assert options[flag] == takes_value, (task, flag)


def test_each_task_option_is_one_of_the_tasks_it_is_read_after_taking_a_value_as_read():
    for flag, (takes_value, tasks) in warmstart.TASK_OPTIONS.items():
        assert tasks and tasks <= warmstart.TASKS, flag
        for task in tasks:
            options = _options_of(task)
            assert flag in options, (task, flag)
            assert options[flag] == takes_value, (task, flag)


@pytest.mark.parametrize(
    "env",
    [
        {warmstart.OFF_ENV: "0"},
        {warmstart.OFF_ENV: "off"},
        {warmstart.OFF_ENV: "False"},
        {warmstart.OFF_ENV: "no"},
        {"FLEETOPS_LIMIT": "lab02"},
        {"FLEETOPS_SERIAL": "1"},  # a staged roll-out: its later batches may never run
        {"FABRIC_USER": "bob"},
        {"INVOKE_RUN_ECHO": "1"},
    ],
)
def test_the_environment_can_say_more_than_it_reads(env, monkeypatch):
    read: list[str] = []
    monkeypatch.setattr(warmstart, "_start", lambda word, *_: read.append(word) or [word])
    assert warmstart.begin(["-H", "lab01", "ping"], environ={**os.environ, **env}) == []
    assert read == []  # not even the project was read
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FABRIC_", "INVOKE_"))}
    clean.pop("FLEETOPS_LIMIT", None)
    clean.pop("FLEETOPS_SERIAL", None)
    clean.pop(warmstart.OFF_ENV, None)
    assert warmstart.begin(["-H", "lab01", "ping"], environ=clean) == ["lab01"]


@pytest.mark.parametrize(
    "text",
    [
        "user: bob\nfleetops:\n  inventory: hosts\n",  # Fabric's own login settings
        "connect_kwargs:\n  key_filename: /keys/other\n",
        "fleetops: [1, 2]\n",
        # another executor may choose other hosts than the -H word names
        "tasks:\n  executor_class: mypkg.Executor\nfleetops: {}\n",
        "tasks:\n  collection_name: other\n",
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


@pytest.mark.parametrize(
    "forks_env, settings, expected",
    [
        (None, {}, 32),
        ("4", {}, 4),
        (None, {"forks": 8}, 8),
        ("2", {"forks": 8}, 2),  # the environment wins, as the run has it
        ("0", {}, None),  # refused by the run: nothing started for it
        ("many", {}, None),
        (None, {"forks": "x"}, None),
    ],
)
def test_the_runs_forks_are_read_as_the_run_reads_them(forks_env, settings, expected):
    env = {"FLEETOPS_FORKS": forks_env} if forks_env else {}
    assert warmstart._forks(env, settings) == expected


def test_the_default_forks_are_the_runs():
    from fleetops import rollout

    assert warmstart._forks({}, {}) == rollout.DEFAULT_FORKS


def _project(tmp_path, hosts: int, settings: str = "") -> None:
    (tmp_path / "fabfile.py").write_text("from fleetops.fab.tasks import ns  # noqa: F401\n")
    if settings:
        (tmp_path / "fabric.yaml").write_text(settings)
    (tmp_path / "hosts").mkdir()
    (tmp_path / "hosts" / "lab.yaml").write_text(
        "defaults:\n  user: root\n  transport: openssh\nhosts:\n"
        + "".join(
            f"  lab{i:02d}:\n    address: 127.0.0.1\n    port: {2200 + i}\n"
            for i in range(1, hosts + 1)
        )
    )


def test_one_hosts_trouble_leaves_the_others_agents_started(tmp_path, monkeypatch):
    """A host whose connection cannot be made here (a key missing, a secret unset) is the run's to
    report; the other hosts' agents stay started, and its connection is closed."""
    from fleetops.wire.openssh import OpenSSHConnection

    _project(tmp_path, 3)
    monkeypatch.chdir(tmp_path)
    closed: list[str] = []

    def start(self) -> bool:
        if self.host.name == "lab02":
            raise OSError("no such key")
        return True

    monkeypatch.setattr(OpenSSHConnection, "start_on_live_master", start)
    monkeypatch.setattr(OpenSSHConnection, "close", lambda self: closed.append(self.host.name))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FABRIC_", "INVOKE_"))}
    env = {k: v for k, v in env.items() if k not in ("FLEETOPS_LIMIT", "FLEETOPS_SERIAL")}
    env.pop(warmstart.OFF_ENV, None)
    try:
        assert warmstart.begin(["-H", "lab[01-03]", "ping"], environ=env) == ["lab01", "lab03"]
        assert closed == ["lab02"]
    finally:
        parked.discard_all()


@pytest.mark.parametrize("forks_env, settings", [("2", ""), (None, "fleetops:\n  forks: 2\n")])
def test_more_hosts_than_the_runs_forks_start_nothing(forks_env, settings, tmp_path, monkeypatch):
    """Hosts beyond the forks would wait their turn with an idle agent (and a master that ends
    meanwhile leaves it without one): the run starts them itself."""
    from fleetops.wire.openssh import OpenSSHConnection

    _project(tmp_path, 3, settings)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        OpenSSHConnection, "start_on_live_master", lambda self: pytest.fail("started one")
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FABRIC_", "INVOKE_"))}
    env = {k: v for k, v in env.items() if k not in ("FLEETOPS_LIMIT", "FLEETOPS_SERIAL")}
    env.pop(warmstart.OFF_ENV, None)
    if forks_env:
        env["FLEETOPS_FORKS"] = forks_env
    assert warmstart.begin(["-H", "lab[01-03]", "ping"], environ=env) == []


def test_past_its_time_budget_it_leaves_the_remaining_hosts_to_the_run(tmp_path, monkeypatch):
    """Masters slow to answer (each one's wait is bounded by EARLY_LOCAL_TIMEOUT) must not add up
    to a slow start: once the budget is spent, no further host is tried."""
    from fleetops.wire.openssh import OpenSSHConnection

    _project(tmp_path, 3)
    monkeypatch.chdir(tmp_path)
    tried: list[str] = []
    clock = [0.0]

    def start(self) -> bool:
        tried.append(self.host.name)
        clock[0] += warmstart.BUDGET_S  # this one took the whole budget
        return False

    monkeypatch.setattr(OpenSSHConnection, "start_on_live_master", start)
    monkeypatch.setattr(warmstart.time, "monotonic", lambda: clock[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FABRIC_", "INVOKE_"))}
    env = {k: v for k, v in env.items() if k not in ("FLEETOPS_LIMIT", "FLEETOPS_SERIAL")}
    env.pop(warmstart.OFF_ENV, None)
    assert warmstart.begin(["-H", "lab[01-03]", "ping"], environ=env) == []
    assert tried == ["lab01", "lab02"]


def test_the_fabric_yaml_fleet_init_writes_is_read(tmp_path):
    from fleetops.init import make_project

    make_project(tmp_path / "p")
    assert warmstart._settings(tmp_path / "p") is not None
