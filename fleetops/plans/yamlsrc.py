"""YAML loading that remembers where every value came from, so errors can say file:line."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml


class ConfigError(Exception):
    """A problem in a file the operator wrote; always names the file and, when known, the line."""

    def __init__(self, path: str | Path, line: int | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.message}"


class Mapping(dict):
    """A YAML mapping that knows its own line and the line of each key."""

    path: str = "?"
    line: int | None = None
    key_lines: dict[Any, int]

    def line_of(self, key: Any) -> int | None:
        return self.key_lines.get(key, self.line)

    def error(self, key: Any, message: str) -> ConfigError:
        return ConfigError(self.path, self.line_of(key), message)


class Sequence(list):
    path: str = "?"
    line: int | None = None
    item_lines: list[int]

    def line_of(self, index: int) -> int | None:
        return self.item_lines[index] if index < len(self.item_lines) else self.line


def _make_loader(path: str) -> type[yaml.SafeLoader]:
    class Loader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Mapping:
        loader.flatten_mapping(node)
        result = Mapping()
        result.path, result.line, result.key_lines = path, node.start_mark.line + 1, {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise ConfigError(path, key_node.start_mark.line + 1, "mapping key must be a scalar") from None
            if key in result:
                raise ConfigError(path, key_node.start_mark.line + 1, f"duplicate key {key!r}")
            result[key] = loader.construct_object(value_node, deep=True)
            result.key_lines[key] = key_node.start_mark.line + 1
        return result

    def construct_sequence(loader: yaml.SafeLoader, node: yaml.SequenceNode) -> Sequence:
        result = Sequence(loader.construct_object(child, deep=True) for child in node.value)
        result.path, result.line = path, node.start_mark.line + 1
        result.item_lines = [child.start_mark.line + 1 for child in node.value]
        return result

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, construct_sequence)
    return Loader


def load_text(text: str, path: str | Path) -> Any:
    path = str(path)
    try:
        return yaml.load(text, Loader=_make_loader(path))  # noqa: S506 - SafeLoader subclass
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise ConfigError(path, line, f"invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, None, f"invalid YAML: {exc}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        # Constructors for timestamps and big numbers raise plain Python errors.
        raise ConfigError(path, None, f"invalid YAML value: {exc}") from None


def load_file(path: str | Path) -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(path, None, "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, None, f"cannot read: {exc}") from None
    return load_text(text, path)


def expect_mapping(value: Any, path: str, line: int | None, what: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise ConfigError(path, getattr(value, "line", None) or line, f"{what} must be a mapping")
    return value


def reject_unknown(mapping: Mapping, allowed: Iterable[str], what: str) -> None:
    allowed = list(allowed)
    for key in mapping:
        if key not in allowed:
            raise mapping.error(key, f"unknown key {key!r} in {what} (allowed: {', '.join(sorted(allowed))})")


def get_str(mapping: Mapping, key: str, *, required: bool = False, default: str | None = None,
            pattern: re.Pattern[str] | None = None, describe: str = "") -> str | None:
    if key not in mapping:
        if required:
            raise ConfigError(mapping.path, mapping.line, f"missing required key {key!r}")
        return default
    value = mapping[key]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise mapping.error(key, f"{key!r} must be a string")
    value = str(value)
    if pattern is not None and not pattern.fullmatch(value):
        raise mapping.error(key, f"{key!r} value {value!r} is not allowed: {describe or pattern.pattern}")
    return value


def get_int(mapping: Mapping, key: str, *, default: int | None = None, minimum: int = 0,
            maximum: int = 2**31) -> int | None:
    if key not in mapping:
        return default
    value = mapping[key]
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise mapping.error(key, f"{key!r} must be an integer between {minimum} and {maximum}")
    return value


def get_bool(mapping: Mapping, key: str, *, default: bool = False) -> bool:
    if key not in mapping:
        return default
    value = mapping[key]
    if not isinstance(value, bool):
        raise mapping.error(key, f"{key!r} must be true or false")
    return value


def get_str_list(mapping: Mapping, key: str, *, pattern: re.Pattern[str] | None = None,
                 describe: str = "") -> list[str]:
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
                raise mapping.error(key, f"{key!r} item {item!r} is not allowed: {describe or pattern.pattern}")
    return list(value)
