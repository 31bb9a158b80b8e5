"""`fab playbook.lint`: every problem of a playbook, each with file:line, without a network or a
node.

What the loader (playbook.py) stops at, one error at a time, lint lists all of: the schema (keys,
kinds, required values), file references (diffs, scripts, probe scripts inside the playbook's
directory or project), regexes that do not compile (grep patterns, a job's progress and failures),
diffs that do not parse or do not touch the file of their module
(`a/speculators/data_generation/custom_worker.py` for `speculators.data_generation.custom_worker`),
and Python scripts (patch scripts and probes) that do not compile; a patch script must define
`transform(text)`. Pure: reads files, prints nothing.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import unidiff
from .playbook import CHECK_KEYS, MODULE, TOP_KEYS, _parse_check, _relative_file, load_playbook
from .versions import parse_pin
from .yamlsrc import ConfigError, Mapping, Sequence, load_file, read_text_capped

PATCH_KEYS = {"module", "diff", "script"}


@dataclass
class Problem:
    path: str
    line: int | None
    kind: str  # schema / file / regex / diff / script / requires
    message: str

    def __str__(self) -> str:
        return (
            f"{self.path}:{self.line}: {self.kind}: {self.message}"
            if self.line
            else f"{self.path}: {self.kind}: {self.message}"
        )


def _from(exc: ConfigError, kind: str) -> Problem:
    return Problem(exc.path, exc.line, kind, exc.message)


def module_paths(module: str) -> tuple[str, str]:
    """The two files a dotted module can be, relative to site-packages."""
    base = module.replace(".", "/")
    return f"{base}.py", f"{base}/__init__.py"


def _diff_target(path: str) -> str:
    """`a/x/y.py` → `x/y.py` (git's and fleetops' prefix); other paths as written."""
    return path[2:] if path[:2] in ("a/", "b/") else path


def lint_diff(diff_path: Path, module: str) -> list[Problem]:
    try:
        text = read_text_capped(diff_path)
    except (OSError, ConfigError) as exc:
        return [Problem(str(diff_path), None, "file", f"cannot read: {exc}")]
    try:
        files = unidiff.parse(text, str(diff_path))
    except ConfigError as exc:
        return [_from(exc, "diff")]
    out: list[Problem] = []
    if len(files) != 1:
        out.append(
            Problem(
                str(diff_path), 1, "diff", f"touches {len(files)} files; one patch entry = one file"
            )
        )
    wanted = module_paths(module)
    heads = [i + 1 for i, x in enumerate(text.split("\n")) if x.startswith("--- ")]
    for f, line in zip(files, heads):
        for side in (f.old_path, f.new_path):
            target = _diff_target(side)
            if target != "/dev/null" and target not in wanted:
                out.append(
                    Problem(
                        str(diff_path),
                        line,
                        "diff",
                        f"patches {target!r}, but its module {module} is "
                        f"{wanted[0]} (or {wanted[1]})",
                    )
                )
                break
    return out


def lint_script(path: Path, need_transform: bool) -> list[Problem]:
    try:
        source = read_text_capped(path)
    except (OSError, ConfigError) as exc:
        return [Problem(str(path), None, "file", f"cannot read: {exc}")]
    try:
        tree = ast.parse(source, str(path))
    except SyntaxError as exc:
        return [Problem(str(path), exc.lineno, "script", f"does not compile: {exc.msg}")]
    if not need_transform:
        return []
    fn = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "transform"), None
    )
    if fn is None:
        return [
            Problem(
                str(path),
                1,
                "script",
                "a patch script must define transform(text: str) -> str at top level",
            )
        ]
    args = fn.args
    if len(args.posonlyargs) + len(args.args) != 1 or args.vararg or args.kwonlyargs:
        return [
            Problem(
                str(path),
                fn.lineno,
                "script",
                "transform must take exactly one argument (the file's text)",
            )
        ]
    return []


def _line(doc: Any, key: Any) -> int | None:
    return doc.line_of(key) if isinstance(doc, (Mapping, Sequence)) else None


def _lint_requires(doc: Mapping, p: str) -> list[Problem]:
    out: list[Problem] = []
    requires = doc.get("requires", [])
    if not isinstance(requires, list):
        out.append(Problem(p, doc.line_of("requires"), "schema", "'requires' must be a list"))
    else:
        for i, req in enumerate(requires):
            try:
                parse_pin(str(req))
            except ValueError as exc:
                out.append(Problem(p, _line(requires, i), "requires", str(exc)))
    if not isinstance(doc.get("allow_prereleases", False), bool):
        out.append(
            Problem(
                p,
                doc.line_of("allow_prereleases"),
                "schema",
                "'allow_prereleases' must be true or false",
            )
        )
    return out


def lint(path: str | Path) -> list[Problem]:
    """Every problem found; [] for a clean playbook."""
    path = Path(path).resolve()
    p = str(path)
    try:
        doc = load_file(path)
    except ConfigError as exc:
        return [_from(exc, "schema")]
    except OSError as exc:
        return [Problem(p, None, "file", f"cannot read: {exc.strerror}")]
    if not isinstance(doc, Mapping):
        return [
            Problem(p, 1, "schema", "a playbook is a mapping (name:, requires:, patches:, verify:)")
        ]
    out: list[Problem] = []
    for key in doc:
        if key not in TOP_KEYS:
            out.append(
                Problem(
                    p,
                    doc.line_of(key),
                    "schema",
                    f"unknown key {key!r} (known: {', '.join(sorted(TOP_KEYS))})",
                )
            )
    if not isinstance(doc.get("name"), str) or not re.fullmatch(
        r"[A-Za-z0-9._-]{1,100}", doc.get("name") or ""
    ):
        out.append(
            Problem(
                p,
                doc.line_of("name"),
                "schema",
                "name: letters, digits, '.', '_' and '-' (required)",
            )
        )
    out += _lint_requires(doc, p)
    out += _lint_patches(doc, path)
    out += _lint_checks(doc, path)
    if "jobs" in doc:
        try:
            from .jobspec import parse_jobs

            if isinstance(doc["jobs"], Mapping):
                parse_jobs(doc["jobs"])
            else:
                out.append(Problem(p, doc.line_of("jobs"), "schema", "'jobs' must be a mapping"))
        except ConfigError as exc:
            out.append(_from(exc, "regex" if "regex" in exc.message else "schema"))
    if not out:  # whatever else the loader refuses, lint reports too (lint is never more lenient)
        try:
            load_playbook(path)
        except ConfigError as exc:
            out.append(_from(exc, "schema"))
    return out


def _entries(
    doc: Mapping, key: str, p: str, not_mapping: str, out: list[Problem]
) -> Iterator[tuple[int | None, Mapping]]:
    """Each mapping of the list under `key`, with its line. A `key` that is not a list, or an entry
    that is not a mapping (`not_mapping` says what it should be), is a schema problem appended to
    `out` as it is met, so the problems keep the playbook's order."""
    items = doc.get(key, [])
    if not isinstance(items, list):
        out.append(Problem(p, doc.line_of(key), "schema", f"'{key}' must be a list"))
        return
    for i, spec in enumerate(items):
        if isinstance(spec, Mapping):
            yield _line(items, i), spec
        else:
            out.append(Problem(p, _line(items, i), "schema", not_mapping))


def _lint_patches(doc: Mapping, path: Path) -> list[Problem]:
    p = str(path)
    out: list[Problem] = []
    for line, spec in _entries(
        doc, "patches", p, "a patch entry is a mapping with module and diff (or script)", out
    ):
        for key in spec:
            if key not in PATCH_KEYS:
                out.append(
                    Problem(
                        p,
                        spec.line_of(key),
                        "schema",
                        f"unknown patch key {key!r} (known: {', '.join(sorted(PATCH_KEYS))})",
                    )
                )
        module = spec.get("module")
        if not isinstance(module, str) or not MODULE.fullmatch(module):
            out.append(
                Problem(
                    p, spec.line_of("module"), "schema", "module: a dotted module name (required)"
                )
            )
            module = None
        kinds = [k for k in ("diff", "script") if k in spec]
        if len(kinds) != 1:
            out.append(
                Problem(p, line, "schema", "a patch entry names exactly one of diff: or script:")
            )
            continue
        try:
            target = _relative_file(spec, kinds[0], path)
        except ConfigError as exc:
            out.append(_from(exc, "file"))
            continue
        if kinds[0] == "diff":
            if module:
                out += lint_diff(target, module)
        else:
            out += lint_script(target, need_transform=True)
    return out


def _lint_checks(doc: Mapping, path: Path) -> list[Problem]:
    p = str(path)
    out: list[Problem] = []
    for _, spec in _entries(doc, "verify", p, "a check is a mapping with name, kind, ...", out):
        try:
            _parse_check(spec, path, hashlib.sha256())
        except ConfigError as exc:
            kind = (
                "regex"
                if "bad regex" in exc.message
                else "file"
                if "file not found" in exc.message or "outside" in exc.message
                else "schema"
            )
            out.append(_from(exc, kind))
            continue
        if spec.get("kind") == "probe" and spec.get("kind") in CHECK_KEYS:
            out += lint_script(_relative_file(spec, "script", path), need_transform=False)
    return out


def lint_report(
    root: str | Path | None, playbook: str | None, default: str, as_json: bool
) -> tuple[str, int]:
    """The text `fab playbook.lint` prints, and its exit status (0 clean, 1 problems, 2 no such
    file)."""
    import json

    rel, path = _playbook_path(root, playbook, default)
    books = sorted([*path.glob("*.yaml"), *path.glob("*.yml")]) if path.is_dir() else [path]
    if not path.exists() or not books or not all(b.is_file() for b in books):
        return f"{rel}: no such playbook (looked at {path}); name one with --playbook", 2
    # a folder is a playbook set: each of its playbooks
    problems = [p for book in books for p in lint(book)]
    status = 1 if problems else 0
    if as_json:
        document = {
            "playbook": str(path),
            "ok": not problems,
            "problems": [vars(x) for x in problems],
        }
        return json.dumps(document, indent=2), status
    if not problems:
        return "\n".join(
            f"{book}: ok (schema, files, regexes, diffs, scripts)" for book in books
        ), status
    return "\n".join(
        [str(x) for x in problems] + [f"{len(problems)} problems in {path.name}"]
    ), status


def _playbook_path(root: str | Path | None, playbook: str | None, default: str) -> tuple[str, Path]:
    """The playbook (or set) as named, and where it is: --playbook, else $FLEETOPS_PLAYBOOK, else
    the default; a relative name from the current directory, else from the project root."""
    import os

    rel = playbook or os.environ.get("FLEETOPS_PLAYBOOK") or default
    path = Path(rel) if Path(rel).is_absolute() else Path.cwd() / rel
    if not path.exists() and root is not None:
        path = Path(root) / rel
    return rel, path
