"""The node agent's layout: every module lives in a subpackage named for what it does, no private name crosses a
module boundary, every op and role the agent dispatches by name resolves, and the shipped zip carries every
module, precompiled under its dotted name. No lab."""

from __future__ import annotations

import ast
import importlib
import io
import zipfile
from pathlib import Path

import pytest

import remote_scripts
from fleetops.wire import bundle as bundle_mod
from remote_scripts.core import agent

ROOT = Path(remote_scripts.__file__).parent
SUBPACKAGES = ("core", "patch", "checks", "jobs", "health")


def private_imports(root: Path) -> list[str]:
    """`from <a module of the agent> import _name`, wherever it is written (module level or in a function)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            ours = node.level > 0 or (node.module or "").split(".")[0] == "remote_scripts"
            for alias in node.names:
                if ours and alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(root)}:{node.lineno} imports {alias.name}")
    return found


def test_no_private_name_crosses_a_module_boundary():
    assert private_imports(ROOT) == []


def test_the_check_sees_a_private_import(tmp_path):
    # the check above is not vacuous: the shapes it must catch, relative and absolute, at any depth
    (tmp_path / "a.py").write_text("def f():\n    from .b import _x\n")
    (tmp_path / "c.py").write_text("from remote_scripts.core.failpoints import _HITS, reset\n")
    (tmp_path / "d.py").write_text("from .b import __version__, public\n")
    assert private_imports(tmp_path) == ["a.py:2 imports _x", "c.py:1 imports _HITS"]


def test_every_module_sits_in_a_subpackage():
    assert sorted(p.name for p in ROOT.glob("*.py")) == ["__init__.py", "__main__.py"]
    assert sorted(p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(SUBPACKAGES)
    for name in SUBPACKAGES:
        assert (ROOT / name / "__init__.py").is_file(), name


@pytest.mark.parametrize("table", ["OPS", "ROLES"])
def test_every_op_and_role_resolves_to_a_function(table):
    for name, (module, function) in getattr(agent, table).items():
        assert callable(getattr(importlib.import_module(f"{agent.ROOT}.{module}"), function)), (name, module)


def test_the_zip_carries_every_module_and_its_code_by_dotted_name():
    data = bundle_mod._build(bundle_mod.agent_sources())
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = set(zf.namelist())
    # named as the zip names them (the node's remote_scripts/), wherever the client's copy is (an installed
    # fleetops holds it as fleetops/agent/)
    sources = {f"remote_scripts/{p.relative_to(ROOT).as_posix()}" for p in ROOT.rglob("*.py")
               if p.name != "__main__.py" and "__pycache__" not in p.parts}
    assert sources <= names and "remote_scripts/jobs/jobs.py" in sources
    codes = {n[len(bundle_mod.CODE_PREFIX):] for n in names if n.startswith(bundle_mod.CODE_PREFIX)}
    if not bundle_mod.PRECOMPILED:  # a client before 3.11 sends the sources alone (wire/bundle.py says why)
        assert codes == set()
        return
    assert {"remote_scripts", "remote_scripts.core", "remote_scripts.core.agent", "remote_scripts.jobs.jobs",
            "remote_scripts.health.preflight"} <= codes
    assert len(codes) == len(sources)
    assert bundle_mod._build(bundle_mod.agent_sources()) == data  # same code, same bytes, same name
