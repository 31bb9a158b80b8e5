"""`fleet init [DIR]`: a project in any folder, from the installed package alone. What it writes
(hosts/ with an example that names no reachable address, the shipped playbook, fabric.yaml, a
one-line fabfile.py), that it refuses to replace a file unless told, and that what it writes is a
working project (the playbook lints clean, the example inventory loads and is refused as a target).
No node, no lab."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO

from fleetops.init import FABFILE, make_project, project_files, shipped_playbooks
from fleetops.plans.inventory import load_inventory

FLEET = Path(sys.executable).parent / "fleet"
IPV4 = re.compile(r"(?<![\d.])\d{1,3}(\.\d{1,3}){3}(?![\d.])")


def fleet(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run(
        [str(FLEET), *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120
    )


def test_init_makes_a_project_in_a_new_folder(tmp_path):
    proc = fleet(tmp_path, "init", "team/ops")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    project = tmp_path / "team" / "ops"
    got = sorted(str(p.relative_to(project)) for p in project.rglob("*") if p.is_file())
    assert got == sorted(project_files()), got
    assert {
        "fabfile.py",
        "fabric.yaml",
        "hosts/example.yaml",
        "playbooks/speculators-0.3.0-vllm-0.16.yaml",
    } <= {*got}
    for hint in ("cd team/ops", "fleet lab.up", "fleet -H lab01 patch verify"):
        assert hint in proc.stdout, proc.stdout


def test_init_alone_makes_the_working_directory_a_project(tmp_path):
    proc = fleet(tmp_path, "init")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "fabfile.py").is_file() and (tmp_path / "playbooks").is_dir()
    assert "\n  cd " not in proc.stdout  # already there


def test_the_fabfile_is_one_import_line():
    tree = ast.parse(FABFILE)
    code = [
        node
        for node in tree.body
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
    ]
    assert len(code) == 1 and isinstance(code[0], ast.ImportFrom), ast.dump(tree)
    assert code[0].module == "fleetops.fab.tasks" and [a.name for a in code[0].names] == ["ns"]
    # The checkout's own fabfile is the same line.
    assert "from fleetops.fab.tasks import ns  # noqa: F401" in (REPO / "fabfile.py").read_text()


def test_the_shipped_playbook_is_copied_as_the_package_has_it(tmp_path):
    make_project(tmp_path)
    shipped = shipped_playbooks()
    yaml = "speculators-0.3.0-vllm-0.16.yaml"
    assert (tmp_path / "playbooks" / yaml).read_bytes() == shipped.joinpath(yaml).read_bytes()
    # The checkout's playbooks/ is the package's (a link), so there is one copy of each file.
    assert (REPO / "playbooks").resolve() == (REPO / "fleetops" / "playbooks").resolve()
    lint = fleet(tmp_path, "playbook.lint")
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_no_generated_file_names_an_address(tmp_path):
    # hosts/example.yaml of the checkout names a real fleet's 10.x addresses: a new project must
    # not.
    make_project(tmp_path)
    for rel in ("fabfile.py", "fabric.yaml", "hosts/example.yaml", ".gitignore"):
        text = (tmp_path / rel).read_text()
        found = IPV4.search(text)
        assert not found, f"{rel}: {found.group(0)}"  # type: ignore[union-attr]
    inventory = load_inventory(tmp_path / "hosts")
    hosts = [inventory.hosts[name] for name in inventory.names()]
    assert hosts and all(h.example for h in hosts)  # every host refused as a target
    assert all(h.address.endswith(".example") for h in hosts), [h.address for h in hosts]


def test_init_refuses_to_replace_files_unless_forced(tmp_path):
    assert fleet(tmp_path, "init", "ops").returncode == 0
    project = tmp_path / "ops"
    (project / "fabric.yaml").write_text("# the team's own\n")
    (project / "hosts" / "fleet.yaml").write_text("hosts: {}\n")
    again = fleet(tmp_path, "init", "ops")
    assert again.returncode == 2, again.stdout + again.stderr
    assert (
        "fabric.yaml" in again.stderr
        and "nothing written" in again.stderr
        and "--force" in again.stderr
    )
    assert "Traceback" not in again.stderr
    assert (project / "fabric.yaml").read_text() == "# the team's own\n"
    forced = fleet(tmp_path, "init", "--force", "ops")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "fleetops.fab.executor.FleetExecutor" in (project / "fabric.yaml").read_text()
    assert "(replaced)" in forced.stdout
    # not one of init's files: left alone
    assert (project / "hosts" / "fleet.yaml").read_text() == "hosts: {}\n"


def test_init_into_a_file_is_a_usage_error(tmp_path):
    (tmp_path / "ops").write_text("")
    proc = fleet(tmp_path, "init", "ops")
    assert proc.returncode == 2 and "ops" in proc.stderr and "Traceback" not in proc.stderr, (
        proc.stderr
    )
