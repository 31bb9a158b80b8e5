"""What `fleet` imports before it decides: its version, its help, its task list and a host task's
run up to the point where it would connect load no SSH code (paramiko, cryptography, Fabric's
connection), which was most of every start's CPU. Read from `python -X importtime`, which names
every module the process imported."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from clientprobe import fleet_imports, run_python, ssh_code


def _project(tmp_path: Path) -> Path:
    """A project whose one inventory host is on loopback (nothing here connects to it)."""
    (tmp_path / "fabfile.py").write_text("from fleetops.fab.tasks import ns  # noqa: F401\n")
    (tmp_path / "fabric.yaml").write_text(
        "tasks:\n  executor_class: fleetops.fab.executor.FleetExecutor\n"
        "fleetops:\n  inventory: hosts\n"
    )
    (tmp_path / "hosts").mkdir()
    (tmp_path / "hosts" / "lab.yaml").write_text(
        "hosts:\n  n1:\n    address: 127.0.0.1\n    port: 9\n    user: nobody\n"
        f"    known_hosts: {os.devnull}\n"
    )
    return tmp_path


@pytest.mark.parametrize(
    "words", [["--version"], ["-V"], ["--help"], ["--list"], ["--help", "patch"]], ids=" ".join
)
def test_the_version_help_and_task_list_load_no_ssh_code(words, tmp_path):
    proc, names = fleet_imports(["fleet", *words], _project(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip()
    assert ssh_code(names) == []


def test_a_host_tasks_run_up_to_its_hosts_loads_no_ssh_code(tmp_path):
    """The run is planned (the run, its state and report modules loaded) and ends at `-H ,`, which
    names no host: all of it without SSH code."""
    proc, names = fleet_imports(["fleet", "-H", ",", "ping"], _project(tmp_path))
    assert proc.returncode == 2 and "-H ',' names no host" in proc.stderr, proc.stderr[-2000:]
    assert {"fleetops.run", "fleetops.state", "fleetops.report.console"} <= names
    assert ssh_code(names) == []


def test_a_host_task_that_stops_before_connecting_loads_no_ssh_code(tmp_path):
    """The host word is looked up in the inventory and ssh_config's Host names, read as text:
    paramiko's reading of the file is for a resolver without `ssh`, its Fabric Config for a
    paramiko connection, neither made for a run that connects nowhere."""
    proc, names = fleet_imports(["fleet", "-H", "nosuchhost", "ping"], _project(tmp_path))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "unknown host 'nosuchhost'" in proc.stderr, proc.stderr[-2000:]
    assert "fleetops.wire.fabconfig" in names  # ssh_config was read
    assert ssh_code(names) == []


@pytest.mark.parametrize(("transport", "loads_ssh_code"), [("openssh", False), ("paramiko", True)])
def test_a_host_task_connecting_over_openssh_loads_no_ssh_code(transport, loads_ssh_code, tmp_path):
    """The whole run, connection attempt and its error included (nothing listens on
    127.0.0.1:9): through the system `ssh` without paramiko, cryptography or Fabric; the same run
    over paramiko loads them (what the harness would see if the openssh run did)."""
    control = tempfile.mkdtemp(prefix="fo-i-", dir="/tmp")  # 0700, short enough for a socket
    try:
        proc, names = fleet_imports(
            ["fleet", "-H", "n1", "ping"],
            _project(tmp_path),
            {"FLEETOPS_TRANSPORT": transport, "FLEETOPS_CONTROL_DIR": control},
        )
    finally:
        for name in os.listdir(control):
            os.unlink(os.path.join(control, name))
        os.rmdir(control)
    assert proc.returncode == 4, proc.stdout + proc.stderr[-2000:]
    assert "n1 | ping | unreachable" in proc.stdout and "127.0.0.1:9" in proc.stdout, proc.stdout
    assert ("fleetops.wire.openssh" in names) is (transport == "openssh")
    assert bool(ssh_code(names)) is loads_ssh_code, ssh_code(names)


def test_a_usage_error_loads_no_ssh_code(tmp_path):
    proc, names = fleet_imports(["fleet", "-H", "n1", "patch", "--chek"], _project(tmp_path))
    assert proc.returncode == 2 and "'--chek' is not an option of patch" in proc.stderr, (
        proc.stderr[-2000:]
    )
    assert ssh_code(names) == []


def test_the_version_names_fabric_paramiko_and_invoke_as_installed(tmp_path):
    """Read from the installed metadata, as `pip show` has them, not from the modules (not
    imported)."""
    from importlib.metadata import version

    proc, _ = fleet_imports(["fleet", "--version"], tmp_path)
    lines = proc.stdout.splitlines()
    assert lines[1:] == [
        f"Fabric {version('fabric')}",
        f"Paramiko {version('paramiko')}",
        f"Invoke {version('invoke')}",
    ]
    assert lines[0].startswith("fleetops ")


def test_the_answer_before_invoke_is_the_programs_own(tmp_path):
    """`fleet --version` alone is answered before Invoke is imported; the program (`python -m
    fleetops.cli`, or --version with other words) prints the same lines."""
    quick, names = fleet_imports(["fleet", "--version"], tmp_path)
    assert "invoke" not in names
    program = run_python("-m", "fleetops.cli", "--version", cwd=tmp_path)
    assert program.returncode == quick.returncode == 0, program.stderr
    assert quick.stdout == program.stdout


def test_compat_imports_paramiko_only_for_a_paramiko_fast_path():
    probe = (
        "import sys\nfrom fleetops import compat\nbefore = 'paramiko' in sys.modules\nparser = "
        "compat.enabled('task_parser')\nafter_parser = 'paramiko' in sys.modules\nkeys = "
        "compat.enabled('indexed_host_keys')\nprint(before, parser, after_parser, keys, "
        "'paramiko' in sys.modules, compat.IndexedHostKeys.__name__)"
    )
    proc = run_python("-c", probe)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True", "False", "True", "True", "IndexedHostKeys"]


def test_fleets_config_has_fabrics_settings_and_defaults():
    """fabric.yaml is checked and merged against these defaults (plans/projectfile.py): the same
    keys, each a mapping where Fabric's is one, the same values (Fabric's remote runners, its
    connection code, aside)."""
    from fabric import Config

    from fleetops.cli import FleetConfig

    def shape(tree: dict) -> dict:
        return {k: shape(v) if isinstance(v, dict) else v for k, v in tree.items()}

    ours, fabrics = shape(FleetConfig.global_defaults()), shape(Config.global_defaults())
    fabrics_runners = fabrics.pop("runners")
    assert ours.pop("runners") == {**fabrics_runners, "remote": None, "remote_shell": None}
    assert ours == fabrics
    assert FleetConfig.prefix == Config.prefix == "fabric"


def test_fleet_declares_fabrics_core_flags_as_fabric_does():
    """The core flags Fabric's program adds to Invoke's, declared by `fleet` with Fabric's names,
    kinds and defaults (cli.py CORE_HELP and _fleets then say what they do here)."""
    from fabric.main import Fab
    from invoke import Program

    from fleetops.cli import FABRIC_CORE_ARGS

    invokes = {arg.name for arg in Program().core_args()}
    fabrics = [
        (tuple(arg.names), arg.kind, arg.help)
        for arg in Fab().core_args()
        if arg.name not in invokes
    ]
    assert fabrics == list(FABRIC_CORE_ARGS)


def test_a_missing_ssh_config_file_is_a_usage_error_naming_it(tmp_path):
    """Fabric's program read -S FILE at start-up and let a FileNotFoundError's traceback out; the
    run says it."""
    proc = run_python(
        "-c",
        "import sys\nsys.argv = ['fleet', '-S', sys.argv[1], '-H', 'n1', "
        "'ping']\nfrom fleetops.entry import main\nmain()\n",
        str(tmp_path / "nosuchfile"),
        cwd=_project(tmp_path),
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip()
        == f"error: {tmp_path / 'nosuchfile'}: ssh_config file not found (given with -S or "
        "FLEETOPS_SSH_CONFIG)"
    )
