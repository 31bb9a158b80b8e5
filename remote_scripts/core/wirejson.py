"""JSON for the agent's requests, answers and state files, without `import json`.

`json` imports `re`, and `re` imports `enum`, `functools` and `collections`: about 9 ms of CPU at every agent
start on the lab's node, most of what a steady-state `patch --check` costs beyond starting Python.
The work itself is done by the C accelerator `_json` that `json` uses too (its scanner and one-shot encoder),
so the text is the same as `json.dumps`/`json.loads` give; this module only skips the pure-Python wrappers
that drag `re` in. Where `_json` is missing (a build without it) or its calling convention differs, every
function falls back to `json` itself. Bytes are read as UTF-8 only (json.loads would also take UTF-16/32 and a
BOM): everything the agent reads was written as UTF-8 by fleetops. Stdlib only, like everything the node runs.
"""

from __future__ import annotations

import sys

try:
    from _json import encode_basestring_ascii as _c_escape
    from _json import make_encoder as _c_make_encoder
    from _json import make_scanner as _c_make_scanner
except ImportError:  # pragma: no cover - CPython always has it
    _c_escape = _c_make_encoder = _c_make_scanner = None

_WHITESPACE = " \t\n\r"  # what JSON (and json.loads) allows around a document
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Context:
    """What `_json.make_scanner` reads from a JSONDecoder: json.loads' defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_CONSTANTS.__getitem__)


_scan = None  # the C scanner, made on first use


def _scanner():  # _json's scanner object
    global _scan
    if _scan is None and _c_make_scanner is not None:
        try:
            _scan = _c_make_scanner(_Context())
        except (TypeError, AttributeError):  # pragma: no cover - a _json that wants other attributes
            _scan = None
    return _scan


def _past_whitespace(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    return i


def raw_decode(text: str, idx: int = 0) -> tuple[object, int]:
    """The JSON value that starts at `idx`, after any JSON whitespace (json's raw_decode skips none), and the
    index where it ends; ValueError (a json.JSONDecodeError, as json raises it) when there is none."""
    idx = _past_whitespace(text, idx)
    scan = _scanner()
    if scan is None:  # pragma: no cover
        import json

        return json.JSONDecoder().raw_decode(text, idx)
    try:
        return scan(text, idx)
    except SystemError:
        # _json builds its error from json.decoder's JSONDecodeError, which Python 3.11 and earlier take from
        # sys.modules without importing it: a SystemError where json is not loaded. Any other is not ours.
        if "json.decoder" in sys.modules:
            raise
    except (StopIteration, ValueError):
        pass
    import json  # not JSON: json itself says what is wrong, and where

    return json.JSONDecoder().raw_decode(text, idx)


def loads(data: str | bytes | bytearray) -> object:
    """json.loads for one document: ValueError (a json.JSONDecodeError) for anything else."""
    text = data.decode("utf-8", "surrogatepass") if isinstance(data, (bytes, bytearray)) else data
    value, end = raw_decode(text)
    end = _past_whitespace(text, end)
    if end != len(text):
        import json

        raise json.JSONDecodeError("Extra data", text, end)
    return value


def dumps(obj: object, *, default=None,  # json.dumps' default=
          sort_keys: bool = False, indent: int | None = None) -> str:
    """json.dumps(obj, default=..., sort_keys=..., indent=...) with its other arguments at their defaults."""
    encode = _encoder(default, sort_keys)
    if encode is None or (indent is not None and default is not None):  # the latter: no caller; json's way
        import json

        return json.dumps(obj, default=default, sort_keys=sort_keys, indent=indent)
    if indent is not None:  # state files an operator may read: laid out like json.dumps(indent=...)
        return _indented(obj, 0, " " * indent, encode, sort_keys, set())
    return _flat(obj, encode)


def _flat(obj: object, encode) -> str:  # _json's encoder
    return _c_escape(obj) if isinstance(obj, str) else "".join(encode(obj, 0))


def _encoder(default, sort_keys: bool):  # json.dumps' default=, _json's encoder
    if _c_make_encoder is None:  # pragma: no cover
        return None
    try:
        return _c_make_encoder({}, default or _no_default, _c_escape, None, ": ", ", ", sort_keys, False, True)
    except TypeError:  # pragma: no cover - a _json with another calling convention
        return None


def _indented(obj: object, level: int, step: str, encode, sort_keys: bool, open_: set) -> str:
    # json's indented layout for dicts with string keys and lists; each scalar (and {} / []) by the C encoder.
    # (The C encoder cannot indent: before 3.14 it ignores `indent`.)
    if not isinstance(obj, (dict, list, tuple)) or not obj:
        return _flat(obj, encode)
    if isinstance(obj, dict) and not all(isinstance(k, str) for k in obj):  # keys json turns into strings
        import json

        return json.dumps(obj, sort_keys=sort_keys, indent=len(step)).replace("\n", "\n" + step * level)
    if id(obj) in open_:
        raise ValueError("Circular reference detected")
    open_.add(id(obj))
    inner = step * (level + 1)
    if isinstance(obj, dict):
        items = sorted(obj.items()) if sort_keys else obj.items()
        body = ",\n".join(f"{inner}{_c_escape(k)}: {_indented(v, level + 1, step, encode, sort_keys, open_)}"
                           for k, v in items)
        opening, closing = "{", "}"
    else:
        body = ",\n".join(inner + _indented(v, level + 1, step, encode, sort_keys, open_) for v in obj)
        opening, closing = "[", "]"
    open_.discard(id(obj))
    return f"{opening}\n{body}\n{step * level}{closing}"


def _no_default(obj: object) -> object:
    raise TypeError(f"Object of type {obj.__class__.__name__} is not JSON serializable")
