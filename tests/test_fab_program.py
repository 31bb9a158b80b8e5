"""The `fab` script that installing fleetops puts on PATH (fleetops/entry.py:fab_main, then cli.py), where no
node is needed: outside a project it refuses before any connection or name lookup, and in a project whose fabfile has no
fleetops tasks it is Fabric's own `fab` (same tasks, same Connection)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

FAB = Path(sys.executable).parent / "fab"


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    assert "fleetops.entry" in FAB.read_text(), f"{FAB} is Fabric's fab, not fleetops': run scripts/setup"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([str(FAB), *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120)


def test_outside_a_project_adhoc_is_refused_with_the_way_in(tmp_path):
    # `gpu01` is no address: a lookup would leave the machine. The refusal comes before any connection.
    proc = run(tmp_path, "-H", "gpu01", "--", "uname", "-a")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no fabfile.py" in proc.stderr and "-r PATH/TO/PROJECT" in proc.stderr
    assert "Traceback" not in proc.stderr and "gaierror" not in proc.stderr


def test_search_root_finds_the_project_from_anywhere(tmp_path):
    proc = run(tmp_path, "-r", str(REPO), "--list")
    assert proc.returncode == 0 and "patch" in proc.stdout and "verify" in proc.stdout, proc.stderr


def test_another_projects_fabfile_keeps_fabrics_ways(tmp_path):
    (tmp_path / "fabfile.py").write_text(
        "from fabric import task\n\n@task\ndef hello(c, who='world'):\n"
        "    print(f'hello {who} from', type(c).__name__, getattr(c, 'host', '-'), getattr(c, 'port', '-'))\n")
    proc = run(tmp_path, "hello", "--who", "ops")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().startswith("hello ops from Context")
    # With -H, Fabric's executor hands the task a Connection per host (built lazily: nothing is contacted
    # here); fleetops' executor would have run it as a local task.
    proc = run(tmp_path, "-H", "127.0.0.1:2222", "hello")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "hello world from Connection 127.0.0.1 2222"


def test_version_names_fleetops_and_fabric(tmp_path):
    proc = run(tmp_path, "--version")
    assert proc.returncode == 0 and "fleetops" in proc.stdout and "Fabric" in proc.stdout


def test_a_usage_error_names_the_command_the_operator_typed():
    # The defect: the installed `fab` is the Fleet class too, and its hint said `fleet --help`.
    from invoke.exceptions import ParseError

    from fleetops.cli import fab_program, program
    from fleetops.fab.usage import usage_exit

    assert "`fab --list`" in str(usage_exit(fab_program, ParseError("No idea what 'pach' is!")).message)
    assert "`fleet --list`" in str(usage_exit(program, ParseError("No idea what 'pach' is!")).message)
