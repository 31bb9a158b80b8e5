"""`pip check` on the client, from what a node's agent read (remote_scripts/core/dists.py): each installed
distribution's Requires-Dist, its marker evaluated against the node's interpreter (with no extra asked for, as pip
checks them), and its version specifier against the installed version (pre-releases allowed, as pip does). Pure:
no network, no printing."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

_MEMO: dict[str, list[str]] = {}  # many hosts run one venv image: one evaluation per answer's content


def unmet(answer: dict[str, Any]) -> list[str]:
    """Each requirement an installed distribution has that the others do not meet, as pip check words it
    ("vllm 0.17.0 requires torch==2.10.0, but you have torch 2.9.1"); [] when every one is met."""
    key = hashlib.sha256(json.dumps(answer, sort_keys=True, default=str).encode()).hexdigest()
    if key not in _MEMO:
        if len(_MEMO) > 64:
            _MEMO.clear()
        _MEMO[key] = _unmet(answer)
    return list(_MEMO[key])


def _unmet(answer: dict[str, Any]) -> list[str]:
    env = {str(k): str(v) for k, v in (answer.get("environment") or {}).items()}
    dists = [d for d in answer.get("dists") or [] if isinstance(d, dict) and d.get("name")]
    installed = {canonicalize_name(str(d["name"])): str(d.get("version") or "") for d in dists}
    out: list[str] = []
    for dist in sorted(dists, key=lambda d: canonicalize_name(str(d["name"]))):
        who = f"{dist['name']} {dist.get('version') or '?'}"
        for text in dist.get("requires") or []:
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
