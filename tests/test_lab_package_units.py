"""The runtime package stands alone: nothing under fleetops/ or remote_scripts/ reads tests/ at run
time, and the nvidia-smi recordings the lab replays ship inside the lab package (package data), so
an installed, non-editable fleetops finds them. No lab, no sshd: the simulated nvidia-smi runs on a
temporary node folder."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import fleetops.lab
from fleetops.lab import RECORDINGS, Node
from fleetops.lab.gpu import set_gpu_state, stop_holders

REPO = Path(__file__).resolve().parents[1]
TESTS_PATH = re.compile(r"(^|[/\\])tests([/\\]|$)")


def paths_into_tests(source: str, filename: str) -> list[str]:
    """String constants in code (docstrings excepted: they may say where a copy came from) naming
    tests/."""
    tree = ast.parse(source, filename)
    nodes = list(ast.walk(tree))  # one walk (the three passes below read it): ~240 files a run
    docstrings = set()
    for node in nodes:
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
        ):
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    # A bare "tests" is a path only where a path is built from it (`ROOT / "tests"`, `Path(root,
    # "tests")`); as a key or an attribute's name (JUnit's `tests` count) it names no folder.
    in_path = {
        id(operand)
        for node in nodes
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
        for operand in (node.left, node.right)
    }
    in_path |= {id(arg) for node in nodes if isinstance(node, ast.Call) for arg in node.args}
    return [
        f"{filename}:{node.lineno}: {node.value!r}"
        for node in nodes
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and TESTS_PATH.search(node.value)
        and (node.value.strip("/") != "tests" or id(node) in in_path)
    ]


def test_the_check_sees_a_tests_path() -> None:
    # What gpu_fixtures() used to do; the check must flag it, or a clean result below means nothing.
    old = (
        'def f():\n    "tests/ is fine in a docstring"\n    '
        'return ROOT / "tests" / "fixtures" / "nvidia-smi"\n'
    )
    assert paths_into_tests(old, "old.py") == ["old.py:3: 'tests'"]
    assert paths_into_tests('P = f"{root}/tests/fixtures"\n', "f.py") == [
        "f.py:1: '/tests/fixtures'"
    ]
    assert paths_into_tests('P = Path(root, "tests")\n', "p.py") == ["p.py:1: 'tests'"]
    assert paths_into_tests('counts = {"tests": 0}\nsuite.set("failures", "3")\n', "junit.py") == []


def test_runtime_code_names_no_tests_path() -> None:
    files = sorted([*(REPO / "fleetops").rglob("*.py"), *(REPO / "remote_scripts").rglob("*.py")])
    assert len(files) > 40, files  # the walk found the packages
    found = [
        hit for f in files for hit in paths_into_tests(f.read_text(), str(f.relative_to(REPO)))
    ]
    assert not found, (
        "runtime code reads tests/ (ship what it needs in the package instead):\n"
        + "\n".join(found)
    )


def test_recordings_are_package_data() -> None:
    config = tomllib.loads((REPO / "fleetops-lab" / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]
    assert "fleetops.lab" in config["packages"]
    globs = config["package-data"]["fleetops.lab"]
    lab_dir = Path(fleetops.lab.__file__).parent  # the checkout's, or an installed wheel's
    recorded = sorted(p for p in RECORDINGS.rglob("*") if p.is_file())
    assert recorded and RECORDINGS.is_relative_to(lab_dir), RECORDINGS
    missing = [
        str(p.relative_to(lab_dir))
        for p in recorded
        if not any(fnmatch.fnmatch(str(p.relative_to(lab_dir)), g) for g in globs)
    ]
    assert not missing, f"not in pyproject's package-data for fleetops.lab {globs}: {missing}"


def test_recordings_are_the_tests_recordings() -> None:
    # One recording kept in two places (the package's copy, the tests' own): they must not drift
    # apart.
    theirs = REPO / "tests" / "fixtures" / "nvidia-smi" / "h200x2"
    for ours in sorted(RECORDINGS.iterdir()):
        assert ours.read_bytes() == (theirs / ours.name).read_bytes(), (
            f"{ours} differs from {theirs / ours.name}"
        )


ASKS = {
    "query-gpu": ["--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"],
    "query-gpu-units": ["--query-gpu=index,memory.used,memory.total", "--format=csv"],
    "apps": ["--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"],
    "apps-units": ["--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv"],
    "q": ["-q"],
    "table": [],
}


@pytest.fixture
def node(tmp_path: Path):
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)
    n = Node("unit01", 0, tmp_path)
    yield n
    stop_holders(n)


@pytest.mark.parametrize("state", ["idle", "busy", "missing"])
def test_simulated_nvidia_smi_answers_from_the_package_recordings(node: Node, state: str) -> None:
    config = set_gpu_state(node, state)
    assert Path(json.loads((node.dir / "gpu.json").read_text())["fixtures"]) == RECORDINGS
    present = 1 if state == "missing" else 2
    for ask, args in ASKS.items():
        proc = subprocess.run(
            [str(node.dir / "bin" / "nvidia-smi"), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0 and not proc.stderr, (state, ask, proc.stderr)
        lines = proc.stdout.splitlines()
        if ask.startswith("query-gpu"):
            gpu_rows = [ln for ln in lines if ln[:1].isdigit()]
            assert [ln.split(",")[0] for ln in gpu_rows] == [str(i) for i in range(present)], (
                state,
                lines,
            )
        elif ask.startswith("apps"):
            pids = sorted(int(ln.split(",")[0]) for ln in lines if ln[:1].isdigit())
            assert pids == sorted(config["holder_pids"][:present]), (state, lines)
        else:
            assert len(lines) > 10, (state, ask, lines)
