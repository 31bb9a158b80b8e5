"""The node agent uses the standard library's public modules only: no CPython-private module
(`_json`, `_signal`, `_thread`, `_sha2`, ...) is imported or looked up in sys.modules anywhere in
remote_scripts/, the bootstrap's text included. (What they saved, measured: a few ms of a node's own
CPU per run, docs/perf.md.)"""

from __future__ import annotations

import ast

from conftest import REPO

AGENT = REPO / "remote_scripts"


def private_modules(source: str, name: str) -> list[str]:
    """`name:line module` for each private top-level module the source imports or looks up in
    sys.modules."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Subscript)
            and ast.unparse(node.value) == "sys.modules"
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            names = [node.slice.value]
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("importlib.import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        found += [
            f"{name}:{node.lineno} {n}"
            for n in names
            if n.split(".")[0].startswith("_") and n.split(".")[0] not in ("__future__", "__main__")
        ]
    return sorted(found, key=lambda hit: int(hit.split(":")[1].split()[0]))


def test_the_agent_imports_no_private_module_of_cpython():
    files = sorted(AGENT.rglob("*.py"))
    assert len(files) > 40
    assert [
        hit
        for path in files
        for hit in private_modules(path.read_text(), str(path.relative_to(REPO)))
    ] == []


def test_the_scan_finds_each_way_of_reaching_a_private_module():
    source = (
        "from __future__ import annotations\nimport _json\nfrom _signal import SIGKILL\nimport "
        "os, _thread\nimport sys\nimport importlib\ndef f():\n    from _sha2 import sha256\n    "
        "return sys.modules['_frozen_importlib_external']\nimportlib.import_module('_sha256')\n"
        "from . import _private_helper\nsys.modules['__main__']\n"
    )
    assert [hit.split(" ", 1)[1] for hit in private_modules(source, "sample.py")] == [
        "_json",
        "_signal",
        "_thread",
        "_sha2",
        "_frozen_importlib_external",
        "_sha256",
    ]
