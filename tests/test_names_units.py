"""Names that say one thing: an import alias stands for one module across the project, no module
imports a private name of another only to pass it on, and every test file the sources cite exists.
No lab."""

from __future__ import annotations

import ast
import re
import subprocess
from collections import defaultdict
from pathlib import Path

from conftest import REPO

CODE = ("fleetops", "remote_scripts", "tests", "bench", "scripts")


def python_files(root: Path, parts: tuple[str, ...] = CODE) -> list[Path]:
    # bench/.work: what a bench run made (git-ignored: its snapshot of the tree, the peers' venv)
    return sorted(
        p
        for part in parts
        for p in (root / part).rglob("*.py")
        if "__pycache__" not in p.parts and ".work" not in p.parts
    )


FROM_AS = re.compile(r"^\s*from\s+(\.*)([\w.]*)\s+import\s+(\w+)\s+as\s+(\w+)\s*$", re.M)
IMPORT_AS = re.compile(r"^\s*import\s+([\w.]+)\s+as\s+(\w+)\s*$", re.M)


def aliases(root: Path) -> dict[str, set[str]]:
    """Each `as NAME` that renames something, and every module (or name) it stands for. Read by
    line, not parsed: the whole tree in well under a second (ruff's isort writes an alias on a line
    of its own)."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in python_files(root):
        text = path.read_text(encoding="utf-8")
        for dots, module, name, alias in FROM_AS.findall(text):
            if alias != name:
                package = path.relative_to(root).with_suffix("").parts[: -len(dots)] if dots else ()
                found[alias].add(".".join((*package, module, name) if module else (*package, name)))
        for module, alias in IMPORT_AS.findall(text):
            if alias != module:
                found[alias].add(module)
    return found


def test_an_alias_stands_for_one_module():
    assert {name: sorted(what) for name, what in aliases(REPO).items() if len(what) > 1} == {}


def test_the_alias_check_sees_two_modules_under_one_name(tmp_path):
    (tmp_path / "fleetops").mkdir()
    (tmp_path / "fleetops" / "a.py").write_text("from .plans import slurm as sp\n")
    (tmp_path / "fleetops" / "b.py").write_text(
        "from .plans import shards as sp\nimport json as js\n"
    )
    assert dict(aliases(tmp_path)) == {
        "sp": {"fleetops.plans.slurm", "fleetops.plans.shards"},
        "js": {"json"},
    }


PRIVATE_IMPORT = re.compile(r"\bimport\s+\(?[^)\n]*\b_[A-Za-z]|\bimport\s+\([^)]*\b_[A-Za-z]")


def passed_on(root: Path, parts: tuple[str, ...] = ("fleetops",)) -> list[str]:
    """`from <a module of ours> import _name` where the importing module never uses _name: kept
    importable for someone else, a private name living on in a second place."""
    found = []
    for path in python_files(root, parts):
        text = path.read_text(encoding="utf-8")
        if not PRIVATE_IMPORT.search(text):
            continue
        tree = ast.parse(text)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (
                node.level or (node.module or "").startswith(parts)
            ):
                for a in node.names:
                    name = a.asname or a.name
                    if a.name.startswith("_") and not a.name.startswith("__") and name not in used:
                        found.append(f"{path.relative_to(root)}:{node.lineno} {a.name}")
    return found


def test_no_private_name_is_imported_only_to_be_passed_on():
    assert passed_on(REPO) == []
    exported = re.compile(r"__all__\s*=\s*\[[^\]]*[\'\"]_[A-Za-z]")
    # the reporter's facade: its parts' private names stay theirs
    report = python_files(REPO, ("fleetops/report",))
    assert [p.name for p in report if exported.search(p.read_text(encoding="utf-8"))] == []


def test_the_pass_on_check_sees_it(tmp_path):
    (tmp_path / "fleetops").mkdir()
    (tmp_path / "fleetops" / "a.py").write_text(
        "from .b import _kept, _used\n_used()\n__all__ = ['_kept']\n"
    )
    assert passed_on(tmp_path) == ["fleetops/a.py:1 _kept"]


def cited_test_files(root: Path, files: list[str]) -> list[str]:
    """Test modules named in the project's files (code, docs, scripts) that are not in tests/."""
    # a pattern such as test_client_matrix_py3XX.py is no name
    name = re.compile(r"\b(test_[A-Za-z0-9_]+\.py)\b")
    missing = []
    for rel in files:
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        missing += [
            f"{rel}: {m}"
            for m in sorted(set(name.findall(text)))
            if "XX" not in m and not (root / "tests" / m).is_file()
        ]
    return missing


# The changelog is history (it names test files of their day); these tests write test modules of
# their own.
NOT_CITING = {
    "CHANGELOG.md",
    "tests/test_no_silent_skip.py",
    "tests/test_suite_tiers.py",
    "tests/test_names_units.py",
}


def test_every_test_file_cited_exists():
    files = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert cited_test_files(REPO, [f for f in files if f not in NOT_CITING]) == []


def test_the_citation_check_sees_a_missing_file(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_real.py").write_text("")
    (tmp_path / "notes.md").write_text("see tests/test_real.py and test_client_matrix.py\n")
    assert cited_test_files(tmp_path, ["notes.md"]) == ["notes.md: test_client_matrix.py"]
