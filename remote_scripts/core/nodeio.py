"""What every node operation shares: the operator-facing error, timestamps, hashes, and the reset of
the per-request caches. The rest of the node's I/O sits beside it, one job a module: failpoints,
statetrust (the state dir's StrictModes, reading state back), atomicio (atomic writes), nodelock,
sitemodules, dists (installed versions). Stdlib only."""

from __future__ import annotations

import time


class NodeError(Exception):
    """A refusal or failure with a message meant for the operator."""

    def __init__(self, message: str, kind: str = "error", **details: object) -> None:
        super().__init__(message)
        self.kind = kind
        self.details = details


def now_iso() -> str:
    # not datetime: its import is ~3 ms per agent
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def sha256_bytes(data: bytes) -> str:
    # hashlib (OpenSSL, ~2 ms to load) when a request first hashes: a start that only pings, or
    # asks for versions, never loads it (the bootstrap takes the zip's sha256 from its verdict)
    from hashlib import sha256

    return sha256(data).hexdigest()


# What a module found on this node, kept for one request only (agent._run calls forget_resolved): an
# earlier request (run) may have installed. A module that keeps such a cache adds it here when it is
# imported, so a request that never imported it clears nothing of it.
REQUEST_CACHES: list[dict] = []


def forget_resolved() -> None:
    """What module_file_in_site and installed_version found: kept for one request only."""
    for cache in REQUEST_CACHES:
        cache.clear()
