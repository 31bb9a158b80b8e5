"""What a task did on a host, with its evidence; and the one place results become an exit status."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    OK = "ok"
    CHANGED = "changed"
    FAILED = "failed"
    UNREACHABLE = "unreachable"
    SKIPPED = "skipped"


class Severity(str, Enum):
    """A verdict of diagnose and of the gpu gate (Nagios' words), least to most severe: the one ordering every
    reader sorts by. It serialises as its name ("CRITICAL"), in --json and anywhere it is written as text."""

    OK = "OK"
    WARN = "WARN"
    UNKNOWN = "UNKNOWN"  # not checked, or the check could not be read: worse than a known warning
    CRITICAL = "CRITICAL"

    @property
    def level(self) -> int:
        return _SEVERITY_LEVEL[self]

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Severity):
            return NotImplemented
        return self.level < other.level

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Severity):
            return NotImplemented
        return self.level <= other.level

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Severity):
            return NotImplemented
        return self.level > other.level

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Severity):
            return NotImplemented
        return self.level >= other.level

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def named(cls, word: object) -> Severity | None:
        """The severity a word (a verdict read back from --json or a table cell) names, else None."""
        try:
            return cls(word)
        except (ValueError, TypeError):  # TypeError: a word that is not hashable (a list in a bad answer)
            return None


_SEVERITY_LEVEL = {member: level for level, member in enumerate(Severity)}


# Exit statuses, documented in the README. A run exits with the most severe code among its results (exit_status).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2  # bad inventory/playbook/arguments: nothing was contacted
EXIT_UNREACHABLE = 4
# A task ran but its audit line could not be written (audit.py): wins over every other status but 130, since
# the run's record is then incomplete whatever its results were. FLEETOPS_AUDIT_OPTIONAL=1 opts out.
EXIT_AUDIT = 5
EXIT_INTERRUPTED = 130  # Ctrl-C: the shell's 128 + SIGINT
# stdout closed by its reader (`fab ... | head`): the shell's 128 + SIGPIPE, what `yes | head` leaves in PIPESTATUS
EXIT_READER_GONE = 141
EXIT_GPU_BUSY = 10
EXIT_GPU_UNHEALTHY = 11
EXIT_NO_NVIDIA_SMI = 12
EXIT_NVIDIA_SMI_FAILED = 13


@dataclass
class Evidence:
    command: str
    exit_code: int | None
    stderr_tail: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Next:
    """What to do after a result: why, in a few words, then each command to run, whole. report/ prints each
    command on a line of its own (what an operator copies); in data and --json it is `to_data()`."""

    why: str
    commands: list[str] = field(default_factory=list)

    def to_data(self) -> dict[str, Any]:
        return {"why": self.why, "commands": list(self.commands)}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Next:
        """A Next back from its data (a result's `next`, an item's, as --json writes them)."""
        return cls(str(data.get("why") or ""), [str(c) for c in data.get("commands") or ()])


@dataclass
class Item:
    """One unit inside a task: a patch file, a check, a GPU."""

    label: str
    status: Status
    msg: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Result:
    host: str
    task: str
    status: Status
    msg: str
    items: list[Item] = field(default_factory=list)
    evidence: Evidence | None = None
    code: int = EXIT_OK  # exit status this result asks for when it is not ok
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status in (Status.FAILED, Status.UNREACHABLE)

    @property
    def changed(self) -> bool:
        return self.status is Status.CHANGED

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["status"] = self.status.value
        out["changed"] = self.changed
        for item in out["items"]:
            item["status"] = item["status"].value if isinstance(item["status"], Status) else item["status"]
        return out


def rollup(items: list[Item]) -> Status:
    """A task's status from its items: any failure fails it; else any change changes it."""
    if any(i.status is Status.FAILED for i in items):
        return Status.FAILED
    if any(i.status is Status.CHANGED for i in items):
        return Status.CHANGED
    return Status.OK


# The gpu gate's codes stand for verdicts, and the worst verdict across hosts decides: CRITICAL (11 missing or
# unhealthy) > UNKNOWN (13 nvidia-smi failing, 12 absent) > WARN (10 busy). Their numbers are not in that order,
# so they rank here, all at 10's place among the other codes (4 unreachable below them, diagnose's 20-22 and
# 130 above, as by number).
_GPU_RANK = {EXIT_GPU_BUSY: 0, EXIT_NO_NVIDIA_SMI: 1, EXIT_NVIDIA_SMI_FAILED: 2, EXIT_GPU_UNHEALTHY: 3}


def _severity(code: int) -> tuple[int, int]:
    return (EXIT_GPU_BUSY, _GPU_RANK[code]) if code in _GPU_RANK else (code, 0)


def exit_status(results: list[Result]) -> int:
    code = EXIT_OK
    for r in results:
        if r.status is Status.UNREACHABLE:
            asks = max(EXIT_UNREACHABLE, r.code or 0, key=_severity)  # diagnose: unreachable is CRITICAL (22)
        elif r.status is Status.FAILED:
            asks = r.code or EXIT_FAILED
        else:
            asks = r.code  # e.g. 130 for a tail detached by Ctrl-C: done, but not finished
        code = max(code, asks, key=_severity)
    return code


def recap(results: list[Result]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in results:
        row = out.setdefault(r.host, {s.value: 0 for s in Status})
        row[r.status.value] += 1
    return out


def reader_gone(stream: Any) -> int:
    """The reader of `stream` left (`| head`): its descriptor now points at /dev/null, so what is still buffered
    and the interpreter's last flush go nowhere without a word. Returns EXIT_READER_GONE, the status to exit with."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no descriptor (a test's StringIO): nothing to point away
        pass
    return EXIT_READER_GONE
