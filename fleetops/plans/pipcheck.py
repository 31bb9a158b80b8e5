"""`pip check` on the client, from what a node's agent read (remote_scripts/core/dists.py): each
installed distribution's Requires-Dist, its marker evaluated against the node's interpreter (with no
extra asked for, as pip checks them), and its version specifier against the installed version
(pre-releases allowed, as pip does). Pure: no network, no printing.

The answer is the node's text: its cost to the client is bounded before packaging parses any of it.
A real venv's Requires-Dist lines are short (vLLM's whole venv: a few thousand, none over ~150
characters, a few `and`s); packaging's marker parser costs ~0.4 ms per KiB and recurses per
parenthesis, so a line of a hundred thousand clauses, or tens of thousands of long ones, would cost
seconds of CPU per answer. An answer past a bound is not checked at all, and the one line saying so
names the bound (Refused)."""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

MAX_DISTS = 5000  # installed distributions per answer
MAX_REQUIREMENTS = 20000  # Requires-Dist lines per answer, all distributions together
MAX_REQUIREMENT_CHARS = 1024  # one Requires-Dist line
MAX_TOTAL_CHARS = 1 << 20  # every Requires-Dist line of the answer together
MAX_CLAUSES = 32  # `and` / `or` in one marker
MAX_DEPTH = 16  # parentheses in one marker (packaging's parser recurses on each)
MAX_CPU_S = 0.5  # this thread's CPU for one answer, whatever the bounds above let through

_CLAUSE = re.compile(r"\b(?:and|or)\b")
# many hosts run one venv image: one evaluation per answer's content
_MEMO: dict[str, list[str]] = {}


class Refused(ValueError):
    """The answer is past a cost bound: the check was not done; str() says which bound, in one
    line."""


def unmet(answer: dict[str, Any]) -> list[str]:
    """Each requirement an installed distribution has that the others do not meet, as pip check
    words it ("vllm 0.17.0 requires torch==2.10.0, but you have torch 2.9.1"); [] when every one is
    met."""
    dists = _bounded(answer)
    key = hashlib.sha256(json.dumps(answer, sort_keys=True, default=str).encode()).hexdigest()
    if key not in _MEMO:
        if len(_MEMO) > 64:
            _MEMO.clear()
        _MEMO[key] = _unmet(answer, dists)
    return list(_MEMO[key])


def _bounded(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The answer's distributions, each bound checked on the raw text before anything parses it;
    Refused."""
    raw = answer.get("dists")
    dists = (
        [d for d in raw if isinstance(d, dict) and d.get("name")] if isinstance(raw, list) else []
    )
    if len(dists) > MAX_DISTS:
        raise Refused(
            f"the node lists {len(dists)} distributions (at most {MAX_DISTS} are checked)"
        )
    count = total = 0
    for dist in dists:
        requires = dist.get("requires") or []
        if not isinstance(requires, list):
            raise Refused(
                f"a distribution's requirements are not a list ({type(requires).__name__})"
            )
        count += len(requires)
        if count > MAX_REQUIREMENTS:
            raise Refused(f"the node lists over {MAX_REQUIREMENTS} requirements")
        for text in requires:
            size = len(str(text))
            total += size
            if size > MAX_REQUIREMENT_CHARS:
                raise Refused(
                    f"a requirement of {size} characters (at most {MAX_REQUIREMENT_CHARS} are read)"
                )
            if total > MAX_TOTAL_CHARS:
                raise Refused(f"the requirements exceed {MAX_TOTAL_CHARS} characters together")
            _check_marker_shape(str(text))
    return dists


def _check_marker_shape(text: str) -> None:
    clauses = len(_CLAUSE.findall(text)) + 1
    if clauses > MAX_CLAUSES:
        raise Refused(
            f"a requirement whose marker joins {clauses} clauses by and/or (at most "
            f"{MAX_CLAUSES} are read)"
        )
    depth = deepest = 0
    for char in text:
        if char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
    if deepest > MAX_DEPTH:
        raise Refused(
            f"a requirement nested {deepest} parentheses deep (at most {MAX_DEPTH} are read)"
        )


def _unmet(answer: dict[str, Any], dists: list[dict[str, Any]]) -> list[str]:
    env = {str(k): str(v) for k, v in (answer.get("environment") or {}).items()}
    installed: dict[str, str] = {
        canonicalize_name(str(d["name"])): str(d.get("version") or "") for d in dists
    }
    out: list[str] = []
    # this thread's: other hosts' threads share the process
    deadline = time.thread_time() + MAX_CPU_S
    for dist in sorted(dists, key=lambda d: canonicalize_name(str(d["name"]))):
        who = f"{dist['name']} {dist.get('version') or '?'}"
        for text in dist.get("requires") or []:
            if time.thread_time() > deadline:
                raise Refused(f"the check took over {MAX_CPU_S}s of CPU (stopped at {who})")
            problem = _problem(str(text), env, installed)
            if problem:
                out.append(f"{who} requires {problem}")
    return out


def _problem(text: str, env: dict[str, str], installed: dict[str, str]) -> str | None:
    try:
        req = Requirement(text)
    except InvalidRequirement:
        return None  # pip check skips what it cannot parse, too
    if req.marker is not None:
        try:
            if not req.marker.evaluate({**env, "extra": ""}):
                return None
        except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
            return None
    have = installed.get(canonicalize_name(req.name))
    if have is None:
        return f"{req.name}, which is not installed"
    if not req.specifier:
        return None
    try:
        ok = req.specifier.contains(Version(have), prereleases=True)
    except InvalidVersion:
        return None
    return None if ok else f"{req.name}{req.specifier}, but you have {req.name} {have}"
