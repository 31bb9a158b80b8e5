"""Values the inventory marks secret (tokens, key passphrases). They are used, never shown: everything
fleetops prints, writes as JSON or appends to the audit log goes through redact()."""

from __future__ import annotations

import threading

MASK = "[secret]"
_lock = threading.Lock()
_values: set[str] = set()


def register(value: str) -> str:
    if value and len(value) >= 4:  # shorter values would mask ordinary text everywhere
        with _lock:
            _values.add(value)
    return value


def redact(text: str) -> str:
    if not _values or not text:
        return text
    with _lock:
        values = sorted(_values, key=len, reverse=True)
    for value in values:
        if value in text:
            text = text.replace(value, MASK)
    return text


class RedactingStream:
    """A file-like wrapper for the console: masks secrets in whatever is written through it."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(redact(text))

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)
