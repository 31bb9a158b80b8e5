"""The sha256 pip recorded for an installed file (`*.dist-info/RECORD`): what proves a restored file
is the wheel's own bytes, independently of anything in fleetops' state dir. Stdlib only."""

from __future__ import annotations

import base64
import os

from ..core.dists import normalize_dist_name


def record_sha256(site_root: str, path: str) -> tuple[str | None, str | None]:
    """(sha256 hex, RECORD path) for `path` inside `site_root`, or (None, None) when no RECORD lists
    it.

    The distribution named like the file's top-level package is read first (one small RECORD); every
    other one only when that finds nothing."""
    rel = os.path.relpath(path, site_root)
    if rel.startswith(".."):
        return None, None
    top = normalize_dist_name(rel.split(os.sep, 1)[0].removesuffix(".py"))
    try:
        infos = sorted(n for n in os.listdir(site_root) if n.endswith(".dist-info"))
    except OSError:
        return None, None
    infos.sort(key=lambda n: normalize_dist_name(n.split("-", 1)[0]) != top)
    want = rel.replace(os.sep, "/") + ","
    for info in infos:
        record = os.path.join(site_root, info, "RECORD")
        try:
            with open(record, encoding="utf-8") as f:
                for line in f:
                    if line.startswith(want):
                        digest = line[len(want) :].rsplit(",", 1)[0]
                        algo, _, b64 = digest.partition("=")
                        if algo != "sha256" or not b64:
                            return None, record
                        # urlsafe base64 without its padding (PEP 376's RECORD)
                        return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex(), record
        except OSError:
            continue
    return None, None
