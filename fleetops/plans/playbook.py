"""Playbooks (playbooks/*.yaml): requirements, patches and checks, validated before anything
connects."""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..agent.core.protocol import CHECK_KINDS
from . import unidiff
from .fields import expect_mapping, get_bool, get_int, get_str, get_str_list, reject_unknown
from .versions import Pin, approvable, parse_pin
from .yamlsrc import ConfigError, Mapping, Sequence, load_file, read_capped, read_text_capped

MODULE = re.compile(r"(?=.{1,200}$)[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
ATTRIBUTE = MODULE
TOP_KEYS = {
    "name",
    "description",
    "requires",
    "requires_hint",
    "allow_prereleases",
    "patches",
    "verify",
    "jobs",
}
CHECK_KEYS = {
    "grep": {"name", "kind", "module", "pattern", "expect", "search"},
    "compile": {"name", "kind", "module"},
    "import": {"name", "kind", "module", "attribute"},
    "callsites": {"name", "kind", "modules", "packages", "receivers", "attributes"},
    "probe": {"name", "kind", "script", "modules", "timeout", "args"},
}
PATCH_KEYS = {"module", "diff", "script"}  # each entry of patches:
RECEIVER_KEYS = {"expr", "scope", "type"}  # each entry of a callsites check's receivers:
# "requires" comes from the playbook's requires:, not from verify:.
assert set(CHECK_KEYS) | {"requires"} == set(CHECK_KINDS), (
    "playbook.CHECK_KEYS and protocol.CHECK_KINDS disagree"
)


@dataclass
class Patch:
    module: str
    diff_path: Path  # the diff, or the patch script (script: set)
    hunks: list[unidiff.Hunk]
    # a script patch's source: defines transform(text: str) -> str, run on the node
    script: str = ""

    def to_request(self) -> dict[str, Any]:
        if self.script:
            return {
                "module": self.module,
                "diff_name": self.diff_path.name,
                "hunks": [],
                "script": self.script,
                "script_name": self.diff_path.name,
                "script_sha256": hashlib.sha256(self.script.encode("utf-8")).hexdigest(),
            }
        return {
            "module": self.module,
            "diff_name": self.diff_path.name,
            "hunks": [h.to_request(i) for i, h in enumerate(self.hunks)],
        }


@dataclass
class Playbook:
    name: str
    path: Path
    description: str = ""
    requires: list[str] = field(default_factory=list)
    requires_hint: str = ""
    pins: list[Pin] = field(default_factory=list)  # requires, parsed (PEP 508 / PEP 440)
    # a pre-release or nightly may satisfy requires (plans/versions.py)
    allow_prereleases: bool = False
    patches: list[Patch] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    jobs: dict[str, Mapping] | None = None
    sha256: str = ""

    def patch_request(self, check: bool = False) -> dict[str, Any]:
        """`versions_approved`: per package, the versions judged here in advance that the node may
        patch on (versions.approvable); any other installed version is reported back and judged
        first."""
        approved: dict[str, list[str]] = {}
        for pin in self.pins:  # a package pinned twice: what every one of its pins approves
            mine = approvable(pin, self.allow_prereleases)
            approved[pin.package] = (
                [v for v in approved[pin.package] if v in mine] if pin.package in approved else mine
            )
        return {
            "requires": [p.to_request() for p in self.pins],
            "playbook": self.name,
            "check": check,
            "versions_approved": {name: v for name, v in approved.items() if v},
            "patches": [p.to_request() for p in self.patches],
        }

    def verify_request(self, kinds: set[str] | None = None) -> dict[str, Any]:
        checks = [c for c in self.checks if kinds is None or c["kind"] in kinds]
        return {
            "requires": [p.to_request() for p in self.pins],
            "playbook": self.name,
            "checks": checks,
        }


def load_playbook(path: str | Path) -> Playbook:
    path = Path(path).resolve()
    doc = load_file(path)
    doc = expect_mapping(doc, str(path), 1, "a playbook")
    reject_unknown(doc, TOP_KEYS, "playbook")
    digest = hashlib.sha256(read_capped(path))
    book = Playbook(
        name=get_str(
            doc,
            "name",
            required=True,
            pattern=re.compile(r"[A-Za-z0-9._-]{1,100}"),
            describe="letters, digits, '.', '_' and '-'",
        ),
        path=path,
        description=get_str(doc, "description", default="") or "",
        requires_hint=get_str(doc, "requires_hint", default="") or "",
        allow_prereleases=get_bool(doc, "allow_prereleases"),
    )
    for i, req in enumerate(get_str_list(doc, "requires")):
        try:
            book.pins.append(parse_pin(req))
        except ValueError as exc:
            raise ConfigError(
                path, _item_line(doc, "requires", i), str(exc), _item_column(doc, "requires", i)
            ) from None
        book.requires.append(req)
    for i, spec in enumerate(_list(doc, "patches")):
        spec = expect_mapping(spec, str(path), _item_line(doc, "patches", i), "a patch entry")
        reject_unknown(spec, PATCH_KEYS, "patch")
        module = get_str(
            spec, "module", required=True, pattern=MODULE, describe="a dotted module name"
        )
        if "script" in spec:
            book.patches.append(_script_patch(spec, module, path, digest))
            continue
        diff_path = _relative_file(spec, "diff", path)
        diff_text = read_text_capped(diff_path)
        files = unidiff.parse(diff_text, str(diff_path))
        if len(files) != 1:
            raise spec.error(
                "diff", f"{diff_path.name} touches {len(files)} files; one patch entry = one file"
            )
        digest.update(diff_text.encode("utf-8"))
        book.patches.append(Patch(module, diff_path, files[0].hunks))
    for i, spec in enumerate(_list(doc, "verify")):
        spec = expect_mapping(spec, str(path), _item_line(doc, "verify", i), "a check")
        book.checks.append(_parse_check(spec, path, digest))
    if "jobs" in doc:
        from .jobspec import parse_jobs

        book.jobs = parse_jobs(
            expect_mapping(doc["jobs"], str(path), doc.line_of("jobs"), "'jobs'")
        )
    book.sha256 = digest.hexdigest()
    return book


def _script_patch(spec: Mapping, module: str, path: Path, digest: Any) -> Patch:
    """`script: NAME.py`: a stdlib-only script defining transform(text: str) -> str, run by the node
    on the module's file; refused here when it does not compile or defines no one-argument
    transform."""
    if "diff" in spec:
        raise spec.error("script", "a patch entry names a diff or a script, not both")
    script_path = _relative_file(spec, "script", path)
    source = read_text_capped(script_path)
    try:
        tree = ast.parse(source, str(script_path))
    except SyntaxError as exc:
        raise ConfigError(
            script_path, exc.lineno, f"patch script does not compile: {exc.msg}"
        ) from None
    fn = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "transform"), None
    )
    if (
        fn is None
        or len(fn.args.posonlyargs) + len(fn.args.args) != 1
        or fn.args.vararg
        or fn.args.kwonlyargs
    ):
        raise ConfigError(
            script_path,
            fn.lineno if fn else 1,
            "a patch script must define transform(text: str) -> str at top level, one argument",
        )
    digest.update(source.encode("utf-8"))
    return Patch(module, script_path, [], script=source)


def _list(doc: Mapping, key: str) -> list[Any]:
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise doc.error(key, f"{key!r} must be a list")
    return value


def _item_line(doc: Mapping, key: str, i: int) -> int | None:
    seq = doc.get(key)
    return seq.line_of(i) if isinstance(seq, Sequence) else doc.line_of(key)


def _item_column(doc: Mapping, key: str, i: int) -> int | None:
    seq = doc.get(key)
    return seq.column_of(i) if isinstance(seq, Sequence) else doc.column_of(key)


def _project_root(playbook_path: Path) -> Path:
    for parent in playbook_path.parents:
        if (parent / "fabfile.py").exists():
            return parent.resolve()
    return playbook_path.parent.resolve()


def _relative_file(spec: Mapping, key: str, playbook_path: Path) -> Path:
    rel = get_str(spec, key, required=True)
    target = (playbook_path.parent / rel).resolve()
    roots = {playbook_path.parent.resolve(), _project_root(playbook_path)}
    if not any(target == r or r in target.parents for r in roots):
        raise spec.error(
            key,
            (
                f"{key} {rel!r} points outside the playbook's "
                "directory and project; refusing to read it"
            ),
        )
    if not target.is_file():
        raise spec.error(key, f"file not found: {rel} (looked at {target})")
    return target


def _parse_check(spec: Mapping, path: Path, digest: Any) -> dict[str, Any]:
    kind = get_str(spec, "kind", required=True)
    if kind not in CHECK_KEYS:
        raise spec.error(
            "kind", f"unknown check kind {kind!r} (known: {', '.join(sorted(CHECK_KEYS))})"
        )
    reject_unknown(spec, CHECK_KEYS[kind], f"{kind} check")
    name = get_str(
        spec,
        "name",
        default=kind,
        pattern=re.compile(r"[A-Za-z0-9._ -]{1,80}"),
        describe="a short label",
    )
    check: dict[str, Any] = {"kind": kind, "name": name, "line": spec.line}
    if kind in ("grep", "compile", "import"):
        check["module"] = get_str(
            spec, "module", required=True, pattern=MODULE, describe="a dotted module name"
        )
    if kind == "grep":
        pattern = get_str(spec, "pattern", required=True)
        try:
            re.compile(pattern)
        except re.error as exc:
            raise spec.error("pattern", f"bad regex {pattern!r}: {exc}") from None
        check["pattern"] = pattern
        check["expect"] = get_str(
            spec,
            "expect",
            default="match",
            pattern=re.compile(r"match|absent"),
            describe="'match' or 'absent'",
        )
        # code (default): comments and string literals are not searched; text: the raw lines
        check["search"] = get_str(
            spec,
            "search",
            default="code",
            pattern=re.compile(r"code|text"),
            describe="'code' (comments and strings skipped) or 'text'",
        )
    elif kind == "import":
        check["attribute"] = get_str(
            spec, "attribute", pattern=ATTRIBUTE, describe="a dotted attribute name"
        )
    elif kind == "callsites":
        check["modules"] = get_str_list(
            spec, "modules", pattern=MODULE, describe="a dotted module name"
        )
        check["packages"] = get_str_list(
            spec, "packages", pattern=MODULE, describe="a package name"
        )
        check["attributes"] = get_str_list(
            spec, "attributes", pattern=ATTRIBUTE, describe="a dotted path"
        )
        check["receivers"] = _receivers(spec)
        if not check["modules"]:
            raise spec.error("modules", "a callsites check needs at least one module")
    elif kind == "probe":
        script = _relative_file(spec, "script", path)
        check["script"] = str(script)
        check["source"] = read_text_capped(script)
        digest.update(check["source"].encode("utf-8"))
        check["modules"] = get_str_list(
            spec, "modules", pattern=MODULE, describe="a dotted module name"
        )
        check["timeout"] = get_int(spec, "timeout", default=300, minimum=1, maximum=3600)
        args = spec.get("args", {})
        if not isinstance(args, dict):
            raise spec.error("args", "'args' must be a mapping")
        check["args"] = _plain(args)
    return check


def _receivers(spec: Mapping) -> list[dict[str, Any]]:
    out = []
    for item in spec.get("receivers", []) or []:
        if not isinstance(item, Mapping):
            raise spec.error(
                "receivers", "each receiver is a mapping with expr, type and optional scope"
            )
        reject_unknown(item, RECEIVER_KEYS, "receiver")
        types = item.get("type")
        types = [types] if isinstance(types, str) else types
        if (
            not isinstance(types, list)
            or not types
            or not all(isinstance(t, str) and MODULE.fullmatch(t) for t in types)
        ):
            raise item.error("type", "'type' must be a dotted class path or a list of them")
        out.append(
            {
                "expr": get_str(
                    item, "expr", required=True, pattern=MODULE, describe="like self.executor"
                ),
                "scope": get_str(
                    item, "scope", pattern=MODULE, describe="a class or function name"
                ),
                "type": types,
            }
        )
    return out


def _plain(value: Any) -> Any:
    """YAML nodes → plain JSON-able values (our Mapping subclass carries line data we don't
    ship)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
