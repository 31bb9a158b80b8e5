"""Report files a run writes beside its terminal output (--metrics, --junit): whole or not at
all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """`text` at `path`, whole or not at all: written to a temp file beside it, flushed to disk,
    then renamed over it (a collector reading meanwhile sees the old file or the new one). Readable
    by all, as collectors need."""
    path = Path(path)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
