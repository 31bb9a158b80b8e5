"""An ad-hoc command's answer: its exit status and both streams as the node kept them."""

from __future__ import annotations

from dataclasses import dataclass

from . import Payload, declare


@declare
@dataclass(frozen=True)
class CommandOutput(Payload):
    """`stdout`/`stderr`: head, a line saying how much the middle dropped, tail. report/ prefixes
    each of their lines with the host; `output` stays in --json, where readers have keyed on it."""

    of_tasks = ("run",)
    command: str
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    stdout_dropped_bytes: int
    stderr_dropped_bytes: int
    output: bool = True
