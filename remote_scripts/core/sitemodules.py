"""Modules and site-packages: the file a module name loads from, found without importing it, refused
outside this interpreter's site-packages, and the stale bytecode beside a rewritten file. Stdlib
only."""

from __future__ import annotations

import importlib.machinery
import os
import site
import sys

from .nodeio import REQUEST_CACHES, NodeError
from .statetrust import remove_entries


def site_roots() -> list[str]:
    if "" not in _ROOTS:  # once per request (forget_resolved): a patch asks for them once per file
        roots = list(site.getsitepackages())
        try:
            roots.append(site.getusersitepackages())
        except AttributeError:
            pass
        _ROOTS[""] = [os.path.realpath(r) for r in roots]
    return list(_ROOTS[""])


def module_file(name: str) -> str:
    """The file a dotted module name would load from, found without running any package __init__."""
    parts = name.split(".")
    spec = importlib.machinery.PathFinder.find_spec(parts[0])
    for i in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            break
        spec = importlib.machinery.PathFinder.find_spec(
            ".".join(parts[: i + 1]), list(spec.submodule_search_locations)
        )
    else:
        if spec is not None and spec.origin and os.path.isfile(spec.origin):
            return spec.origin
    raise NodeError(f"module {name!r} not found for {sys.executable}", kind="missing_module")


# Resolved once per request (agent._run clears it): a verify names the same two modules in a dozen
# checks, and each resolution is ~0.6 ms of CPU (PathFinder's stats, realpath walks).
RESOLVED: dict[str, str] = {}
_ROOTS: dict[str, list[str]] = {}  # "" → site_roots()
REQUEST_CACHES.extend((RESOLVED, _ROOTS))  # nodeio.forget_resolved clears them


def module_file_in_site(name: str) -> str:
    if name in RESOLVED:
        return RESOLVED[name]
    RESOLVED[name] = _module_file_in_site(name)
    return RESOLVED[name]


def _module_file_in_site(name: str) -> str:
    path = module_file(name)
    real = os.path.realpath(path)
    roots = site_roots()
    if not any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots):
        raise NodeError(
            f"module {name!r} resolves to {real}, outside this interpreter's site-packages "
            f"({', '.join(roots)}); refusing to touch it",
            kind="outside_site",
        )
    if not real.endswith(".py"):
        raise NodeError(
            f"module {name!r} resolves to {real}, not a .py source file", kind="not_source"
        )
    return real


def remove_stale_bytecode(path: str) -> list[str]:
    directory, base = os.path.split(path)
    stem = base[:-3] if base.endswith(".py") else base
    return remove_entries(
        os.path.join(directory, "__pycache__"),
        lambda entry: entry.startswith(stem + ".") and entry.endswith(".pyc"),
    )
