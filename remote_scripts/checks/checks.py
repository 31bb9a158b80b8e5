"""The `verify` checks, all run in one exec on the node. Stdlib only; the node's own packages are
imported only by the checks that must (import, callsites), and only once per exec."""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import time

from ..core.atomicio import ensure_dir, write_json_atomic
from ..core.dists import report_versions
from ..core.nodeio import NodeError, sha256_bytes
from ..core.protocol import ASCII_ALNUM, CHECK_KINDS
from ..core.registry import node_op
from ..core.sitemodules import module_file_in_site
from ..core.statetrust import read_json, trusted_stat

# What each kind of check can and cannot tell you; shown next to every result so nobody mistakes an
# import test for proof that the generator works.
SCOPE = {
    "requires": (
        "the installed package versions satisfy the playbook's constraints",
        "anything about the files' contents",
    ),
    "grep": (
        "the file contains (or lacks) the given text",
        "that the code around it is right, or that it runs",
    ),
    "compile": (
        "the file is valid Python syntax",
        "that names it uses exist or that calls match vLLM's signatures",
    ),
    "import": (
        "the module loads and the attribute exists",
        "that any call inside it matches the installed vLLM; functions run only when called",
    ),
    "callsites": (
        "every call into the named packages binds to the installed signatures, and the listed "
        "attributes exist",
        (
            "runtime values, defaults that change behaviour "
            "silently, or code paths reached dynamically"
        ),
    ),
    "probe": (
        "the behaviour the probe drives, on the real "
        "installed libraries, matches what the playbook expects",
        "anything outside the probe's scenario; no GPU kernels or model weights are exercised",
    ),
}


def _result(check: dict, ok: bool, msg: str, evidence: list | None = None, **extra: object) -> dict:
    proves, cannot = SCOPE[check["kind"]]
    return {
        "name": check.get("name") or check["kind"],
        "kind": check["kind"],
        "ok": ok,
        "msg": msg,
        "evidence": evidence or [],
        "proves": proves,
        "cannot": cannot,
        **extra,
    }


def run_requires(check: dict) -> dict:
    # The node reports what is installed; the client judges it against the pins (PEP 440) and sets
    # ok and msg. Until then the item fails: an answer nobody judged never reads as a pass.
    found = report_versions(check["requires"])
    evidence = [f"{r['package']} {r['found'] or 'not installed'}" for r in found]
    return _result(
        check,
        False,
        "installed versions reported; the client judges them",
        evidence,
        requirements=found,
    )


def code_lines(source: str) -> tuple[list[str], str]:
    """The file's lines as code only (Python's tokenize): comments gone, every string literal
    (docstrings and f-strings' literal parts included) reduced to "", line numbers kept. A file that
    does not tokenize is searched as raw text, and the second value says why ("" when tokenized)."""
    lines, note = _code_lines(source)
    return list(lines), note


# A playbook greps one file a dozen times, and tokenizing it is ~9 ms each: the lines are kept in
# memory per text (the agent serves the whole run, so a file is tokenized once per run, and again
# only if it changed), and in the state dir between runs (_stored_code_lines).
_LINES: dict = {}
_STORED: dict = {}
_KEEP_IN_MEMORY = 8


def _remembered(memo: dict, key: object, make):  # make() -> the value
    if key not in memo:
        if len(memo) >= _KEEP_IN_MEMORY:
            memo.clear()
        memo[key] = make()
    return memo[key]


def forget_code_lines() -> None:
    """Forget the lines kept in memory (what a new agent starts with: only the state dir carries
    over)."""
    _LINES.clear()
    _STORED.clear()


def _code_lines(source: str) -> tuple[tuple[str, ...], str]:
    return _remembered(_LINES, source, lambda: _tokenized_lines(source))


def _tokenized_lines(source: str) -> tuple[tuple[str, ...], str]:
    import io
    import tokenize

    raw = source.splitlines()
    out: list[list[str]] = [[] for _ in raw]
    last_row, last_col = 1, 0
    skip = {tokenize.COMMENT, tokenize.STRING}
    skip |= {getattr(tokenize, n) for n in ("FSTRING_MIDDLE",) if hasattr(tokenize, n)}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            (srow, scol), (erow, ecol) = tok.start, tok.end
            if srow == last_row and scol > last_col and srow - 1 < len(out):
                out[srow - 1].append(" ")  # the gap between tokens on one line
            if srow - 1 < len(out) and tok.type not in (
                tokenize.NL,
                tokenize.NEWLINE,
                tokenize.INDENT,
                tokenize.DEDENT,
                tokenize.ENDMARKER,
                tokenize.COMMENT,
            ):
                if tok.type == tokenize.STRING:
                    out[srow - 1].append('""')
                elif tok.type not in skip:
                    out[srow - 1].append(tok.string)
            last_row, last_col = erow, ecol
    except (tokenize.TokenError, IndentationError, SyntaxError) as exc:
        return tuple(raw), f"the file does not tokenize ({exc}), so its raw text was searched"
    lines = []
    for i, parts in enumerate(out):
        text = "".join(parts)
        indent = raw[i][: len(raw[i]) - len(raw[i].lstrip())]
        lines.append(indent + text.strip() if text.strip() else "")
    return tuple(lines), ""


# A file's code lines, and that it compiles, kept in the state dir between runs: tokenizing and
# compiling the two files a playbook checks was ~30 ms of the ~75 ms of CPU a steady-state `verify
# --kinds grep,compile` cost a node. An entry is used only for the very bytes it was made from, by
# the very agent and Python that made it (its key hashes all three); anything else, or an entry that
# does not parse, is made again. It lives in the state dir, checked like everything fleetops keeps
# there (ours alone, no symlinks).
CODE_CACHE = "cache"
# the state dir of the verify in progress ("" when the request names none)
_STATE_DIR = {"path": ""}
_NAME_START = (ASCII_ALNUM - frozenset("0123456789")) | frozenset("_")
_NAME_CHARS = ASCII_ALNUM | frozenset("_.")


def _fit_for_a_file_name(module: str) -> bool:
    # [A-Za-z_][A-Za-z0-9_.]{0,200}: ASCII only, never a path separator
    return 0 < len(module) <= 201 and module[0] in _NAME_START and _NAME_CHARS.issuperset(module)


def _cache_key(what: str, data: bytes) -> str:
    salt = f"{what} 1\0{sys.version}\0{os.environ.get('FLEETOPS_AGENT_SHA256', '')}\0"
    return sha256_bytes(salt.encode() + data)


def _cache_path(what: str, module: str) -> str:
    """Where `what` about `module` is kept; "" when nothing is (no state dir, or a name unfit for a
    file name)."""
    if not _STATE_DIR["path"] or not _fit_for_a_file_name(module):
        return ""
    return os.path.join(_STATE_DIR["path"], CODE_CACHE, f"{what}.{module}.json")


def _cached(path: str, key: str) -> dict | None:
    # refused like any other untrusted state file
    if not path or trusted_stat(path, want_dir=False) is None:
        return None
    entry = read_json(path, on_corrupt="quarantine")
    return entry if entry is not None and entry.get("key") == key else None


def _keep(path: str, entry: dict) -> None:
    if not path:
        return
    try:
        ensure_dir(os.path.dirname(path))
        write_json_atomic(path, entry, point="check_cache")
    except OSError as exc:  # only the next run's speed depends on it
        print(f"fleetops: could not keep {path}: {exc}", file=sys.stderr)


def _stored_code_lines(source: str, module: str, state_dir: str) -> tuple[tuple[str, ...], str]:
    return _remembered(
        _STORED, (source, module, state_dir), lambda: _kept_code_lines(source, module, state_dir)
    )


def _kept_code_lines(source: str, module: str, state_dir: str) -> tuple[tuple[str, ...], str]:
    path = _cache_path("code-lines", module) if state_dir else ""
    key = _cache_key("code-lines", source.encode("utf-8", "surrogatepass"))
    entry = _cached(path, key) or {}
    lines, note = entry.get("lines"), entry.get("note")
    if (
        isinstance(lines, list)
        and isinstance(note, str)
        and len(lines) == len(source.splitlines())
        and all(isinstance(x, str) for x in lines)
    ):
        return tuple(lines), note
    lines, note = _code_lines(source)
    _keep(path, {"key": key, "module": module, "lines": list(lines), "note": note})
    return lines, note


def run_grep(check: dict) -> dict:
    """A grep check matches code by default: comments and string literals are not searched (a
    comment naming a forbidden symbol is not a call of it, and a comment cannot satisfy a `match`).
    `search: text` searches the raw lines instead."""
    path = module_file_in_site(check["module"])
    with open(path, encoding="utf-8", errors="replace") as f:
        source = f.read()
    raw: list[str] = source.splitlines()
    mode = check.get("search", "code")
    note = ""
    lines: tuple[str, ...] | list[str]
    if mode == "code":
        lines, note = _stored_code_lines(source, check["module"], _STATE_DIR["path"])
    else:
        lines = raw
    # what was searched, in the result's `search`
    where = "code" if mode == "code" and not note else "text"
    try:
        rx = re.compile(check["pattern"])
    except re.error as exc:  # lint compiled it with the client's Python; this node's may be older
        return _result(
            check,
            False,
            f"/{check['pattern']}/ is not a regular expression this node's Python "
            f"{sys.version.split()[0]} reads ({exc}); write it for the oldest Python of the fleet "
            "(docs/playbooks.md, grep patterns)",
            file=path,
        )
    hits = [
        {"line": i + 1, "text": raw[i].strip()} for i, line in enumerate(lines) if rx.search(line)
    ]
    shown = hits[:GREP_KEPT]
    if check["expect"] == "match":
        ok = bool(hits)
        msg = _match_message(check["pattern"], hits, raw if where == "code" else None, rx, path)
    else:
        ok = not hits
        msg = _no_match_message(check["pattern"], hits, path)
    if note:
        msg += f"; {note}"
    return _result(check, ok, msg, shown, file=path, search=where, matches=len(hits))


def _match_message(
    pattern: str, hits: list[dict], raw: list[str] | None, rx: re.Pattern, path: str
) -> str:
    """An `expect: match` grep's message; `raw` (the file's lines, given where code was
    searched) tells a pattern found only in comments or strings."""
    if hits:
        return f"/{pattern}/ found at line {hits[0]['line']}"
    msg = f"/{pattern}/ not found in {path}"
    in_text = [i + 1 for i, line in enumerate(raw or []) if rx.search(line)]
    if in_text:
        msg += f" (only in comments or strings, line {in_text[0]}: they do not count)"
    return msg


def _no_match_message(pattern: str, hits: list[dict], path: str) -> str:
    if not hits:
        return f"/{pattern}/ absent from {os.path.basename(path)}"
    return f"/{pattern}/ must not match but does at line {hits[0]['line']}: {hits[0]['text']}"


GREP_KEPT = 50  # matching lines a grep answers with (the human view shows 5 and counts the rest)


def run_compile(check: dict) -> dict:
    path = module_file_in_site(check["module"])
    with open(path, "rb") as f:
        source = f.read()
    kept, key = (
        _cache_path("compiles", check["module"]),
        _cache_key("compiles", path.encode() + b"\0" + source),
    )
    # only a success is kept: these very bytes compiled, by this Python
    if _cached(kept, key) is None:
        try:
            compile(source, path, "exec", dont_inherit=True)
        except SyntaxError as exc:
            return _result(
                check,
                False,
                f"SyntaxError: {exc.msg} at line {exc.lineno}",
                [{"line": exc.lineno, "text": (exc.text or "").strip()}],
                file=path,
            )
        _keep(kept, {"key": key, "module": check["module"], "compiles": True})
    return _result(check, True, f"{os.path.basename(path)} compiles", file=path)


class CapturedStderr:
    """Catch what imports write to fd 2 (C extensions and loggers included), to show its tail."""

    def __enter__(self) -> CapturedStderr:
        import tempfile

        sys.stderr.flush()
        self.tmp = tempfile.TemporaryFile()
        self.saved = os.dup(2)
        os.dup2(self.tmp.fileno(), 2)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.tmp.seek(0)
        self.text = self.tmp.read().decode("utf-8", "replace")
        self.tmp.close()

    def tail(self, n: int = 15) -> list[str]:
        return self.text.splitlines()[-n:]


def run_import(check: dict) -> dict:
    module, attribute = check["module"], check.get("attribute")
    started = time.monotonic()
    with CapturedStderr() as cap:
        try:
            obj = importlib.import_module(module)
            if attribute:
                for part in attribute.split("."):
                    obj = getattr(obj, part)
            error = None
        except BaseException as exc:  # an import can raise anything, SystemExit included
            import traceback

            error = exc
            tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    took = round(time.monotonic() - started, 2)
    target = f"{module}.{attribute}" if attribute else module
    if error is not None:
        return _result(
            check,
            False,
            f"import {target} failed: {type(error).__name__}: {error}",
            ["".join(tb[-3:]).rstrip()],
            stderr_tail=cap.tail(),
            seconds=took,
        )
    return _result(
        check,
        True,
        f"import {target} ok ({took}s; proves only that the module loads)",
        stderr_tail=cap.tail(5),
        seconds=took,
    )


def run_probe(check: dict) -> dict:
    """Run the playbook's probe script as its own process (it may hang or crash: bound it in time),
    forked from this one when that shares the packages the import/callsites checks already imported
    (probe_fork.py)."""
    import subprocess
    import tempfile

    from .probe_fork import run_script

    request = {"modules": {}, "args": check.get("args", {})}
    for name in check.get("modules", []):
        request["modules"][name] = (check.get("files") or {}).get(name) or module_file_in_site(name)
    # The probe runs from the source in memory; this file (0600, a fresh name) is what its
    # tracebacks name and show their lines from.
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(check["source"])
        script = f.name
    started = time.monotonic()
    try:
        proc = run_script(
            script, json.dumps(request), check.get("timeout", 300), source=check["source"]
        )
    except subprocess.TimeoutExpired as exc:
        tail = exc.stderr or ""
        tail = tail.decode("utf-8", "replace") if isinstance(tail, bytes) else tail
        return _result(
            check,
            False,
            f"probe timed out after {check.get('timeout', 300)}s",
            stderr_tail=tail.splitlines()[-15:],
        )
    finally:
        os.unlink(script)
    took = round(time.monotonic() - started, 2)
    stderr_tail = proc.stderr.splitlines()[-15:]
    try:
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return _result(
            check,
            False,
            f"probe exited {proc.returncode} without a JSON result",
            stderr_tail=stderr_tail,
            exit_code=proc.returncode,
            seconds=took,
        )
    return _result(
        check,
        bool(answer.get("ok")),
        str(answer.get("summary", "")),
        answer.get("evidence", []),
        details=answer.get("details"),
        stderr_tail=stderr_tail if not answer.get("ok") else [],
        exit_code=proc.returncode,
        seconds=took,
    )


def run_callsites(check: dict) -> dict:
    from .callsites import check_callsites

    with CapturedStderr() as cap:
        outcome = check_callsites(check)
    failures = outcome["failures"]
    msg = (
        (
            f"{outcome['calls_checked']} calls into {', '.join(check.get('packages', []))} bind, "
            f"{outcome['attributes_checked']} attributes exist"
        )
        if not failures
        else f"{len(failures)} call sites do not match the installed packages"
    )
    return _result(
        check,
        not failures,
        msg,
        failures,
        stderr_tail=cap.tail() if failures else [],
        calls_checked=outcome["calls_checked"],
        partial=outcome.get("partial", []),
        imports_checked=outcome.get("imports_checked"),
    )


RUNNERS = {
    "requires": run_requires,
    "grep": run_grep,
    "compile": run_compile,
    "import": run_import,
    "callsites": run_callsites,
    "probe": run_probe,
}
# Cheap checks first: an operator sees a grep failure before vLLM's import has even started.
ORDER = {"requires": 0, "grep": 1, "compile": 2, "callsites": 3, "import": 4, "probe": 5}
assert set(RUNNERS) == set(ORDER) == set(CHECK_KINDS), "checks.py and protocol.CHECK_KINDS disagree"


# Checks that run the node's packages: where the playbook requires a package the node does not have
# at all (a node without vLLM), they are not run, and say so, instead of failing on its absence in
# every way they can (a callsites check: one failure per call into it). A package of another version
# is no reason: those checks are what show the difference.
RUNS_PACKAGES = ("import", "callsites", "probe")


def _absent(requires: list[dict]) -> list[dict]:
    return [r for r in report_versions(requires) if r["found"] is None] if requires else []


def _not_run(check: dict, absent: list[dict]) -> dict:
    names = ", ".join(r["package"] for r in absent)
    wanted = ", ".join(r["requirement"] for r in absent)
    return _result(
        check,
        False,
        f"not run: {names} {'is' if len(absent) == 1 else 'are'} not installed for "
        f"{sys.executable} (the playbook requires "
        f"{wanted}); this check runs the installed packages",
        not_run=True,
    )


def imported_modules(checks: list[dict]) -> list[str]:
    """The modules the importing checks name: what they import, or read to import from."""
    names: list[str] = []
    for check in checks:
        if check["kind"] == "import":
            names.append(check["module"])
        elif check["kind"] in ("callsites", "probe"):
            names += [*(check.get("modules") or []), *(check.get("packages") or [])]
    return [n for n in names if isinstance(n, str)]


def _import_path_trusted(checks: list[dict]) -> list[str]:
    """Before any check imports the venv's packages: refused (NodeError) when someone but root and
    the login user may change what they would import (importtrust.py). Ops that import nothing never
    walk."""
    names = imported_modules([c for c in checks if c["kind"] in RUNS_PACKAGES])
    if not names:
        return []
    from ..core.importtrust import check_before_import

    return check_before_import(
        names, "import " + ", ".join(sorted({n.split(".")[0] for n in names}))
    )


IMPORTING_KINDS = ("import", "callsites")  # checks that import the node's packages in-process


def imports_node_packages(req: dict) -> bool:
    """The agent runs such a verify in a forked child: it never holds a module a later request may
    patch."""
    return any(
        isinstance(c, dict) and c.get("kind") in IMPORTING_KINDS for c in req.get("checks") or ()
    )


@node_op("verify", writes=False, forks=imports_node_packages)
def verify(req: dict) -> dict:
    # rebase: the candidate's text of each module, checked in place of the installed file
    if req.get("sources"):
        import shutil
        import tempfile

        where = tempfile.mkdtemp(prefix="fleetops-candidate-")
        try:
            return _verify(req, _candidate_files(req["sources"], where))
        finally:
            shutil.rmtree(where, ignore_errors=True)
    return _verify(req, {})


def _candidate_files(sources: dict, where: str) -> dict:
    """Each module's candidate text as a file named like the installed one (a package's __init__.py
    stays one), in a private temp dir, for the checks that read a module's file (callsites) or load
    it (probe)."""
    files = {}
    for n, (module, text) in enumerate(sorted(sources.items())):
        folder = os.path.join(where, str(n))
        os.mkdir(folder, 0o700)
        path = os.path.join(folder, os.path.basename(module_file_in_site(module)))
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        files[module] = path
    return files


def _verify(req: dict, files: dict) -> dict:
    _STATE_DIR["path"] = str(req.get("state_dir") or "")
    checks = _checks_of(req, files)
    indexed = sorted(enumerate(checks), key=lambda ic: (ORDER[ic[1]["kind"]], ic[0]))
    results: list[dict | None] = [None] * len(checks)
    absent = []
    if any(c["kind"] in RUNS_PACKAGES for c in checks):
        absent = _absent(req.get("requires") or [])
    warnings = [] if absent else _import_path_trusted(checks)
    for i, check in indexed:
        results[i] = _run_check(check, absent)
    items = [r for r in results if r is not None]
    answer: dict = {"ok": all(r["ok"] for r in items), "items": items}
    if warnings:
        answer["warnings"] = warnings
    if req.get("dists"):  # what `pip check` reads; the client evaluates it
        from ..core.dists import installed_dists

        answer["dists"] = installed_dists()
    note = disagreement(items)
    if note:
        answer["disagreement"] = note
    return answer


def _checks_of(req: dict, files: dict) -> list[dict]:
    """The request's checks, those that read a module's file given the candidate files, and the
    requires check first where the request has one."""
    checks = [
        {**c, "files": files} if files and c["kind"] in ("callsites", "probe") else c
        for c in req["checks"]
    ]
    if req.get("requires"):
        checks.insert(0, {"kind": "requires", "name": "requires", "requires": req["requires"]})
    return checks


def _run_check(check: dict, absent: list) -> dict:
    """One check's result with its seconds; a check that raises fails alone."""
    started = time.monotonic()
    try:
        if absent and check["kind"] in RUNS_PACKAGES:
            res = _not_run(check, absent)
        else:
            res = RUNNERS[check["kind"]](check)
    except NodeError as exc:
        res = _result(check, False, str(exc))
    except Exception as exc:  # one broken check must not hide the others
        import traceback

        res = _result(
            check,
            False,
            f"check crashed: {type(exc).__name__}: {exc}",
            [traceback.format_exc().splitlines()[-1]],
        )
    res.setdefault("seconds", round(time.monotonic() - started, 2))
    return res


DISAGREE = "text check disagrees with the behaviour checks"


def disagreement(items: list[dict]) -> str:
    """When every behaviour check (callsites, probe) ran and passed while a text check (grep)
    failed, say so on the failing greps and in the answer: the behaviour checks are the stronger
    evidence."""
    deep = [r for r in items if r["kind"] in ("callsites", "probe")]
    greps = [r for r in items if r["kind"] == "grep" and not r["ok"]]
    if not deep or not greps or not all(r["ok"] for r in deep):
        return ""
    names = ", ".join(r["name"] for r in deep)
    for r in greps:
        r["msg"] += f" ({DISAGREE}: {names} passed; they run the code, this only reads it)"
    return (
        f"{DISAGREE}: {', '.join(r['name'] for r in greps)} failed while {names} passed; the "
        "behaviour checks are the stronger evidence"
    )
