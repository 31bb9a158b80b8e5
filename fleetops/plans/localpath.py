"""The one way a local path is built from what a node said (a file name, a module name, a version, a
path it proposes): `safe_join`. A node is not trusted to stay inside the folder the operator chose,
so every name is one path component and must be a plain one: no `..` or `.`, nothing absolute, no
separator, no NUL or other control character. Pure: nothing is read or written here; the caller
writes inside the folder it named."""

from __future__ import annotations

from pathlib import PurePath
from typing import TypeVar

P = TypeVar("P", bound=PurePath)
MAX_NAME = 255  # bytes in one component (NAME_MAX on Linux and macOS)


class UnsafeName(ValueError):
    """A name from a node that would leave its folder, or is no file name at all."""


def check_name(name: object, what: str = "name") -> str:
    """`name` when it is one plain path component; UnsafeName (saying which rule) otherwise."""
    if not isinstance(name, str):
        raise UnsafeName(f"{what} {name!r} is not text")
    if name in ("", ".", ".."):
        raise UnsafeName(f"{what} {name!r} is not a file name")
    if "/" in name or "\\" in name:
        raise UnsafeName(f"{what} {name!r} holds a path separator")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise UnsafeName(f"{what} {name!r} holds a control character")
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME:
        raise UnsafeName(f"{what} {name[:40]!r}… is longer than {MAX_NAME} bytes")
    return name


def safe_join(base: P, *names: object, what: str = "name") -> P:
    """base / names…, each name checked by check_name: the result is always inside base (as written;
    the caller opens it without following a symlink it did not make, or checks what is there)."""
    if not names:
        raise UnsafeName(f"no {what} given")
    return base.joinpath(*(check_name(n, what) for n in names))


def safe_join_relative(base: P, rel: object, what: str = "path") -> P:
    """base / rel, where rel is a relative path with '/' between its names
    ("job-1/output/manifest.json"), every name checked: an absolute path, a `..` anywhere, an empty
    or `.` name are refused."""
    if not isinstance(rel, str):
        raise UnsafeName(f"{what} {rel!r} is not text")
    if rel.startswith("/"):
        raise UnsafeName(f"{what} {rel!r} is absolute")
    try:
        return safe_join(base, *rel.split("/"), what=what)
    except UnsafeName as exc:
        raise UnsafeName(f"{what} {rel!r}: {exc}") from None
