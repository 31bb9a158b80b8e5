"""A playbook's version pins (`requires:`), judged on the client by PEP 440 with `packaging`; the
node only reports what it has installed (remote_scripts/core/dists.py report_versions).

Pre-releases and development releases (`0.17.0rc1`, `0.17.0.dev20260101`) satisfy a pin only when
the pin names one itself (`vllm==0.17.0rc1`) or the playbook says `allow_prereleases: true`: a
nightly never passes a pin meant for the release."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ..agent.core.protocol import REFUSED


@dataclass(frozen=True)
class Pin:
    """One entry of `requires:`: a distribution name and its version clauses."""

    text: str
    package: str
    specifier: SpecifierSet

    def to_request(self) -> dict[str, Any]:
        return {"requirement": self.text, "package": self.package}


# PEP 508's name; the rest is handed to SpecifierSet. Not packaging.requirements: its markers import
# `platform` at every start-up, for a grammar (extras, URLs, markers) a pin has no use for.
_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(.*?)\s*", re.S)


def parse_pin(text: str) -> Pin:
    """The pin `text` names (`vllm==0.16.*`, `torch>=2.9,<2.10`); ValueError saying what is
    wrong."""
    match = _NAME.fullmatch(text)
    if match is None:
        raise ValueError(f"requirement {text!r} does not start with a package name")
    name, clauses = match.groups()
    if any(c in clauses for c in "[@;"):
        raise ValueError(
            f"requirement {text!r}: a pin is a package "
            "name and version clauses only (no extras, URL "
            "or environment marker)"
        )
    try:
        specifier = SpecifierSet(clauses)
    except InvalidSpecifier as exc:
        raise ValueError(
            f"requirement {text!r}: {clauses!r} is not a list of PEP 440 version clauses "
            f"({' '.join(str(exc).split())})"
        ) from None
    return Pin(text, name, specifier)


def verdict(pin: Pin, found: str | None, allow_prereleases: bool) -> tuple[bool, str]:
    """(satisfied, why not: "" when it is) for the version a node reports (None: not installed).
    Every clause must hold: `===` compares the very string (case aside), every other clause the
    parsed version."""
    if found is None:
        return False, "not installed"
    clauses = list(pin.specifier)
    # Explicit, never packaging's default: packaging 26 changed what prereleases=None means for one
    # version.
    named = any(spec.prereleases for spec in clauses)  # `==0.17.0rc1` names a pre-release itself
    allowed = allow_prereleases or named
    try:
        version: Version | None = Version(found)
    except InvalidVersion:
        version = None
    if any(s.operator == "===" and s.version.lower() != found.lower() for s in clauses):
        return False, "" if version is not None else f"{found} is not a PEP 440 version"
    ranged = SpecifierSet(",".join(str(s) for s in clauses if s.operator != "==="))
    if version is None:
        ok = not len(ranged)  # only `===` clauses can hold for a string PEP 440 cannot read
        return ok, "" if ok else f"{found} is not a PEP 440 version"
    return _in_range(ranged, version, found, allowed)


def _in_range(
    ranged: SpecifierSet, version: Version, found: str, allowed: bool
) -> tuple[bool, str]:
    """The version against the pin's range clauses; a pre-release the range would hold when
    pre-releases are allowed says so."""
    if ranged.contains(version, prereleases=allowed):
        return True, ""
    if version.is_prerelease and ranged.contains(version, prereleases=True):
        kind = "a development release" if version.is_devrelease else "a pre-release"
        return False, f"{found} is {kind}: the playbook accepts one with allow_prereleases: true"
    return False, ""


# Patch releases per minor release offered for approval in advance: vLLM's and torch's stay well
# below it.
PATCH_RELEASES = 21


def approvable(pin: Pin, allow_prereleases: bool) -> list[str]:
    """Version strings the node may patch on without asking first, each one judged here: the
    versions the pin itself names, and the releases X.Y.0 ... X.Y.20 of the minor release it names
    and the next (`==0.16.*`, `>=0.16,<0.17`). Any other installed version (a local `+cu128`, a
    nightly) is reported back and judged before the patch is sent again; an empty list means: ask
    for the installed version first."""
    forms: set[str] = set()
    for spec in pin.specifier:
        text = spec.version.removesuffix(".*")
        forms.add(text)
        try:
            release = Version(text).release
        except InvalidVersion:  # `===` an arbitrary string
            continue
        major, minor = (release + (0,))[:2]
        forms.update(f"{major}.{m}.{k}" for m in (minor, minor + 1) for k in range(PATCH_RELEASES))
    return sorted((v for v in forms if verdict(pin, v, allow_prereleases)[0]), key=_order)


def _order(text: str) -> tuple[int, Version, str] | tuple[int, str]:
    try:
        return (0, Version(text), text)  # 0.16 before 0.16.0: equal versions, ordered by their text
    except InvalidVersion:
        return (1, text)


# What the client reads of a node's report of its pins (the node echoes the playbook's own): a
# playbook names a handful, each a few clauses; a longer or malformed text is not parsed
# (SpecifierSet costs ~10 us a clause).
MAX_REPORTED_PINS = 64
MAX_PIN_CHARS = 1024


def judge(reported: list[dict[str, Any]], allow_prereleases: bool) -> list[dict[str, Any]]:
    """The node's report ([{"requirement", "package", "found"}]) with "ok" and "why" for each pin; a
    row past the bounds, or one no pin could be read from, is not met and says why, unparsed."""
    out = []
    for n, row in enumerate(reported):
        text, found = str(row.get("requirement")), row.get("found")
        if n >= MAX_REPORTED_PINS:
            ok, why = False, f"not read: the node reported over {MAX_REPORTED_PINS} pins"
        elif len(text) > MAX_PIN_CHARS or (found is not None and len(str(found)) > MAX_PIN_CHARS):
            ok, why = False, f"not read: over {MAX_PIN_CHARS} characters"
        else:
            try:
                ok, why = verdict(
                    parse_pin(text), None if found is None else str(found), allow_prereleases
                )
            except ValueError:
                ok, why = False, "not read: the node reported no pin this playbook could name"
        out.append({**row, "requirement": text[:MAX_PIN_CHARS], "ok": ok, "why": why})
    return out


def shown(rows: list[dict[str, Any]]) -> list[str]:
    """One evidence line per judged pin: `vllm 0.16.0 (ok)`, `vllm 0.16.0rc1 (want vllm==0.16.0;
    ...)`."""
    return [
        f"{r['package']} {r['found'] or 'not installed'} ("
        + ("ok" if r["ok"] else f"want {r['requirement']}" + (f"; {r['why']}" if r["why"] else ""))
        + ")"
        for r in rows
    ]


def refusal(rows: list[dict[str, Any]], hint: str = "") -> str:
    """The message of a patch refused on its pins."""
    wanted = ", ".join(
        r["requirement"] + (f" ({r['why']})" if r["why"] else "") for r in rows if not r["ok"]
    )
    found = ", ".join(f"{r['package']} {r['found'] or 'not installed'}" for r in rows)
    return f"requirements not met: need {wanted}; found {found}" + (f". {hint}" if hint else "")


def judged_checks(answer: dict[str, Any], allow_prereleases: bool) -> dict[str, Any]:
    """A verify answer (`verify`, preflight's, diagnose's) with its requires item judged here: ok,
    msg and evidence set from the versions the node reported, and the answer's own ok again."""
    items = answer.get("items")
    if not isinstance(items, list):
        return answer
    for item in items:
        if isinstance(item, dict) and item.get("kind") == "requires" and "requirements" in item:
            rows = judge(item["requirements"], allow_prereleases)
            bad = [r["requirement"] for r in rows if not r["ok"]]
            item.update(
                ok=not bad,
                requirements=rows,
                evidence=shown(rows),
                msg="all requirements met"
                if not bad
                else "requirements not met: " + ", ".join(bad),
            )
    answer["ok"] = all(i.get("ok") for i in items if isinstance(i, dict))
    return answer


def judged_patch(answer: dict[str, Any], allow_prereleases: bool, hint: str = "") -> dict[str, Any]:
    """A patch answer that reports the installed versions (check mode, or a patch sent before they
    were judged), judged here: a set whose pins are not met is refused, as one item saying which and
    why."""
    reported = answer.get("requirements")
    if not isinstance(reported, list) or not reported:
        return answer
    rows = judge(reported, allow_prereleases)
    if all(r["ok"] for r in rows):
        return {**answer, "requirements": rows}
    return {
        "ok": False,
        "items": [
            {
                "module": None,
                "status": REFUSED,
                "changed": False,
                "ok": False,
                "msg": refusal(rows, hint),
                "requirements": rows,
            }
        ],
    }
