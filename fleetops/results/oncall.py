"""fetch's answer: each file (requested, status, sha256, where it went) and the folder it went to;
on Ctrl-C, the partial copy kept and the command that resumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import Payload, declare


@declare
@dataclass(frozen=True)
class Fetched(Payload):
    of_tasks = ("fetch",)
    files: list[dict[str, Any]]
    job_id: str | None
    folder: str


@dataclass(frozen=True)
class FetchInterrupted(Payload):
    error_kind: str = field(default="interrupted", kw_only=True)
    files: list[dict[str, Any]]
    folder: str
    part: str | None
    part_bytes: int | None
    resume: str
