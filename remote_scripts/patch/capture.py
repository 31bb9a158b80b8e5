"""`capture` and `rebase` on the node: an installed module's current text and its *proven* pristine
text.

Pristine bytes are only ever bytes whose sha256 is the one pip recorded for the file in its
distribution's `*.dist-info/RECORD` (wheelrecord.py). They come, in this order, from:
  1. the installed file itself, when it still has the RECORD hash (nothing was changed);
  2. a file fleetops saved in its state dir's backups/ (any of them whose bytes have the RECORD
     hash);
  3. a wheel: `<state_dir>/wheels/*.whl`, then pip's cache ($PIP_CACHE_DIR or ~/.cache/pip: built
     wheels and the HTTP cache's bodies, which are the downloaded wheels' bytes), the member with
     the RECORD hash. No index is asked: a node that installed from one has the wheel in its pip
     cache (a lab node too: the lab packs its installed files into one, fleetops/lab/wheels.py).
When none of them proves it, the module is refused: a diff against unproven bytes would ship
whatever drift the node has. Stdlib only; reads, never writes.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import zipfile

from ..core.dists import installed_version
from ..core.nodeio import NodeError
from ..core.registry import always, node_op
from ..core.sitemodules import module_file_in_site
from .sitelock import site_root_of
from .wheelrecord import record_sha256

MAX_ZIPS = 4000  # files opened while searching the caches for a wheel (a cache can be large)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _dist_of(record_path: str) -> tuple[str, str]:
    """("speculators", "0.3.0") from .../speculators-0.3.0.dist-info/RECORD."""
    info = os.path.basename(os.path.dirname(record_path))[: -len(".dist-info")]
    name, _, version = info.partition("-")
    return name, version


def _from_backups(state_dir: str | None, want: str) -> str | None:
    base = os.path.join(state_dir, "backups") if state_dir else ""
    try:
        names = sorted(os.listdir(base)) if base else []
    except OSError:
        return None
    for name in names:
        if not name.endswith(".orig"):
            continue
        path = os.path.join(base, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                data = f.read()
        except OSError:
            continue
        if _sha(data) == want:
            return path
    return None


def _cache_dirs(state_dir: str | None) -> list[str]:
    dirs = [os.path.join(state_dir, "wheels")] if state_dir else []
    dirs.append(
        os.environ.get("PIP_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "pip")
    )
    return [d for d in dirs if os.path.isdir(d)]


def _candidates(dirs: list[str], dist: str) -> list[str]:
    """Wheels named for the distribution first, then other zip files (pip's HTTP cache names bodies
    by hash)."""
    named: list[str] = []
    other: list[str] = []
    norm = dist.replace("-", "_").lower()
    for top in dirs:
        for root, _, files in os.walk(top):
            for name in sorted(files):
                path = os.path.join(root, name)
                if name.endswith(".whl"):
                    (
                        named if name.replace("-", "_").lower().startswith(norm + "_") else other
                    ).append(path)
                elif not name.endswith((".json", ".lock")):
                    other.append(path)
    return named + other


def _from_wheels(state_dir: str | None, dist: str, rel: str, want: str) -> tuple[bytes, str] | None:
    opened = 0
    for path in _candidates(_cache_dirs(state_dir), dist):
        try:
            with open(path, "rb") as f:
                if f.read(4) != b"PK\x03\x04":
                    continue
            opened += 1
            if opened > MAX_ZIPS:
                return None
            with zipfile.ZipFile(path) as z:
                try:
                    data = z.read(rel)
                except KeyError:
                    continue
        except (OSError, zipfile.BadZipFile, ValueError):
            continue
        if _sha(data) == want:
            return data, path
    return None


def _no_proof(item: dict, state_dir: str | None, dist: str, version: str, want: str) -> str:
    """Why nothing proves the pristine bytes, and where a wheel would: the places searched are named
    as they are (those that exist), the one to fill is created by the command given (absolute, as
    the node sees it)."""
    searched = _cache_dirs(state_dir)
    wheels = os.path.join(os.path.abspath(state_dir), "wheels") if state_dir else None
    pip_cache = os.environ.get("PIP_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "pip"
    )
    where = (
        ", ".join(searched)
        or f"neither {wheels or '<state_dir>/wheels'} nor the pip cache {pip_cache} exists"
    )
    fill = shlex.quote(wheels or searched[0]) if wheels or searched else "WHEELS_DIR"
    return (
        f"{item['rel']} was changed (sha256 {item['current_sha256'][:12]}, RECORD says "
        f"{want[:12]}) and no pristine copy proves RECORD's bytes: no fleetops backup matches "
        f"and no wheel in the places searched ({where}) holds them. Put the {dist} {version} "
        f"wheel in {fill} on the node: where it reaches a package index, mkdir -p {fill} && "
        f"python3 -m pip download {dist}=={version} --no-deps -d {fill}; with no index, copy the "
        "wheel there from a machine whose pip cache or wheelhouse has it; then capture again"
    )


def read_module(module: str, state_dir: str | None) -> dict:
    """One module: its file, current text, distribution, and proven pristine text (or why there is
    none)."""
    path = module_file_in_site(module)
    root = site_root_of(path)
    rel = os.path.relpath(path, root).replace(os.sep, "/")
    with open(path, "rb") as f:
        current = f.read()
    item: dict = {"module": module, "file": path, "rel": rel, "current_sha256": _sha(current)}
    try:
        item["current"] = current.decode("utf-8")
    except UnicodeDecodeError:
        raise NodeError(f"{path} is not UTF-8 text; cannot diff it") from None
    want, record = record_sha256(root, path)
    if not want or not record:
        return {
            **item,
            "ok": False,
            "msg": f"no *.dist-info/RECORD in {root} lists {rel} with a sha256, so no "
            f"pristine bytes can be proven; refusing",
        }
    dist, version = _dist_of(record)
    item.update({"record": record, "record_sha256": want, "dist": dist, "version": version})
    if item["current_sha256"] == want:
        return {
            **item,
            "ok": True,
            "pristine": item["current"],
            "pristine_source": f"the installed file (its sha256 {want[:12]} is RECORD's)",
            "changed": False,
        }
    backup = _from_backups(state_dir, want)
    if backup:
        with open(backup, "rb") as f:
            data = f.read()
        source = f"fleetops' saved original {backup} (sha256 {want[:12]} = RECORD's)"
    else:
        found = _from_wheels(state_dir, dist, rel, want)
        if not found:
            return {**item, "ok": False, "msg": _no_proof(item, state_dir, dist, version, want)}
        data, wheel = found
        source = (
            f"{os.path.basename(wheel)} in {os.path.dirname(wheel)} (sha256 {want[:12]} = RECORD's)"
        )
    try:
        pristine = data.decode("utf-8")
    except UnicodeDecodeError:
        raise NodeError(f"the pristine {rel} is not UTF-8 text") from None
    return {**item, "ok": True, "pristine": pristine, "pristine_source": source, "changed": True}


@node_op("capture", writes=True, forks=always)
def capture(req: dict) -> dict:
    """Per module the texts and their proof; the versions of the distributions and of the extra
    packages."""
    items = []
    for module in req.get("modules", []):
        try:
            items.append(read_module(module, req.get("state_dir")))
        except NodeError as exc:
            items.append({"module": module, "ok": False, "msg": str(exc)})
        except OSError as exc:
            items.append(
                {"module": module, "ok": False, "msg": f"cannot read {module}: {exc.strerror}"}
            )
    names = [i["dist"] for i in items if i.get("dist")] + list(req.get("packages", []))
    versions = {name: installed_version(name) for name in dict.fromkeys(names)}
    return {"ok": all(i["ok"] for i in items), "items": items, "versions": versions}
