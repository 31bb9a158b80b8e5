"""Cyclomatic complexity as radon counts it, for every function in fleetops/ and remote_scripts/:
none above BOUND but those in ALLOWED, and an entry there only shrinks.

ruff's C901 (mccabe) counts statements only. radon also counts each extra operand of `and`/`or`,
each inline `if ... else` and each comprehension clause, so a bound met by packing branches into
expressions still shows here. The counter is radon 6's ComplexityVisitor written again on `ast`: the
bound needs no extra dependency; where radon is installed, a test checks that both agree on every
function of the tree."""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest
from conftest import REPO

BOUND = 15
ROOTS = ("fleetops", "remote_scripts")

# Functions above BOUND today, with their count. An entry goes when its function is brought to
# BOUND or below, and is lowered when its function shrinks: the test fails until it is.
ALLOWED: dict[str, int] = {
    "remote_scripts/core/bootstrap.py::_walk": 20,
    "remote_scripts/core/bootstrap.py::main": 19,
}


def _match_points(node: ast.Match) -> int:
    # radon: one per case, less one when a case catches everything (`case _:` or `case name:`).
    catch_all = any(
        isinstance(case.pattern, ast.MatchAs) and case.pattern.pattern is None
        for case in node.cases
    )
    return max(0, len(node.cases) - catch_all)


# The decision points each kind of node adds by itself, as radon counts them. radon counts neither
# `finally`, nor `with`, nor `try ... except*`, nor a `match` guard by itself.
_POINTS: dict[type[ast.AST], Callable[[Any], int]] = {
    ast.Try: lambda node: len(node.handlers) + bool(node.orelse),
    ast.BoolOp: lambda node: len(node.values) - 1,
    ast.If: lambda node: 1,
    ast.IfExp: lambda node: 1,
    ast.Match: _match_points,
    ast.For: lambda node: 1 + bool(node.orelse),
    ast.AsyncFor: lambda node: 1 + bool(node.orelse),
    ast.While: lambda node: 1 + bool(node.orelse),
    ast.comprehension: lambda node: 1 + len(node.ifs),
}


def _points(node: ast.AST) -> int:
    """The decision points in `node` and below it, nested functions and classes left out (they
    are units of their own)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return 0
    if isinstance(node, ast.Assert):
        # radon counts an assert as one and does not look inside it.
        return 1
    own = _POINTS.get(type(node), lambda _: 0)(node)
    return own + sum(_points(child) for child in ast.iter_child_nodes(node))


@dataclass(frozen=True)
class Unit:
    path: str
    qualname: str
    line: int
    column: int
    complexity: int

    @property
    def key(self) -> str:
        return f"{self.path}::{self.qualname}"


def units(tree: ast.AST, path: str, prefix: str = "") -> Iterator[Unit]:
    """Every function and method under `tree`, nested ones included, named `Class.method` or
    `outer.inner`. Decorators and default values count for nobody, as in radon."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + child.name
            count = 1 + sum(_points(statement) for statement in child.body)
            yield Unit(path, name, child.lineno, child.col_offset, count)
            yield from units(child, path, name + ".")
        elif isinstance(child, ast.ClassDef):
            yield from units(child, path, prefix + child.name + ".")
        else:
            yield from units(child, path, prefix)


def source_files() -> list[str]:
    """The .py files under ROOTS, relative to the checkout, not following links (fleetops/agent
    is remote_scripts/ under the wheel's name)."""
    found = []
    for root in ROOTS:
        for directory, _, names in os.walk(REPO / root):
            found += [
                os.path.relpath(os.path.join(directory, name), REPO)
                for name in names
                if name.endswith(".py")
            ]
    return sorted(found)


@cache
def tree_units() -> tuple[Unit, ...]:
    found: list[Unit] = []
    for path in source_files():
        tree = ast.parse((REPO / path).read_text(encoding="utf-8"), filename=path)
        found += units(tree, path)
    return tuple(found)


def measured(all_units: tuple[Unit, ...]) -> dict[str, int]:
    """Each key's count; two functions of one name (a property's getter and setter) share the
    larger."""
    counts: dict[str, int] = {}
    for unit in all_units:
        counts[unit.key] = max(unit.complexity, counts.get(unit.key, 0))
    return counts


def ratchet(counts: dict[str, int], allowed: dict[str, int], bound: int) -> list[str]:
    """What is wrong with `allowed` against the measured `counts`, one line each."""
    problems = [
        f"{key}: {count} > {bound}: split it along its steps (not into expressions)"
        for key, count in sorted(counts.items())
        if count > bound and key not in allowed
    ]
    for key, listed in sorted(allowed.items()):
        count = counts.get(key)
        if count is None:
            problems.append(f"{key}: no such function any more: remove its entry")
        elif count <= bound:
            problems.append(f"{key}: now {count} <= {bound}: remove its entry")
        elif count > listed:
            problems.append(f"{key}: grew from {listed} to {count}: bring it back to {listed}")
        elif count < listed:
            problems.append(f"{key}: shrank from {listed} to {count}: lower its entry to {count}")
    return problems


def test_no_function_above_the_bound_but_the_allowed_and_those_only_shrink():
    counts = measured(tree_units())
    problems = ratchet(counts, ALLOWED, BOUND)
    entries = "".join(
        f'    "{key}": {count},\n' for key, count in sorted(counts.items()) if count > BOUND
    )
    assert not problems, "\n".join(problems) + "\n\nALLOWED as measured now:\n" + entries


def test_the_tree_is_read():
    found = tree_units()
    paths = {unit.path for unit in found}
    assert "fleetops/run.py" in paths and "remote_scripts/ops.py" in paths
    assert not any(path.startswith("fleetops/agent/") for path in paths)
    assert len(found) > 1500


# Each rule of radon's, on the smallest function that shows it: (count, source).
RULES = [
    (1, "def f():\n    return 1"),
    (3, "def f(a, b, c):\n    return a and b or c"),
    (2, "def f(a):\n    return 1 if a else 2"),
    (
        3,
        """
def f(a):
    if a:
        pass
    elif a > 1:
        pass
    else:
        pass""",
    ),
    (4, "def f(xs):\n    return [x for x in xs if x if x > 1]"),
    (3, "def f(xs):\n    return {x: y for x in xs for y in x}"),
    (3, "def f(xs):\n    for x in xs:\n        pass\n    else:\n        pass"),
    (2, "def f(a):\n    while a:\n        pass"),
    (2, "async def f(xs):\n    async for x in xs:\n        pass"),
    (
        4,
        """
def f():
    try:
        pass
    except A:
        pass
    except B:
        pass
    else:
        pass
    finally:
        pass""",
    ),
    (1, "def f(a):\n    with a:\n        pass"),
    (2, "def f(a, b):\n    assert a and (b if a else b)"),
    (
        3,
        """
def f(a):
    match a:
        case 1:
            pass
        case 2:
            pass
        case _:
            pass""",
    ),
    (
        3,
        """
def f(a):
    match a:
        case 1:
            pass
        case [x]:
            pass""",
    ),
    (2, "def f(a):\n    g = lambda: 1 if a else 2\n    return g"),
    (1, "@d(1 if a else 2)\ndef f(b=1 if a else 2):\n    pass"),
    (2, "def f(a):\n    if a:\n        def g(b):\n            return b or a\n    return a"),
]


@pytest.mark.parametrize(("expected", "source"), RULES)
def test_the_counter_counts_as_radon(expected, source):
    assert [unit.complexity for unit in units(ast.parse(source), "m.py")][0] == expected


def test_nested_functions_and_methods_are_units_of_their_own_with_their_names():
    source = (
        "class C:\n"
        "    def m(self, a):\n"
        "        def inner(b):\n"
        "            return b and a\n"
        "        return inner if a else None\n"
        "    class D:\n"
        "        def n(self):\n"
        "            pass\n"
        "def f():\n"
        "    class E:\n"
        "        def o(self, a):\n"
        "            return a or 1\n"
        "    return E\n"
    )
    found = {unit.key: unit.complexity for unit in units(ast.parse(source), "m.py")}
    assert found == {
        "m.py::C.m": 2,
        "m.py::C.m.inner": 2,
        "m.py::C.D.n": 1,
        "m.py::f": 1,
        "m.py::f.E.o": 2,
    }


def test_the_ratchet_refuses_new_grown_shrunk_and_finished_entries():
    counts = {"a::new": 16, "a::grew": 20, "a::shrank": 17, "a::done": 15, "a::same": 30}
    allowed = {"a::grew": 19, "a::shrank": 18, "a::done": 16, "a::same": 30, "a::gone": 40}
    assert ratchet(counts, allowed, 15) == [
        "a::new: 16 > 15: split it along its steps (not into expressions)",
        "a::done: now 15 <= 15: remove its entry",
        "a::gone: no such function any more: remove its entry",
        "a::grew: grew from 19 to 20: bring it back to 19",
        "a::shrank: shrank from 18 to 17: lower its entry to 17",
    ]
    assert ratchet({"a::same": 30, "a::low": 3}, {"a::same": 30}, 15) == []


def _radon_units(blocks: list[Any], path: str, prefix: str = "") -> Iterator[tuple[str, int]]:
    for block in blocks:
        if not hasattr(block, "closures"):
            continue  # a class: its methods are blocks of their own
        owner = f"{block.classname}." if block.classname else prefix
        name = owner + block.name
        yield f"{path}::{name}@{block.lineno}:{block.col_offset}", block.complexity
        yield from _radon_units(block.closures, path, name + ".")


try:
    import radon.complexity as radon_complexity
except ImportError:
    radon_complexity = None

# radon is no dependency of the project, and a skip fails a CI run: the comparison is collected only
# where radon is installed (`pip install radon==6.0.1` beside the suite); the rules it would check
# are each pinned above without it.
if radon_complexity is not None:

    def test_the_counter_agrees_with_radon_on_every_function_of_the_tree():
        ours = {f"{u.key}@{u.line}:{u.column}": u.complexity for u in tree_units()}
        theirs: dict[str, int] = {}
        for path in source_files():
            blocks = radon_complexity.cc_visit((REPO / path).read_text(encoding="utf-8"))
            theirs.update(_radon_units(blocks, path))
        assert len(theirs) > 1500
        disagreements = {
            key: (ours.get(key), count) for key, count in theirs.items() if ours.get(key) != count
        }
        assert not disagreements, f"(ours, radon's): {disagreements}"

    @pytest.mark.parametrize(("expected", "source"), RULES)
    def test_radon_counts_each_rule_as_pinned(expected, source):
        assert radon_complexity.cc_visit(source)[0].complexity == expected
