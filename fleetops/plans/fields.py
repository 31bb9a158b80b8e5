"""Reading typed fields out of a loaded mapping: each check fails with a ConfigError at the key's
own file:line:column, and an unknown key gets a "did you mean"."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Literal, overload

from .marks import ConfigError, Mapping, did_you_mean


def expect_mapping(value: Any, path: str, line: int | None, what: str) -> Mapping:
    if not isinstance(value, Mapping):
        column = getattr(value, "column", None) if getattr(value, "line", None) else None
        raise ConfigError(
            path, getattr(value, "line", None) or line, f"{what} must be a mapping", column
        )
    return value


def reject_unknown(mapping: Mapping, allowed: Iterable[str], what: str) -> None:
    allowed = list(allowed)
    for key in mapping:
        if key not in allowed:
            raise mapping.error(
                key,
                f"unknown key {key!r} in {what}{did_you_mean(key, allowed)} "
                f"(allowed: {', '.join(sorted(allowed))})",
            )


# A required key, or one with a default, always gives a value: the overloads let callers rely on it.
@overload
def get_str(
    mapping: Mapping,
    key: str,
    *,
    required: Literal[True],
    default: str | None = None,
    pattern: re.Pattern[str] | None = None,
    describe: str = "",
) -> str: ...
@overload
def get_str(
    mapping: Mapping,
    key: str,
    *,
    required: bool = False,
    default: str,
    pattern: re.Pattern[str] | None = None,
    describe: str = "",
) -> str: ...
@overload
def get_str(
    mapping: Mapping,
    key: str,
    *,
    required: bool = False,
    default: str | None = None,
    pattern: re.Pattern[str] | None = None,
    describe: str = "",
) -> str | None: ...
def get_str(
    mapping: Mapping,
    key: str,
    *,
    required: bool = False,
    default: str | None = None,
    pattern: re.Pattern[str] | None = None,
    describe: str = "",
) -> str | None:
    if key not in mapping:
        if required:
            raise ConfigError(
                mapping.path, mapping.line, f"missing required key {key!r}", mapping.column
            )
        return default
    value = mapping[key]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise mapping.error(key, f"{key!r} must be a string")
    value = str(value)
    if pattern is not None and not pattern.fullmatch(value):
        raise mapping.error(
            key, f"{key!r} value {value!r} is not allowed: {describe or pattern.pattern}"
        )
    return value


@overload
def get_int(
    mapping: Mapping, key: str, *, default: int, minimum: int = 0, maximum: int = 2**31
) -> int: ...
@overload
def get_int(
    mapping: Mapping, key: str, *, default: None = None, minimum: int = 0, maximum: int = 2**31
) -> int | None: ...
def get_int(
    mapping: Mapping,
    key: str,
    *,
    default: int | None = None,
    minimum: int = 0,
    maximum: int = 2**31,
) -> int | None:
    if key not in mapping:
        return default
    value = mapping[key]
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise mapping.error(key, f"{key!r} must be an integer between {minimum} and {maximum}")
    return value


_YAML11_BOOLS = {"yes", "no", "on", "off", "y", "n"}


def get_bool(mapping: Mapping, key: str, *, default: bool = False) -> bool:
    if key not in mapping:
        return default
    value = mapping[key]
    if not isinstance(value, bool):
        hint = (
            " (yes/no/on/off are text in YAML 1.2)" if str(value).lower() in _YAML11_BOOLS else ""
        )
        raise mapping.error(key, f"{key!r} must be true or false, got {value!r}{hint}")
    return value


def get_str_list(
    mapping: Mapping, key: str, *, pattern: re.Pattern[str] | None = None, describe: str = ""
) -> list[str]:
    if key not in mapping:
        return []
    value = mapping[key]
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise mapping.error(key, f"{key!r} must be a list of strings")
    if pattern is not None:
        for item in value:
            if not pattern.fullmatch(item):
                raise mapping.error(
                    key, f"{key!r} item {item!r} is not allowed: {describe or pattern.pattern}"
                )
    return list(value)
