"""A host's own table (its GPUs, say), printed above its lines."""

from __future__ import annotations

from typing import Any, TypedDict


class Table(TypedDict):
    title: str
    columns: list[str]
    rows: list[list[Any]]
