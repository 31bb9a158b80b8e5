"""The two programs, where no node is needed. `fleet` (fleetops/entry.py, then cli.py) is fleetops'
own, with its tasks bundled: it lists and helps from any folder, makes a project (`fleet init`), and
outside a project refuses a command before any connection or name lookup. `fab` is Fabric's own,
untouched by installing fleetops: in a project made by `fleet init` its one-line fabfile gives it
fleetops' tasks and fabric.yaml the executor."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

BIN = Path(sys.executable).parent
FLEET, FAB = BIN / "fleet", BIN / "fab"


def run(program: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run(
        [str(program), *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120
    )


def test_installing_fleetops_leaves_fabrics_fab_alone():
    # The defect: pyproject installed `fab = fleetops.entry:fab_main` over the script Fabric
    # installs.
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"fleet": "fleetops.entry:main"}
    assert "from fabric.main import program" in FAB.read_text(), (
        f"{FAB} is not Fabric's: run scripts/setup"
    )
    assert "fleetops.entry" in FLEET.read_text()


def test_fabs_card_command_runs_fleetops_tasks_in_a_project_made_by_fleet_init(tmp_path):
    made = run(FLEET, tmp_path, "init", "ops")
    assert made.returncode == 0, made.stdout + made.stderr
    project = tmp_path / "ops"
    listed = run(FAB, project, "--list")
    assert listed.returncode == 0 and "patch" in listed.stdout and "verify" in listed.stdout, (
        listed.stderr
    )
    # Fabric's own fab loads the fabfile (fleetops' tasks) and fabric.yaml (fleetops' executor):
    # gpu01 is the example inventory's host, refused as bad input before any connection (no address
    # is looked up).
    card = run(FAB, project / "hosts", "-H", "gpu01", "patch", "verify", "extract")
    assert card.returncode == 2, card.stdout + card.stderr
    assert "gpu01 is an example host" in card.stderr and "RECAP" not in card.stdout
    assert "Traceback" not in card.stderr
    # The run options go after a task with either program, and before it with `fleet`, whose core
    # flags they are.
    for program, args in (
        (FAB, ["-H", "gpu01", "patch", "--serial", "1", "--forks", "2", "verify"]),
        (FLEET, ["-H", "gpu01", "patch", "--serial", "1", "--forks", "2", "verify"]),
        (FLEET, ["-H", "gpu01", "--serial", "1", "--forks", "2", "patch", "verify"]),
    ):
        proc = run(program, project, *args)
        assert proc.returncode == 2 and "example host" in proc.stderr, proc.stdout + proc.stderr
    # Before the task, Fabric's own `fab` parses them as Fabric does: a word it does not know,
    # Invoke's error.
    proc = run(FAB, project, "--serial", "1", "-H", "gpu01", "patch")
    assert proc.returncode == 1 and "No idea what '--serial' is!" in proc.stderr, (
        proc.stdout + proc.stderr
    )


def test_fleet_outside_a_project_refuses_before_any_lookup(tmp_path):
    # `gpu01` is no address: a lookup would leave the machine. The refusal comes before any
    # connection.
    for args in (["-H", "gpu01", "--", "uname", "-a"], ["-H", "gpu01", "ping"], ["lab.up"]):
        proc = run(FLEET, tmp_path, *args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "no fleetops project" in proc.stderr and "fleet init DIR" in proc.stderr
        assert "-r PATH/TO/PROJECT" in proc.stderr
        assert "Traceback" not in proc.stderr and "gaierror" not in proc.stderr
    assert list(tmp_path.iterdir()) == []  # lab.up made nothing here


def test_fleet_lists_and_helps_from_any_folder(tmp_path):
    listed = run(FLEET, tmp_path, "--list")
    assert listed.returncode == 0, listed.stderr
    for task in ("init", "patch", "verify", "lab.up", "playbook.lint"):
        assert f"  {task} " in listed.stdout, task
    helped = run(FLEET, tmp_path, "--help", "patch")
    assert helped.returncode == 0 and "--serial" in helped.stdout


def test_search_root_names_the_project_from_anywhere(tmp_path):
    assert run(FLEET, tmp_path, "init", "ops").returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run(FLEET, elsewhere, "-r", str(tmp_path / "ops" / "playbooks"), "-H", "gpu01", "ping")
    assert proc.returncode == 2 and "example host" in proc.stderr, proc.stdout + proc.stderr
    wrong = run(FLEET, elsewhere, "-r", str(elsewhere), "-H", "gpu01", "ping")
    assert wrong.returncode == 2 and "not a fleetops project" in wrong.stderr, wrong.stderr


def test_version_names_fleetops_and_its_parts(tmp_path):
    proc = run(FLEET, tmp_path, "--version")
    assert proc.returncode == 0, proc.stderr
    # The metadata the program's own environment finds (the checkout's, on its PYTHONPATH, before a
    # wheel's).
    names = ("fleetops", "fabric", "paramiko", "invoke")
    probe = run(
        Path(sys.executable),
        tmp_path,
        "-c",
        f"from importlib.metadata import version; print(' '.join(version(n) for n in {names!r}))",
    )
    versions = probe.stdout.split()
    assert proc.stdout.splitlines() == [
        f"{label} {v}" for label, v in zip(("fleetops", "Fabric", "Paramiko", "Invoke"), versions)
    ], (proc.stdout, probe.stdout, probe.stderr)


def test_a_fabfile_without_fleetops_tasks_keeps_fabrics_ways_under_fleetops_executor(tmp_path):
    (tmp_path / "fabric.yaml").write_text(
        "tasks:\n  executor_class: fleetops.fab.executor.FleetExecutor\n"
    )
    (tmp_path / "fabfile.py").write_text(
        "from fabric import task\n\n@task\ndef hello(c, who='world'):\n    print(f'hello {who} "
        "from', type(c).__name__, getattr(c, 'host', '-'), getattr(c, 'port', '-'))\n"
    )
    proc = run(FAB, tmp_path, "hello", "--who", "ops")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().startswith("hello ops from Context")
    # With -H, Fabric's executor hands the task a Connection per host (built lazily: nothing is
    # contacted here); fleetops' executor would have run it as a local task.
    proc = run(FAB, tmp_path, "-H", "127.0.0.1:2222", "hello")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "hello world from Connection 127.0.0.1 2222"


def test_a_usage_error_names_the_command_the_operator_typed():
    from fabric.main import program as fabrics
    from invoke.exceptions import ParseError

    from fleetops.cli import program
    from fleetops.fab.usage import usage_exit

    assert "`fab --list`" in str(usage_exit(fabrics, ParseError("No idea what 'pach' is!")).message)
    assert "`fleet --list`" in str(
        usage_exit(program, ParseError("No idea what 'pach' is!")).message
    )


# Every function a class of Fabric, Invoke or paramiko holds, by identity: what a monkeypatch would
# change.
_SNAPSHOT = r"""
import inspect, json, sys
import fabric, fabric.main, paramiko
import invoke, invoke.program, invoke.config, invoke.parser, invoke.executor
def snapshot():
    out = {}
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "") or ""
        if name.split(".")[0] not in ("fabric", "invoke", "paramiko"):
            continue
        for cname, cls in list(vars(module).items()):
            if inspect.isclass(cls) and cls.__module__ == name:
                for attr, value in list(vars(cls).items()):
                    out[f"{name}.{cname}.{attr}"] = id(value)
    return out
before = snapshot()
"""


def _changed_by_running(program: str, cwd: Path, argv: list[str]) -> dict:
    code = _SNAPSHOT + (
        f"sys.argv = {argv!r}\n"
        + (
            "from fabric.main import program\n"
            if program == "fab"
            else "from fleetops import entry\nprogram = entry.import_program().program\n"
        )
        + f"program.run({argv!r}, exit=False)\n"
        "after = snapshot()\n"
        "changed = sorted(k for k in before if k in after and before[k] != after[k])\n"
        "import invoke.context, unittest.mock\n"
        "real_mock = invoke.context.Mock is unittest.mock.Mock\n"
        "sys.stdout.write('\\n' + json.dumps({'changed': "
        "changed, 'real_mock': real_mock}) + '\\n')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    import json

    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_fab_with_the_fabfile_leaves_fabric_invoke_and_paramiko_as_they_are(tmp_path):
    """The fabfile gives `fab` its tasks and fabric.yaml its executor; nothing of Fabric's program,
    Invoke's parser or config, or paramiko is replaced for the process (a tool that imports fleetops
    gets them as shipped)."""
    made = run(FLEET, tmp_path, "init", "ops")
    assert made.returncode == 0, made.stdout + made.stderr
    seen = _changed_by_running("fab", tmp_path / "ops", ["fab", "--list"])
    assert seen["changed"] == [], seen
    seen = _changed_by_running("fab", tmp_path / "ops", ["fab", "-H", "gpu01", "ping"])
    assert seen["changed"] == [], seen


def test_fleet_is_a_subclass_of_fabrics_program_that_replaces_nothing(tmp_path):
    made = run(FLEET, tmp_path, "init", "ops")
    assert made.returncode == 0, made.stdout + made.stderr
    seen = _changed_by_running("fleet", tmp_path / "ops", ["fleet", "-H", "gpu01", "ping"])
    assert seen == {"changed": [], "real_mock": True}, seen


def test_the_installed_fleet_imports_fabric_with_the_real_unittest_mock(tmp_path):
    # Invoke binds unittest.mock.Mock for its MockContext when it is imported: a stand-in module in
    # its place while the program imported Fabric left Invoke's Mock a function of the stand-in's.
    code = (
        "import sys, json\nfrom fleetops import entry\nentry.import_program()\n"
        "import invoke.context, unittest.mock\n"
        "print(json.dumps([invoke.context.Mock is unittest.mock.Mock]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[true]", proc.stdout
