"""Installed distributions, read with the standard library: the version of each package a playbook
pins, and what `pip check` reads: every distribution installed on sys.path (the first of a name
wins, as importlib.metadata finds it), its version and its Requires-Dist lines, and the values PEP
508 markers are evaluated against on this interpreter. The node only reads; the client parses the
requirements and evaluates them (fleetops/plans/versions.py, fleetops/plans/pipcheck.py), so the
agent needs no `packaging`."""

from __future__ import annotations

import os
import sys

from .nodeio import REQUEST_CACHES

MAX_METADATA = 1 << 20  # the headers come first; a METADATA larger than this is read only this far


def marker_environment() -> dict:
    """PEP 508's marker variables for this interpreter (what packaging.markers.default_environment()
    gives)."""
    import platform

    impl = sys.implementation
    version = f"{impl.version.major}.{impl.version.minor}.{impl.version.micro}"
    if impl.version.releaselevel != "final":
        version += impl.version.releaselevel[0] + str(impl.version.serial)
    return {
        "implementation_name": impl.name,
        "implementation_version": version,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def _headers(path: str) -> dict:
    """Name, Version and every Requires-Dist of one METADATA file (RFC 822 headers up to the first
    blank line)."""
    out: dict = {"name": None, "version": None, "requires": []}
    with open(path, "rb") as f:
        text = f.read(MAX_METADATA).decode("utf-8", "replace")
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if not sep or line[:1].isspace():
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "name" and out["name"] is None:
            out["name"] = value
        elif key == "version" and out["version"] is None:
            out["version"] = value
        elif key == "requires-dist":
            out["requires"].append(value)
    return out


# normalized project → version (None: an egg-info), first on sys.path
_DISTS: dict[str, str | None] = {}
REQUEST_CACHES.append(_DISTS)  # found once per request: nodeio.forget_resolved clears it


def normalize_dist_name(name: str) -> str:
    """A distribution's name as wheel and dist-info file names write it: re.sub(r"[-_.]+", "_",
    name).lower() (PEP 503's normalization with "_"), without a regex: it runs for every dist-info
    on sys.path."""
    name = name.lower().replace("-", "_").replace(".", "_")
    while "__" in name:
        name = name.replace("__", "_")
    return name


def installed_version(dist: str) -> str | None:
    """The version of an installed distribution, as importlib.metadata would find it (first on
    sys.path), read from the *.dist-info directory name: no metadata scan, no import of
    importlib.metadata."""
    if not _DISTS:  # one scan of sys.path per request, however many packages it asks about
        _DISTS[""] = None
        for entry in sys.path:
            try:
                names = os.listdir(entry or ".")
            except OSError:
                continue
            for name in names:
                if name.endswith(".dist-info") and "-" in name:
                    project, _, version = name[: -len(".dist-info")].partition("-")
                    _DISTS.setdefault(normalize_dist_name(project), version)
                elif name.endswith(".egg-info"):
                    _DISTS.setdefault(
                        normalize_dist_name(name.split("-")[0].split(".egg")[0]), None
                    )
    want = normalize_dist_name(dist)
    if want not in _DISTS or not want:
        return None
    if _DISTS[want] is None:  # an egg-info first (editable installs, rare): let the library read it
        import importlib.metadata as md

        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None
    return _DISTS[want]


def report_versions(requires: list[dict]) -> list[dict]:
    """Each pin of a playbook's requires ({"requirement": text, "package": name}, parsed by the
    client) with the version installed here ("found": None when the package is not installed)."""
    return [
        {
            "requirement": str(r["requirement"]),
            "package": str(r["package"]),
            "found": installed_version(str(r["package"])),
        }
        for r in requires
    ]


def installed_dists() -> dict:
    """{"environment": marker values, "dists": [{name, version, requires}], "unreadable":
    [paths]}."""
    seen: set = set()
    dists, unreadable = [], []
    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for name in names:
            if not name.endswith(".dist-info"):
                continue
            path = os.path.join(entry or ".", name, "METADATA")
            try:
                meta = _headers(path)
            except OSError:
                unreadable.append(path)
                continue
            if not meta["name"] or normalize_dist_name(meta["name"]) in seen:
                continue
            seen.add(normalize_dist_name(meta["name"]))
            dists.append(meta)
    return {"environment": marker_environment(), "dists": dists, "unreadable": unreadable}
