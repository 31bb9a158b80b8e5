"""What fleetops shows of text it did not write itself: secrets masked, terminal controls made
visible.

Values the inventory or a playbook marks secret (tokens, key passphrases, a job's `secret_env`) are
used, never shown: everything fleetops prints, writes as JSON or appends to the audit log goes
through redact() or dumps(). Text that came from a node or a job (output, errors, file names,
process command lines) goes through printable() before it is printed or logged: a terminal control
in it would otherwise act on the operator's terminal (move the cursor, erase a line and forge
another host's, set the title, write the clipboard with OSC 52, reorder what follows with a bidi
override), and a line break would start a line of its own that reads as another host's result.
shown() is both, in the order that keeps masking whole: mask first (a secret holding a control
character still matches), then escape.

Masking works on values, before anything escapes them: dumps() masks every string of a document
(keys too) and then serializes it, so a secret with quotes, backslashes, non-ASCII or newlines is
masked in JSON output however json escapes it. redact() masks text that is already formatted
(console lines): besides the value itself it knows the forms a value takes when quoted (JSON with
and without ASCII escapes, Python's repr) and, for a multi-line value, each of its lines (a job's
log arrives one line at a time)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from typing import Any

MASK = "[secret]"
MIN_LENGTH = 4  # shorter values would mask ordinary text everywhere
_lock = threading.Lock()
_values: dict[str, frozenset[str]] = {}  # registered value -> the forms redact() replaces
_forms: list[str] = []  # every form of every value, longest first


def _forms_of(value: str) -> frozenset[str]:
    forms = {
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        repr(value)[1:-1],
    }
    if "\n" in value or "\r" in value:
        forms.update(line.strip() for line in value.splitlines())
    return frozenset(f for f in forms if len(f) >= MIN_LENGTH)


def forms(value: str) -> list[str]:
    """The forms of a secret value redact() masks (itself, quoted, each line of a multi-line one),
    longest first: what a node is given to mask in a job's log before it cuts a long line."""
    return (
        sorted(_forms_of(value), key=len, reverse=True)
        if value and len(value) >= MIN_LENGTH
        else []
    )


def register(value: str) -> str:
    if value and len(value) >= MIN_LENGTH:
        forms = _forms_of(value)
        with _lock:
            if value not in _values:
                _values[value] = forms
                _forms[:] = sorted(set(_forms) | forms, key=len, reverse=True)
    return value


def forget(value: str) -> None:
    """Stop masking `value` (tests register throwaway values; a run never needs this)."""
    with _lock:
        if _values.pop(value, None) is not None:
            keep = set().union(*_values.values()) if _values else set()
            _forms[:] = sorted(keep, key=len, reverse=True)


def redact(text: str) -> str:
    if not _forms or not text:
        return text
    with _lock:
        forms = list(_forms)
    for form in forms:
        if form in text:
            text = text.replace(form, MASK)
    return text


# C0 controls but tab (line breaks too: a node's text stays on the line fleetops began for its host,
# so a line that starts with a host's name is always one fleetops wrote), DEL, C1 controls (0x9b is
# CSI on terminals that read 8-bit C1), the bidi embeddings, overrides, isolates and marks, and lone
# surrogates (which no UTF-8 stream can write).
_CONTROLS = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


_NAMED = {"\n": "\\n", "\r": "\\r"}


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every terminal control but tab written as a visible escape (`\\x1b`, `\\x9b`,
    `\\u202e`, and line breaks as `\\n`, `\\r`): it reads as what the node sent, on one line, and
    does nothing to the terminal."""
    if not text or _CONTROLS.search(text) is None:
        return text
    return _CONTROLS.sub(_visible, text)


def shown(text: str) -> str:
    """Text from a node or a job as fleetops shows it: secrets masked, then controls made visible.
    Applied to the data before any layout (tables, folding, truncation), never to fleetops' own
    styled output."""
    return printable(redact(text))


def shown_value(value: Any) -> Any:
    """`value` with shown() applied to every string in it (mapping keys too): a record for the audit
    log."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, dict):
        return {shown_value(k): shown_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [shown_value(v) for v in value]
    return value


def mask(value: Any) -> Any:
    """`value` with every secret masked in every string in it (mapping keys too), before
    serialization. Numbers whose digits hold a secret become masked text; other objects are left to
    the serializer."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {mask(k) if isinstance(k, str) else k: mask(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [mask(v) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and _forms:
        shown = redact(str(value))
        return shown if shown != str(value) else value
    return value


def dumps(value: Any, *, default: Callable[[Any], Any] | None = str, **kwargs: Any) -> str:
    """json.dumps of `value` with secrets masked in the values first: the one way fleetops writes
    JSON that an operator or a log sees (`--json`, the audit log, `history --json`). `default` turns
    other objects into something JSON can hold (str by default); its result is masked too."""

    def fallback(obj: Any) -> Any:
        if default is None:
            raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")
        return mask(default(obj))

    return json.dumps(mask(value), default=fallback, **kwargs)


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
        if name == "rich_proxied_file":
            # rich's live view puts a proxy in sys.stderr that prints above the view; a console
            # reads this name to write past the proxy, straight onto the view (which then could not
            # be erased whole)
            raise AttributeError(name)
        return getattr(self.stream, name)
