"""What `pip check` reads, read with the standard library: every distribution installed on sys.path (the first of a
name wins, as importlib.metadata finds it), its version and its Requires-Dist lines, and the values PEP 508
markers are evaluated against on this interpreter. The node only reads; the client parses the requirements and
evaluates them (fleetops/plans/pipcheck.py), so the agent needs no `packaging`."""

from __future__ import annotations

import os
import sys

MAX_METADATA = 1 << 20  # the headers come first; a METADATA larger than this is read only this far


def marker_environment() -> dict:
    """PEP 508's marker variables for this interpreter (what packaging.markers.default_environment() gives)."""
    import platform

    impl = sys.implementation
    version = f"{impl.version.major}.{impl.version.minor}.{impl.version.micro}"
    if impl.version.releaselevel != "final":
        version += impl.version.releaselevel[0] + str(impl.version.serial)
    return {"implementation_name": impl.name, "implementation_version": version, "os_name": os.name,
            "platform_machine": platform.machine(), "platform_release": platform.release(),
            "platform_system": platform.system(), "platform_version": platform.version(),
            "python_full_version": platform.python_version(),
            "platform_python_implementation": platform.python_implementation(),
            "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform}


def _headers(path: str) -> dict:
    """Name, Version and every Requires-Dist of one METADATA file (RFC 822 headers up to the first blank line)."""
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


def _key(name: str) -> str:
    name = name.lower().replace("-", "_").replace(".", "_")
    while "__" in name:
        name = name.replace("__", "_")
    return name


def installed_dists() -> dict:
    """{"environment": marker values, "dists": [{name, version, requires}], "unreadable": [paths]}."""
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
            if not meta["name"] or _key(meta["name"]) in seen:
                continue
            seen.add(_key(meta["name"]))
            dists.append(meta)
    return {"environment": marker_environment(), "dists": dists, "unreadable": unreadable}
