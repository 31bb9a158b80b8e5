"""The node agent's layout: every module lives in a subpackage named for what it does (but the
manifest), no private name crosses a module boundary, every op and role is declared by the module
that implements it and reached through an import the contracts see, and the shipped zip carries
every module, precompiled under its dotted name. No lab."""

from __future__ import annotations

import ast
import io
import zipfile
from pathlib import Path

import grimp
import pytest

import remote_scripts
from fleetops.wire import bundle as bundle_mod
from remote_scripts import ops
from remote_scripts.core import registry
from remote_scripts.core.protocol import OPS, READ_ONLY_OPS

ROOT = Path(remote_scripts.__file__).parent
SUBPACKAGES = ("core", "patch", "checks", "jobs", "health")


def private_imports(root: Path) -> list[str]:
    """`from <a module of the agent> import _name`, wherever it is written (module level or in a
    function)."""
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
    assert sorted(p.name for p in ROOT.glob("*.py")) == ["__init__.py", "__main__.py", "ops.py"]
    assert sorted(
        p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"
    ) == sorted(SUBPACKAGES)
    for name in SUBPACKAGES:
        assert (ROOT / name / "__init__.py").is_file(), name


def string_imports(root: Path) -> list[str]:
    """Imports by a computed name (importlib.import_module, __import__): an edge the import
    contracts cannot see. Only verify's checks import that way, and what they import is the node's
    packages, never ours."""
    allowed = {"checks/checks.py", "checks/pyintrospect.py"}
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and where not in allowed:
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in ("import_module", "__import__"):
                    found.append(f"{where}:{node.lineno} {name}")
    return found


def test_no_module_of_the_agent_imports_by_a_computed_name():
    assert string_imports(ROOT) == []


def test_the_check_sees_a_computed_import(tmp_path):
    (tmp_path / "a.py").write_text(
        "import importlib\nm = importlib.import_module(f'{__package__}.jobs')\n"
    )
    (tmp_path / "b.py").write_text("def f(name):\n    return __import__(name)\n")
    assert string_imports(tmp_path) == ["a.py:2 import_module", "b.py:2 __import__"]


@pytest.mark.parametrize("kind", ["op", "role"])
def test_each_op_and_role_is_declared_by_the_module_the_manifest_imports(kind):
    table, find, declared = (
        (ops.OP_MODULES, ops.find_op, registry.OPS)
        if kind == "op"
        else (ops.ROLE_MODULES, ops.find_role, registry.ROLES)
    )
    graph = grimp.build_graph("remote_scripts")
    for name, load in table.items():
        module = load()
        found = find(name)
        handler = found.handler if isinstance(found, registry.Op) else found
        assert callable(handler) and handler.__module__ == module.__name__, (name, module)
        # a plain import of that module in the manifest: the contracts (agent-layers) see the edge
        assert graph.direct_import_exists(
            importer="remote_scripts.ops", imported=module.__name__
        ), module
    # nothing declared that the manifest does not reach: every loaded module's declarations are in
    # the table
    assert set(declared) == set(table)


def test_the_ops_are_the_protocols_and_each_keeps_its_read_only_promise():
    for load in set(ops.OP_MODULES.values()):
        load()
    assert {"ping", *registry.OPS} == set(OPS)
    assert {name for name, op in registry.OPS.items() if not op.writes} | {"ping"} == READ_ONLY_OPS
    assert ops.find_op("no_such_op") is None and ops.find_role("no_such_role") is None


def test_a_declaration_the_protocol_does_not_know_is_refused():
    with pytest.raises(ValueError, match="not in protocol.OPS"):
        registry.node_op("no_such_op", writes=False)
    with pytest.raises(ValueError, match="READ_ONLY_OPS"):
        # the client pipelines verify: it must stay read-only
        registry.node_op("verify", writes=True)
    with pytest.raises(ValueError, match="READ_ONLY_OPS"):
        registry.node_op("patch", writes=False)


def test_an_op_declared_by_two_modules_is_refused():
    ops.find_op("gpu")

    def gpu(req: dict) -> dict:
        return {}

    with pytest.raises(ValueError, match="declared twice"):
        registry.node_op("gpu", writes=False)(gpu)
    assert registry.OPS["gpu"].handler.__module__ == "remote_scripts.health.gpu"


def test_the_zip_carries_every_module_and_its_code_by_dotted_name():
    data = bundle_mod._build(bundle_mod.agent_sources())
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = set(zf.namelist())
    # named as the zip names them (the node's remote_scripts/), wherever the client's copy is (an
    # installed fleetops holds it as fleetops/agent/)
    sources = {
        f"remote_scripts/{p.relative_to(ROOT).as_posix()}"
        for p in ROOT.rglob("*.py")
        if p.name != "__main__.py" and "__pycache__" not in p.parts
    }
    assert sources <= names and "remote_scripts/jobs/jobs.py" in sources
    codes = {
        n[len(bundle_mod.CODE_PREFIX) :] for n in names if n.startswith(bundle_mod.CODE_PREFIX)
    }
    # a client before 3.11 sends the sources alone (wire/bundle.py says why)
    if not bundle_mod.PRECOMPILED:
        assert codes == set()
        return
    assert {
        "remote_scripts",
        "remote_scripts.core",
        "remote_scripts.ops",
        "remote_scripts.core.agent",
        "remote_scripts.jobs.jobs",
        "remote_scripts.health.preflight",
    } <= codes
    assert len(codes) == len(sources)
    assert bundle_mod._build(bundle_mod.agent_sources()) == data  # same code, same bytes, same name
