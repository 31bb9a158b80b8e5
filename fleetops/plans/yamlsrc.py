"""Reading an operator's YAML file: its size capped before it is parsed, loaded by plans/yamlload.py
(strict YAML 1.2, bounded, every value marked with its file:line:column), and every failure a
ConfigError that names file, line and column on one line.

Where the rest of fleetops takes ConfigError, Mapping and Sequence from (they live in
plans/marks.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .marks import ConfigError, Mapping, Sequence
from .yamlload import MAX_ALIAS_NODES, MAX_DEPTH, compose_and_construct

__all__ = [
    "MAX_ALIAS_NODES",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "ConfigError",
    "Mapping",
    "Sequence",
    "check_size",
    "load_file",
    "load_text",
    "read_capped",
    "read_text_capped",
]

MAX_FILE_BYTES = 4 * 1024 * 1024  # an inventory of thousands of hosts is well below this


def _too_large(path: str | Path, text: str) -> ConfigError:
    """The size error, at the line where the limit is crossed (an editor jumps there)."""
    line = text.count("\n", 0, MAX_FILE_BYTES) + 1
    return ConfigError(
        path,
        line,
        f"file is larger than {MAX_FILE_BYTES} bytes (the limit for inventories, "
        "playbooks and the files they name); refusing to read it: split it up",
    )


def check_size(text: str, path: str | Path) -> str:
    """`text` itself, or ConfigError when its UTF-8 form is larger than MAX_FILE_BYTES."""
    if len(text) > MAX_FILE_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise _too_large(path, text)
    return text


def read_capped(path: str | Path) -> bytes:
    """A file's bytes, reading at most MAX_FILE_BYTES + 1 of them (a huge file or a device is never
    slurped); ConfigError naming file:line when it is larger. OSError passes to the caller."""
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise _too_large(path, data.decode("utf-8", "replace"))
    return data


def read_text_capped(path: str | Path) -> str:
    """read_capped as UTF-8 text; a decoding error is a ConfigError naming the file."""
    try:
        return read_capped(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            path, None, f"cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None


def _marked_error(path: str, exc: yaml.MarkedYAMLError) -> ConfigError:
    mark = exc.problem_mark or exc.context_mark
    line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
    # PyYAML's str() draws the offending line under the message; one line is what a terminal wants.
    problem = exc.problem or exc.context or "invalid YAML"
    if (
        exc.context
        and exc.problem
        and exc.context_mark
        and exc.context_mark.line != (mark.line if mark else -1)
    ):
        problem += f" ({exc.context} at line {exc.context_mark.line + 1})"
    elif exc.context and exc.problem:
        problem = f"{exc.context}: {problem}"
    return ConfigError(path, line, f"invalid YAML: {problem}", column)


def load_text(text: str, path: str | Path) -> Any:
    path = str(path)
    check_size(text, path)
    try:
        return compose_and_construct(text, path)
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as exc:
        raise _marked_error(path, exc) from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, None, f"invalid YAML: {exc}") from None
    except (
        ValueError,
        TypeError,
        AttributeError,
        KeyError,
        IndexError,
        OverflowError,
        RecursionError,
    ) as exc:
        # Constructors that finish after their node (PyYAML's two-step ones: sets, omaps) raise
        # plain Python errors outside construct_object; the document is all that can be named for
        # them.
        raise ConfigError(path, None, f"invalid YAML value: {exc}") from None


def load_file(path: str | Path) -> Any:
    path = Path(path)
    try:
        text = read_text_capped(path)
    except FileNotFoundError:
        raise ConfigError(path, None, "file not found") from None
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read: {exc}") from None
    return load_text(text, path)
