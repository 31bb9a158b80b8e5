"""capture and rebase: write playbooks from what a node has (the agent's `capture` op reads each
module's current text and its pristine text, proven against the wheel's RECORD sha256;
remote_scripts/patch/capture.py).

capture: the diff pristine → current of each module, written beside the playbook
(`<dir>/<stem>/<file>.diff`, paths `a/<path in site-packages>`), its patch entry added or updated,
`requires:` pinned to the node's versions. rebase: a playbook's hunks tried against the node's
(newer) pristine files; per hunk clean / offset / fuzz / conflict / already upstream; a candidate
playbook only when every hunk applied (fleetops/plans/rebase.py). Both write local files only; the
node is only read."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tempfile
import threading
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from ..plans.localpath import UnsafeName, safe_join, safe_join_relative
from ..plans.playbook import MODULE, Patch, Playbook, load_playbook
from ..plans.yamlsrc import ConfigError, Mapping, load_file
from ..results import EXIT_FAILED, Evidence, Item, Result, Status
from ..results.authoring import Captured, Rebased
from ..wire.connector import Connector
from .declare import HELP_PLAYBOOK, JSON, HostTask, Option
from .plan import Plan, UsageError, agent_error

if TYPE_CHECKING:
    from ..plans import rebase as authoring
    from ..state import RunState

PACKAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,100}")
# PEP 440's characters: it names files and pins
VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}")


class BadAnswer(Exception):
    """The node's capture answer is not what the agent sends: nothing is written from it."""


def _checked_answer(answer: dict, asked: list[str]) -> tuple[list[dict], dict[str, str]]:
    """The answer's items (one per module asked, each asked module at most once) and its versions,
    checked before any of it names a local file or goes into a playbook; BadAnswer says what is
    wrong."""
    items = answer.get("items")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise BadAnswer(f"its items are {type(items).__name__}, not a list of modules")
    seen: set[str] = set()
    for it in items:
        module = it.get("module")
        if module not in asked or module in seen:
            raise BadAnswer(
                f"it answers for module {module!r}, which was "
                f"not asked for (asked: {', '.join(asked)})"
            )
        seen.add(module)
        _check_item(module, it)
    return items, _checked_versions(answer.get("versions", {}))


# The fields of a module the node captured, and their types.
_CAPTURED_FIELDS = (("pristine", str), ("current", str), ("rel", str), ("changed", bool))


def _check_item(module: str, it: dict) -> None:
    """One module's answer: a refusal with its reason, or the captured texts, a safe relative
    path and a package name."""
    if not isinstance(it.get("ok"), bool):
        raise BadAnswer(f"module {module}: 'ok' is {it.get('ok')!r}")
    if not it["ok"]:
        if not isinstance(it.get("msg"), str):
            raise BadAnswer(f"module {module}: refused without a reason")
        return
    for key, kind in _CAPTURED_FIELDS:
        if not isinstance(it.get(key), kind):
            raise BadAnswer(
                f"module {module}: {key!r} is {type(it.get(key)).__name__}, not {kind.__name__}"
            )
    try:
        safe_join_relative(PurePosixPath(), it["rel"], what="file")
    except UnsafeName as exc:
        raise BadAnswer(f"module {module}: {exc}") from None
    if "dist" in it and not (isinstance(it["dist"], str) and PACKAGE.fullmatch(it["dist"])):
        raise BadAnswer(f"module {module}: distribution {it['dist']!r} is not a package name")


def _checked_versions(versions: object) -> dict[str, str]:
    """The answer's versions, each a version number (or None: not installed, left out)."""
    if not isinstance(versions, dict):
        raise BadAnswer(f"its versions are {type(versions).__name__}, not a mapping")
    for name, version in versions.items():
        if version is not None and not (isinstance(version, str) and VERSION.fullmatch(version)):
            raise BadAnswer(f"{name} version {version!r} is not a version number")
    return {str(k): v for k, v in versions.items() if v}


def _bad_answer(host: str, task: str, exc: BadAnswer) -> Result:
    return _failed(
        host,
        task,
        f"the node's capture answer is malformed ({exc}); nothing written. Is {host} "
        "running the fleetops agent? Check the host's python in the inventory",
    )


def _words(value: object) -> list[str]:
    if value in (None, "", [], ()):
        return []
    items = [value] if isinstance(value, str) else list(value)  # type: ignore[call-overload]
    return [w.strip() for item in items for w in str(item).split(",") if w.strip()]


def _local_path(run: RunState, rel: str) -> Path:
    path = Path(rel)
    if not path.is_absolute():
        path = Path.cwd() / rel if (Path.cwd() / rel).parent.is_dir() else run.root / rel
    return path.resolve()


def _claim(plan: Plan, host: str) -> str | None:
    """One node writes one playbook: a second host of the same run is refused (which node's text
    would win?)."""
    with plan.options["lock"]:
        first = plan.options.setdefault("writer", host)
    return None if first == host else first


def _failed(host: str, task: str, msg: str, items: list[Item] | None = None) -> Result:
    return Result(host, task, Status.FAILED, msg, items or [], code=EXIT_FAILED)


# ---------------------------------------------------------------- capture
def _capture_plan(run: RunState, kwargs: dict) -> Plan:
    modules = _words(kwargs.get("module"))
    if not modules:
        raise UsageError(
            "capture needs --module NAME (repeatable, or comma-separated): the module(s) you edited"
        )
    for m in modules:
        if not MODULE.fullmatch(m):
            raise UsageError(f"capture --module {m!r}: not a dotted module name")
    if not kwargs.get("playbook"):
        raise UsageError(
            "capture needs --playbook FILE: the playbook to write (created, or updated in place)"
        )
    pins = _words(kwargs.get("pin"))
    for p in pins:
        if not PACKAGE.fullmatch(p):
            raise UsageError(f"capture --pin {p!r}: not a package name")
    path = _local_path(run, str(kwargs["playbook"]))
    existing_requires: list[str] = []
    if path.exists():
        # a broken playbook stops here (file:line), before any node is read
        book = load_playbook(path)
        existing_requires = book.requires
    elif path.suffix not in (".yaml", ".yml"):
        raise UsageError(f"capture --playbook {path}: name a .yaml file")
    names = pins + [re.split(r"[\s=<>!~]", r.strip(), maxsplit=1)[0] for r in existing_requires]
    request = {"modules": list(dict.fromkeys(modules)), "packages": list(dict.fromkeys(names))}
    return Plan(
        "capture",
        request,
        180,
        None,
        options={"path": path, "pins": pins, "lock": threading.Lock()},
    )


def _diff_names(modules: list[str]) -> dict[str, str]:
    last = [m.rsplit(".", 1)[-1] for m in modules]
    return {
        m: (short if last.count(short) == 1 else m) + ".diff" for m, short in zip(modules, last)
    }


def _run_capture(run: RunState, plan: Plan, node: Connector) -> Result:
    # its plans only when capture or rebase runs: not for the task table
    from ..plans import rebase as authoring

    host = node.host.name
    other = _claim(plan, host)
    if other:
        return _failed(
            host,
            "capture",
            f"not captured: {other} writes {plan.options['path'].name} in this run; "
            f"capture from one node (-H {other})",
        )
    answer, evidence = node.call("capture", plan.request, timeout=plan.timeout)
    if answer.get("error"):
        return agent_error(host, "capture", answer)
    try:
        answered, versions = _checked_answer(answer, plan.request["modules"])
    except BadAnswer as exc:
        return _bad_answer(host, "capture", exc)
    path: Path = plan.options["path"]
    stem = path.stem
    names = _diff_names([i["module"] for i in answered])
    items: list[Item] = []
    diffs: dict[str, str] = {}
    for it in answered:
        if not it["ok"]:
            items.append(Item(it["module"], Status.FAILED, it["msg"], {"file": it.get("file")}))
            continue
        if not it["changed"]:
            items.append(
                Item(
                    it["module"],
                    Status.OK,
                    f"nothing to capture: {it['rel']} is unchanged ({it['pristine_source']})",
                    {"file": it["file"]},
                )
            )
            continue
        text = authoring.unified_diff(it["pristine"], it["current"], it["rel"])
        diffs[it["module"]] = text
        hunks = text.count("\n@@ ")
        items.append(
            Item(
                it["module"],
                Status.CHANGED,
                f"{hunks} hunks → {stem}/{names[it['module']]} (pristine: {it['pristine_source']})",
                {"file": it["file"]},
            )
        )
    if any(i.status is Status.FAILED for i in items):
        result = _failed(
            host,
            "capture",
            "nothing written: a module has no proven pristine bytes (see its line)",
            items,
        )
        result.evidence = evidence
        return result
    if not diffs:
        return Result(
            host,
            "capture",
            Status.OK,
            "nothing written: every module is the wheel's own file",
            items,
        )
    try:
        written = _write_capture(path, answered, versions, diffs, names, plan.options["pins"], host)
    except UnsafeName as exc:
        return _failed(
            host,
            "capture",
            f"nothing written: the node's answer names a file outside "
            f"{path.parent}/{stem}/ ({exc})",
        )
    msg = f"wrote {path.name} and {len(diffs)} diffs in {stem}/ (requires: {', '.join(written)})"
    items += _pin_offers(written, path.name)
    return Result(host, "capture", Status.CHANGED, msg, items, payload=Captured(str(path), written))


def _pin_offers(requires: list[str], playbook: str) -> list[Item]:
    """For each exact pin the written playbook has, the range that would accept its point releases:
    the author chooses (capture and rebase keep the shape a pin has)."""
    from ..plans import rebase as authoring

    offers = [(pin, authoring.series_pin(pin)) for pin in authoring.exact_pins(requires)]
    return [
        Item(
            f"pin {pin}",
            Status.OK,
            f"names one release: a node on a point release of it is refused; to "
            "accept those (verify's checks prove each node), "
            f"write `{series}` in {playbook}'s requires "
            "(capture and rebase keep that shape)",
            {"offer": series},
        )
        for pin, series in offers
        if series
    ]


def _write_capture(
    path: Path,
    answered: list[dict],
    versions: dict[str, str],
    diffs: dict[str, str],
    names: dict[str, str],
    pins: list[str],
    host: str,
) -> list[str]:
    from ..plans import rebase as authoring

    dists = [i["dist"] for i in answered if i["module"] in diffs and i.get("dist")]
    entries: list[dict[str, str]] = []
    existing_requires: list[str] = []
    if path.exists():
        doc = load_file(path)
        existing_requires = [str(r) for r in doc.get("requires", []) or []]
        entries = [
            {str(k): str(v) for k, v in spec.items()} for spec in doc.get("patches", []) or []
        ]
    pin_names = list(
        dict.fromkeys(
            dists
            + pins
            + [re.split(r"[\s=<>!~]", r.strip(), maxsplit=1)[0] for r in existing_requires]
        )
    )
    requires = authoring.pin_requires(existing_requires, versions, pin_names)
    _write_diffs(path, diffs, names, entries)
    if path.exists():
        text = path.read_text(encoding="utf-8")
        text = authoring.replace_top_block(
            text, "requires", authoring.render_requires(requires), after="description"
        )
        text = authoring.replace_top_block(
            text, "patches", authoring.render_patches(entries), after="requires"
        )
    else:
        text = _new_capture_text(path, host, list(diffs), requires, entries)
    _atomic(path, text)
    load_playbook(path)  # what we wrote loads (a ConfigError here is a bug worth its file:line)
    return requires


def _write_diffs(
    path: Path, diffs: dict[str, str], names: dict[str, str], entries: list[dict[str, str]]
) -> None:
    """Each module's diff beside the playbook (path.stem/), its patch entry made or pointed at it
    (a script patch of that module becomes this diff)."""
    # all, before any write
    targets = {m: safe_join(path.parent, path.stem, names[m], what="diff name") for m in diffs}
    (path.parent / path.stem).mkdir(parents=True, exist_ok=True)
    for module, text in diffs.items():
        rel = f"{path.stem}/{names[module]}"
        _atomic(targets[module], text)
        entry = next((e for e in entries if e.get("module") == module), None)
        if entry is None:
            entries.append({"module": module, "diff": rel})
        else:
            entry.pop("script", None)
            entry["diff"] = rel


def _new_capture_text(
    path: Path, host: str, modules: list[str], requires: list[str], entries: list[dict[str, str]]
) -> str:
    """A new playbook for the captured diffs, saying where they come from and what to add."""
    from ..plans import rebase as authoring

    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = [
        f"Captured by `fab -H {host} capture` on {stamp}: each diff is the wheel's pristine "
        f"file (sha256 checked against RECORD) against {host}'s edited file.",
        "Add checks that prove the fix (grep, callsites, "
        "probe), then: fab -H <lab node> patch verify -p "
        f"{path.name}",
    ]
    name = path.stem if re.fullmatch(r"[A-Za-z0-9._-]{1,100}", path.stem) else "captured"
    return authoring.new_playbook_text(
        name,
        f"Captured from {host}: {', '.join(modules)}",
        header,
        requires,
        entries,
        [e["module"] for e in entries],
    )


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------- rebase
def _rebase_plan(run: RunState, kwargs: dict) -> Plan:
    book = run.playbook(kwargs.get("playbook"))
    if not book.patches:
        raise ConfigError(book.path, None, f"playbook {book.name!r} has no patches to rebase")
    fuzz = int(kwargs.get("fuzz", 2) or 0)
    if not 0 <= fuzz <= 3:
        raise UsageError(f"rebase --fuzz {fuzz}: between 0 and 3 context lines")
    names = [re.split(r"[\s=<>!~]", r.strip(), maxsplit=1)[0] for r in book.requires]
    request = {"modules": [p.module for p in book.patches], "packages": names}
    out = _local_path(run, str(kwargs["out"])) if kwargs.get("out") else None
    return Plan(
        "capture", request, 180, book, options={"fuzz": fuzz, "out": out, "lock": threading.Lock()}
    )


def _run_rebase(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host.name
    book = plan.playbook
    assert book is not None
    answer, evidence = node.call("capture", plan.request, timeout=plan.timeout)
    if answer.get("error"):
        return agent_error(host, "rebase", answer)
    try:
        answered, versions = _checked_answer(answer, plan.request["modules"])
        by_module = {i["module"]: i for i in answered}
        missing = [p.module for p in book.patches if not p.script and p.module not in by_module]
        if missing:
            raise BadAnswer(f"no item for {', '.join(missing)}")
    except BadAnswer as exc:
        return _bad_answer(host, "rebase", exc)
    rebased = _rebase_patches(book, by_module, plan.options["fuzz"])
    items = rebased.items
    onto = ", ".join(f"{k} {v}" for k, v in versions.items())
    summary = ", ".join(f"{n} {state}" for state, n in rebased.counts.items())
    data = Rebased(versions, rebased.counts, rebased.records())
    if any(i.status is Status.FAILED for i in items):
        result = Result(
            host,
            "rebase",
            Status.FAILED,
            f"{book.name} onto {onto}: {summary}; no candidate written "
            f"(every hunk must apply; resolve the conflicts shown by hand, then capture)",
            items,
            code=EXIT_FAILED,
            payload=data,
        )
        result.evidence = evidence
        return result
    verdict = _candidate_checks(book, rebased.files, node)
    items += verdict.items
    data = replace(data, checks=verdict.data)
    try:
        with plan.options["lock"]:
            out, review = _write_candidate(
                book, plan.options["out"], rebased.files, by_module, host, versions, rebased.scripts
            )
    except UnsafeName as exc:
        why = (
            f"the node's answer names a file outside {book.path.parent}/ ({exc}); pass --out FILE "
            "to name it yourself"
        )
        return Result(
            host,
            "rebase",
            Status.FAILED,
            f"{book.name}: no candidate written: {why}",
            items,
            code=EXIT_FAILED,
            payload=data,
        )
    except (ConfigError, OSError) as exc:
        return Result(
            host,
            "rebase",
            Status.FAILED,
            f"{book.name}: no candidate written: {exc}",
            items,
            code=EXIT_FAILED,
            payload=data,
        )
    data = replace(data, candidate=str(out), review=review)
    items += _pin_offers(load_playbook(out).requires, out.name)
    items += _review_items(book.requires, out, review, onto)
    return _candidate_result(host, f"{book.name} onto {onto}: {summary}", verdict, out, items, data)


@dataclass
class _Rebasing:
    """What rebasing each patch of a playbook gave: its items, each diff's outcome by module (diff
    name, rel, outcome), how many hunks ended in each state, and the script patches (they go to
    the candidate as they are)."""

    items: list[Item] = field(default_factory=list)
    files: dict[str, tuple[str, str, authoring.FileRebase]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    scripts: list[tuple[str, Path]] = field(default_factory=list)

    def count(self, state: str) -> None:
        self.counts[state] = self.counts.get(state, 0) + 1

    def records(self) -> list[dict]:
        """Each hunk's outcome, as --json shows it."""
        return [
            {
                "diff": f,
                "hunk": h.index + 1,
                "state": h.state,
                "line": h.line,
                "offset": h.offset,
                "fuzz": h.fuzz,
                "shown": h.shown,
            }
            for f, _, o in self.files.values()
            for h in o.hunks
        ]


def _rebase_patches(book: Playbook, by_module: dict[str, dict], fuzz: int) -> _Rebasing:
    """Each diff of the playbook against the node's new pristine file."""
    rebased = _Rebasing()
    for patch in book.patches:
        it = by_module[patch.module]
        name = patch.diff_path.name
        # a transform is not tied to line numbers: it goes to the candidate as it is
        if patch.script:
            rebased.scripts.append((patch.module, patch.diff_path))
            rebased.items.append(
                Item(
                    name,
                    Status.OK,
                    "script patch: nothing to rebase; `patch --check` on "
                    "this node shows what its transform does here",
                )
            )
        elif not it["ok"]:
            rebased.items.append(Item(name, Status.FAILED, it["msg"], {"file": it.get("file")}))
            rebased.count("refused")
        else:
            _rebase_diff(rebased, patch, it, fuzz)
    return rebased


def _rebase_diff(rebased: _Rebasing, patch: Patch, it: dict, fuzz: int) -> None:
    """One diff's hunks against its module's new pristine text: an item per hunk."""
    from ..plans import rebase as authoring

    name = patch.diff_path.name
    outcome = authoring.rebase_file(it["pristine"], patch.hunks, max_fuzz=fuzz)
    rebased.files[patch.module] = (name, it["rel"], outcome)
    status_of = {authoring.CLEAN: Status.OK, authoring.CONFLICT: Status.FAILED}
    for h in outcome.hunks:
        rebased.count(h.state)
        rebased.items.append(
            Item(
                f"{name} hunk {h.index + 1} {h.header.split(' @@')[0]} @@",
                status_of.get(h.state, Status.CHANGED),
                h.describe(),
                {"notes": h.shown} if h.shown else {},
            )
        )


def _review_items(requires: list[str], out: Path, review: list, onto: str) -> list[Item]:
    """The places in the candidate's text that still name the old versions."""
    if not review:
        return []
    return [
        Item(
            "text to review",
            Status.CHANGED,
            f"{len(review)} places in {out.name} still describe "
            f"{', '.join(requires)}: rewrite them for {onto}",
            {"evidence": review},
        )
    ]


def _candidate_result(
    host: str, said: str, verdict: _Verdict, out: Path, items: list[Item], data: Rebased
) -> Result:
    """The candidate written: clean, or not clean with the round to make it so."""
    rel = shlex.quote(os.path.relpath(out))
    prove = f"fab -H {shlex.quote(host)} patch verify -p {rel}"
    if verdict.clean:
        return Result(
            host,
            "rebase",
            Status.CHANGED,
            f"{said}, {verdict.summary}; clean; candidate {out.name} written: prove it with "
            f"{prove}",
            items,
            payload=data,
        )
    result = Result(
        host,
        "rebase",
        Status.FAILED,
        f"{said}; hunks clean, {verdict.summary}; candidate "
        f"{out.name} written, not clean: on a lab node with these versions patch with it (fab -H "
        f"{shlex.quote(host)} patch -p {rel}), fix those calls in the node's files, capture them "
        f"(fab -H {shlex.quote(host)} capture --module M -p {rel}), then {prove}",
        items,
        code=EXIT_FAILED,
        payload=data,
    )
    result.evidence = verdict.evidence
    return result


class _Verdict:
    """What the candidate's callsites and probe checks said on the node, against its installed
    packages."""

    def __init__(self) -> None:
        self.items: list[Item] = []
        self.data: list[dict] = []
        self.calls: list[str] = []
        self.problems: list[str] = []
        self.evidence: Evidence | None = None

    @property
    def clean(self) -> bool:
        return not self.calls and not self.problems

    @property
    def summary(self) -> str:
        if not self.data:
            return "no callsites or probe check in the playbook to run on the candidate"
        parts = []
        if self.calls:
            n = len(self.calls)
            parts.append(
                f"{n} call{'s' if n != 1 else ''} no longer bind{'s' if n == 1 else ''}: "
                + "; ".join(self.calls)
            )
        parts += self.problems
        names = ", ".join(d["name"] for d in self.data)
        return "; ".join(parts) if parts else f"the candidate's {names} pass on the node's packages"


def _candidate_checks(book, files: dict, node: Connector) -> _Verdict:
    """The playbook's callsites and probe checks run on the node against the candidate's text of
    each module (the node's installed packages, the candidate's files): do the calls still bind on
    the new versions?"""
    verdict = _Verdict()
    checks = [c for c in book.checks if c["kind"] in ("callsites", "probe")]
    if not checks:
        return verdict
    sources = {module: outcome.text for module, (_, _, outcome) in files.items()}
    answer, evidence = node.call(
        "verify", {"requires": [], "checks": checks, "sources": sources}, timeout=900
    )
    if answer.get("error"):
        verdict.problems.append(f"the candidate's checks could not run: {answer['error']}")
        verdict.evidence = evidence
        return verdict
    for raw in answer.get("items") or []:
        _add_candidate_check(verdict, raw)
    return verdict


def _add_candidate_check(verdict: _Verdict, raw: dict) -> None:
    """One check's answer on the candidate: its item, and the calls or problem it found."""
    verdict.data.append({k: raw.get(k) for k in ("name", "kind", "ok", "msg", "evidence")})
    # import noise
    shown = ("evidence",) if raw["kind"] == "callsites" else ("evidence", "stderr_tail")
    details = {k: raw[k] for k in shown if raw.get(k) and not raw.get("ok")}
    verdict.items.append(
        Item(
            f"candidate {raw['name']} [{raw['kind']}]",
            Status.OK if raw.get("ok") else Status.FAILED,
            raw.get("msg", ""),
            details,
        )
    )
    if raw.get("ok"):
        return
    if raw["kind"] == "callsites":
        verdict.calls += [_call(e) for e in raw.get("evidence") or []]
    else:
        verdict.problems.append(f"the {raw['kind']} {raw['name']} fails (its line below says how)")


def _call(entry: object) -> str:
    if isinstance(entry, dict) and {"file", "line", "callee", "error"} <= set(entry):
        return (
            f"{str(entry['file']).rsplit('/', 1)[-1]}:{entry['line']} "
            f"{entry['callee']}: {entry['error']}"
        )
    return str(entry)


def _write_candidate(
    book,
    out: Path | None,
    files: dict,
    by_module: dict[str, dict],
    host: str,
    versions: dict[str, str],
    scripts: list[tuple[str, Path]],
) -> tuple[Path, list[str]]:
    """The candidate playbook and its diffs written; returns its path and the lines of it that still
    describe the old versions (to review).

    The candidate is whole in itself, wherever --out puts it: its diffs, and a copy of every script
    it names (patch scripts, probe scripts), in the folder named for it, every path in it relative
    to it. All of it is first written to a staging folder beside it and loaded from there as `patch`
    would load it; only a candidate that loads is moved into place, the playbook file last. On any
    failure nothing is left behind."""
    from ..plans import rebase as authoring

    names = [re.split(r"[\s=<>!~]", r.strip(), maxsplit=1)[0] for r in book.requires]
    requires = authoring.pin_requires(book.requires, versions, names)
    name = "-".join(f"{n}-{versions[n]}" for n in names if n in versions) or f"{book.name}-rebased"
    out = (
        out or safe_join(book.path.parent, f"{name}.yaml", what="candidate playbook name")
    ).absolute()
    if out.resolve() == book.path.resolve():
        raise ConfigError(
            book.path, None, "rebase would overwrite the playbook it reads; pass --out"
        )
    subdir = safe_join(out.parent, out.stem, what="diff folder")
    staged: dict[str, str] = {}  # path inside the candidate's folder -> text
    entries: list[dict[str, str]] = []
    dropped: list[str] = []
    for module, (diff_name, rel, outcome) in files.items():
        pristine = by_module[module]["pristine"]
        if outcome.text == pristine:
            dropped.append(module)  # every hunk already upstream
            continue
        safe_join(subdir, diff_name, what="diff name")
        staged[diff_name] = authoring.unified_diff(pristine, outcome.text, rel)
        entries.append({"module": module, "diff": f"{out.stem}/{diff_name}"})
    # a script the old playbook names -> its name in the candidate's folder
    copies: dict[Path, str] = {}
    for module, path in scripts:
        entries.append({"module": module, "script": f"{out.stem}/{_copied(path, copies, staged)}"})
    text = book.path.read_text(encoding="utf-8")
    text = _probe_scripts_moved(text, book, out.stem, copies, staged)
    text = authoring.replace_scalar(
        text, "name", out.stem if re.fullmatch(r"[A-Za-z0-9._-]{1,100}", out.stem) else name
    )
    text = authoring.replace_top_block(
        text, "requires", authoring.render_requires(requires), after="description"
    )
    if entries:
        text = authoring.replace_top_block(
            text, "patches", authoring.render_patches(entries), after="requires"
        )
    else:
        text = authoring.replace_top_block(text, "patches", "patches: []\n", after="requires")
    text = _retexted(text, book, requires, versions)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (
        f"# Candidate made by `fab -H {host} rebase -p {book.path.name}` on {stamp}: "
        f"{book.name}'s hunks re-applied to the pristine files of "
        f"{', '.join(f'{k} {v}' for k, v in versions.items())}.\n# Not proven yet: run fab -H "
        f"<lab node with these versions> patch verify -p {out.name}\n"
    )
    if dropped:
        header += f"# Already upstream (no patch needed): {', '.join(dropped)}\n"
    stale = authoring.stale_versions(book.requires, versions)
    review = authoring.stale_lines(text, stale)
    if review:
        header += (
            f"# REVIEW: {len(review)} lines below still describe {', '.join(book.requires)} "
            "(`rebase` lists them); rewrite them for these versions, then delete this line.\n"
        )
    _install_candidate(out, header + text, staged)
    return out, authoring.stale_lines(text, stale, first_line=header.count("\n") + 1)


def _copied(path: Path, copies: dict[Path, str], staged: dict[str, str]) -> str:
    """`path` (a script the old playbook names) staged into the candidate's folder under its own
    name (made unique); its name there."""
    path = path.resolve()
    if path not in copies:
        stem, suffix = path.stem, path.suffix
        candidate, n = path.name, 1
        while candidate in staged:
            n += 1
            candidate = f"{stem}-{n}{suffix}"
        staged[candidate] = path.read_text(encoding="utf-8")
        copies[path] = candidate
    return copies[path]


_SCRIPT_LINE = re.compile(r"^(\s*(?:-\s+)?script:\s*)(\S.*?)(\s+#.*)?$")


def _probe_scripts_moved(
    text: str, book, stem: str, copies: dict[Path, str], staged: dict[str, str]
) -> str:
    """The old playbook's text with each probe check's `script:` naming the candidate's copy of it
    (the old path was relative to the old playbook's folder)."""
    from ..plans import rebase as authoring

    doc = load_file(book.path)
    lines = text.splitlines(keepends=True)
    checks = doc.get("verify") if isinstance(doc, dict) else None
    for spec in checks if isinstance(checks, list) else []:
        if (
            not isinstance(spec, dict)
            or spec.get("kind") != "probe"
            or not isinstance(spec.get("script"), str)
        ):
            continue
        line = spec.line_of("script") if isinstance(spec, Mapping) else None
        if line is None or not 0 < line <= len(lines):
            raise ConfigError(
                book.path, None, "a probe check's script line could not be found to rewrite"
            )
        source = (book.path.parent / spec["script"]).resolve()
        m = _SCRIPT_LINE.match(lines[line - 1].rstrip("\r\n"))
        if m is None:
            raise ConfigError(
                book.path,
                line,
                "a probe check's `script:` is not on its own line: the candidate "
                "cannot name its copy; write it as `script: FILE.py`",
            )
        ending = lines[line - 1][len(lines[line - 1].rstrip("\r\n")) :]
        moved = authoring.scalar(f"{stem}/{_copied(source, copies, staged)}")
        lines[line - 1] = f"{m.group(1)}{moved}{m.group(3) or ''}{ending}"
    return "".join(lines)


def _install_candidate(out: Path, text: str, staged: dict[str, str]) -> None:
    """Write the candidate `out` and its folder's files (`staged`: name -> text) through a staging
    folder beside it, loaded there first; then each file moved into place, the playbook file
    last."""
    stage = Path(tempfile.mkdtemp(prefix=f".{out.stem}.rebase-", dir=out.parent))
    try:
        folder = stage / out.stem
        folder.mkdir()
        for rel, body in staged.items():
            (folder / rel).write_text(body, encoding="utf-8")
        (stage / out.name).write_text(text, encoding="utf-8")
        # the candidate as `patch -p` reads it: refused here, nothing written
        load_playbook(stage / out.name)
        final = out.parent / out.stem
        final.mkdir(exist_ok=True)
        for rel in staged:
            os.replace(folder / rel, final / rel)
        os.replace(stage / out.name, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _retexted(text: str, book, requires: list[str], versions: dict[str, str]) -> str:
    """The candidate's own words: requires_hint rewritten for the new pins (the old one advised for
    the old versions), the description marked for review while it names the old ones."""
    from ..plans import rebase as authoring

    hint = (
        f"This playbook patches exactly {', '.join(requires)} (rebased from {book.name}, whose "
        "advice for other versions is not carried over: "
        "say here what a node on other versions should do)."
    )
    text = authoring.replace_top_block(
        text, "requires_hint", f"requires_hint: {json.dumps(hint)}\n", after="requires"
    )
    stale = authoring.stale_versions(book.requires, versions)
    if book.description and authoring.stale_lines(book.description, stale):
        described = f"REVIEW (written for {', '.join(book.requires)}): {book.description}"
        text = authoring.replace_top_block(
            text, "description", f"description: {json.dumps(described)}\n", after="name"
        )
    return text


TASKS = [
    HostTask(
        "capture",
        _capture_plan,
        run=_run_capture,
        writes=True,
        op="capture",
        result=Captured,
        help="The node's edits as a playbook: a diff per module against the wheel's pristine "
        "file (proven by RECORD's\nsha256), written beside the playbook, its patch entry "
        "and requires (pinned to the node's versions).",
        options=(
            Option(
                "module",
                "a module you edited on the node (repeatable, or comma-separated)",
                iterable=True,
            ),
            Option(
                "playbook", "the playbook to write: created, or its patches and requires updated"
            ),
            Option(
                "pin", "also pin these packages to the node's versions, e.g. vllm (comma-separated)"
            ),
            JSON,
        ),
    ),
    HostTask(
        "rebase",
        _rebase_plan,
        run=_run_rebase,
        writes=True,
        op="capture",
        result=Rebased,
        help="Try the playbook's hunks on the node's (newer) pristine files: clean / offset / "
        "fuzz / conflict per hunk;\na candidate playbook only when every hunk applied (then "
        "prove it with patch verify on a lab node).",
        options=(
            Option("playbook", HELP_PLAYBOOK),
            Option(
                "out",
                "the candidate playbook to write (default: named for the node's versions, beside "
                "the playbook)",
            ),
            Option("fuzz", "context lines a hunk may ignore (default 2)", 2, numbers=(0, None)),
            JSON,
        ),
    ),
]
