"""JSON for the agent's requests, answers and state files, without `import json`.

`json` imports `re`, and `re` imports `enum`, `functools` and `collections`: about 9 ms of CPU at every agent
start on the lab's node, most of what a steady-state `patch --check` costs beyond starting Python (issue 16).
The work itself is done by the C accelerator `_json` that `json` uses too (its scanner and one-shot encoder),
so the text is the same as `json.dumps`/`json.loads` give; this module only skips the pure-Python wrappers
that drag `re` in. Where `_json` is missing (another Python implementation) or its calling convention differs,
every function falls back to `json` itself. Stdlib only, like everything the node runs.
"""

from __future__ import annotations

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
    memo: dict = {}


_scan = None  # the C scanner, made on first use


def _scanner():  # noqa: ANN202 - _json's scanner object
    global _scan
    if _scan is None and _c_make_scanner is not None:
        try:
            _scan = _c_make_scanner(_Context())
        except (TypeError, AttributeError):  # pragma: no cover - a _json that wants other attributes
            _scan = None
    return _scan


def raw_decode(text: str, idx: int = 0) -> tuple[object, int]:
    """The JSON value that starts at `idx` (after whitespace) and the index where it ends, as
    json.JSONDecoder().raw_decode does (ValueError, a json.JSONDecodeError, when there is none)."""
    while idx < len(text) and text[idx] in _WHITESPACE:
        idx += 1
    scan = _scanner()
    if scan is None:  # pragma: no cover
        import json

        return json.JSONDecoder().raw_decode(text, idx)
    try:
        return scan(text, idx)
    except (StopIteration, ValueError, SystemError):
        # Not JSON. _json builds its error from json.decoder's JSONDecodeError, which it takes from sys.modules
        # without importing it (a SystemError where json is not loaded): json itself says what is wrong, where.
        import json

        return json.JSONDecoder().raw_decode(text, idx)


def loads(data: str | bytes | bytearray) -> object:
    """json.loads for one document: ValueError (a json.JSONDecodeError) for anything else."""
    text = data.decode("utf-8", "surrogatepass") if isinstance(data, (bytes, bytearray)) else data
    value, end = raw_decode(text)
    while end < len(text) and text[end] in _WHITESPACE:
        end += 1
    if end != len(text):
        import json

        raise json.JSONDecodeError("Extra data", text, end)
    return value


def dumps(obj: object, *, default=None,  # noqa: ANN001 - json.dumps' default=
          sort_keys: bool = False, indent: int | None = None) -> str:
    """json.dumps(obj, default=..., sort_keys=..., indent=...) with its other arguments at their defaults."""
    encode = _encoder(default, sort_keys)
    if encode is None:  # pragma: no cover - no usable _json
        import json

        return json.dumps(obj, default=default, sort_keys=sort_keys, indent=indent)
    if indent is not None:  # state files an operator may read: laid out like json.dumps(indent=...)
        return _indented(obj, 0, " " * indent, encode, sort_keys)
    return _c_escape(obj) if isinstance(obj, str) else "".join(encode(obj, 0))


def _encoder(default, sort_keys: bool):  # noqa: ANN001, ANN202 - json.dumps' default=, _json's encoder
    if _c_make_encoder is None:  # pragma: no cover
        return None
    try:
        return _c_make_encoder({}, default or _no_default, _c_escape, None, ": ", ", ", sort_keys, False, True)
    except TypeError:  # pragma: no cover - a _json with another calling convention
        return None


def _indented(obj: object, level: int, step: str, encode, sort_keys: bool) -> str:  # noqa: ANN001
    if isinstance(obj, dict) and obj and all(isinstance(k, str) for k in obj):
        inner = step * (level + 1)
        items = sorted(obj.items()) if sort_keys else obj.items()
        body = ",\n".join(f"{inner}{_c_escape(k)}: {_indented(v, level + 1, step, encode, sort_keys)}"
                           for k, v in items)
        return "{\n" + body + "\n" + step * level + "}"
    if isinstance(obj, (list, tuple)) and obj:
        inner = step * (level + 1)
        body = ",\n".join(inner + _indented(v, level + 1, step, encode, sort_keys) for v in obj)
        return "[\n" + body + "\n" + step * level + "]"
    if isinstance(obj, dict) and obj:  # keys json turns into strings (numbers, true, null): its own encoder
        import json

        return json.dumps(obj, sort_keys=sort_keys, indent=len(step)).replace("\n", "\n" + step * level)
    return _c_escape(obj) if isinstance(obj, str) else "".join(encode(obj, 0))


def _no_default(obj: object) -> object:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")
