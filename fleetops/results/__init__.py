"""What a task did on a host, with its evidence; and the one place results become an exit status.

A task family's answer is a payload of its own type (a frozen dataclass in this package's module for
that family: results/gpu.py, results/jobs.py...), built by the task and read by report/ by its type.
`to_data` is the one function that turns payloads, items and results into the plain data --json
writes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from typing import Any, ClassVar, TypeVar


class Status(str, Enum):
    OK = "ok"
    CHANGED = "changed"
    FAILED = "failed"
    UNREACHABLE = "unreachable"
    SKIPPED = "skipped"


class Severity(str, Enum):
    """A verdict of diagnose and of the gpu gate (Nagios' words), least to most severe: the one
    ordering every reader sorts by. It serialises as its name ("CRITICAL"), in --json and anywhere
    it is written as text."""

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
        """The severity a word (a verdict read back from --json or a table cell) names, else
        None."""
        try:
            return cls(word)
        # TypeError: a word that is not hashable (a list in a bad answer)
        except (ValueError, TypeError):
            return None


_SEVERITY_LEVEL = {member: level for level, member in enumerate(Severity)}


# Exit statuses, documented in the README. A run exits with the most severe code among its results
# (exit_status).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2  # bad inventory/playbook/arguments: no request was sent to any node
EXIT_UNREACHABLE = 4
# A task ran but its audit line could not be written (audit.py): wins over every other status but
# 130, since the run's record is then incomplete whatever its results were.
# FLEETOPS_AUDIT_OPTIONAL=1 opts out.
EXIT_AUDIT = 5
EXIT_INTERRUPTED = 130  # Ctrl-C: the shell's 128 + SIGINT
# stdout closed by its reader (`fab ... | head`): the shell's 128 + SIGPIPE, what `yes | head`
# leaves in PIPESTATUS
EXIT_READER_GONE = 141
EXIT_GPU_BUSY = 10
EXIT_GPU_UNHEALTHY = 11
EXIT_NO_NVIDIA_SMI = 12
EXIT_NVIDIA_SMI_FAILED = 13


# A payload field with this metadata is left out of its data while it is None: --json never had the
# key then.
OMIT_NONE: Mapping[str, bool] = {"omit_none": True}


def optional() -> Any:
    """A payload field that --json shows only when it holds something (a key some answers have,
    others not)."""
    return field(default=None, metadata=OMIT_NONE)


def to_data(value: Any) -> Any:
    """The one serialiser: a payload becomes its data(); any other dataclass (item, evidence, Next,
    finding) a dict of its fields, but those marked optional() while None; lists, tuples and
    mappings are copied through; everything else is as it is (a Severity stays one: it writes as its
    name)."""
    if isinstance(value, Payload):
        return value.data()
    if is_dataclass(value) and not isinstance(value, type):
        return _fields_of(value)
    if isinstance(value, Status):
        return value.value
    if isinstance(value, Mapping):
        return {k: to_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(to_data(v) for v in value)
    return value


def _fields_of(value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(value):
        item = getattr(value, f.name)
        if item is None and f.metadata.get("omit_none"):
            continue
        out[f.name] = to_data(item)
    return out


@dataclass(frozen=True)
class Payload:
    """What one task family answers for a host, typed: each family's payloads subclass it (frozen: a
    result's data is written from it once). `of_tasks` names the tasks whose results carry it
    (declare()), so report/ can place a host whose task never answered (unreachable: no payload)
    with the others of its kind."""

    of_tasks: ClassVar[tuple[str, ...]] = ()
    # False for an answer any family may give instead of its own (results/refusal.py: the agent's
    # error, a drained node): such a result is placed by its task's declared payload, as one that
    # never answered.
    own: ClassVar[bool] = True

    def data(self) -> dict[str, Any]:
        """Its fields as --json writes them; a payload whose shape differs from its fields' says so
        here."""
        return _fields_of(self)


def shape_of(result: Result) -> type[Payload] | None:
    """The payload type a result carries, or (a host that never answered, or refused) the one its
    task declares."""
    if result.payload is not None and result.payload.own:
        return type(result.payload)
    return _DECLARED.get(result.task)


_Kind = TypeVar("_Kind", bound="type[Payload]")


def declare(kind: _Kind) -> _Kind:
    """Register a payload type for the tasks it names (a class decorator)."""
    for task in kind.of_tasks:
        _DECLARED[task] = kind
    return kind


_DECLARED: dict[str, type[Payload]] = {}


@dataclass
class Evidence:
    command: str
    exit_code: int | None
    stderr_tail: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Next:
    """What to do after a result: why, in a few words, then each command to run, whole. report/
    prints each command on a line of its own (what an operator copies); in data and --json it is
    `to_data()`."""

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

    @property
    def next(self) -> Next | None:
        """What to run about this item (a diagnose finding's commands): a `Next` in its details."""
        raw = self.details.get("next")
        if isinstance(raw, Next) or raw is None:
            return raw
        return Next.from_data(raw) if isinstance(raw, Mapping) else None


@dataclass
class Result:
    host: str
    task: str
    status: Status
    msg: str
    items: list[Item] = field(default_factory=list)
    evidence: Evidence | None = None
    code: int = EXIT_OK  # exit status this result asks for when it is not ok
    # What --json writes under "data": the payload's fields, then what the run notes about any
    # result (the node's warnings and tidying, the playbook, an error's kind). Readers of one
    # family's answer read `payload`.
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    payload: Payload | None = None

    def __post_init__(self) -> None:
        if self.payload is not None:
            self.data = {**self.payload.data(), **self.data}

    def carry(self, payload: Payload) -> None:
        """Swap the payload for another (a task adding to its own answer): its data follows."""
        if self.payload is not None:
            for key in self.payload.data():
                self.data.pop(key, None)
        self.payload = payload
        self.data = {**payload.data(), **self.data}

    @property
    def failed(self) -> bool:
        return self.status in (Status.FAILED, Status.UNREACHABLE)

    @property
    def changed(self) -> bool:
        return self.status is Status.CHANGED

    @property
    def next(self) -> Next | None:
        """What to run next, once per result: its payload's, else (a result made of plain data) its
        data's."""
        own = getattr(self.payload, "next", None)
        if isinstance(own, Next):
            return own
        raw = self.data.get("next")
        return Next.from_data(raw) if isinstance(raw, Mapping) else None

    @property
    def table(self) -> dict[str, Any] | None:
        """The host's own table (its GPUs, its job), shown above its lines; from its payload when it
        has one."""
        own = getattr(self.payload, "table", None)
        raw = own if own is not None else self.data.get("table")
        return dict(raw) if isinstance(raw, Mapping) else None

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "task": self.task,
            "status": self.status.value,
            "msg": self.msg,
            "items": to_data(self.items),
            "evidence": to_data(self.evidence),
            "code": self.code,
            "data": to_data(self.data),
            "seconds": self.seconds,
            "changed": self.changed,
        }


def rollup(items: list[Item]) -> Status:
    """A task's status from its items: any failure fails it; else any change changes it."""
    if any(i.status is Status.FAILED for i in items):
        return Status.FAILED
    if any(i.status is Status.CHANGED for i in items):
        return Status.CHANGED
    return Status.OK


# The gpu gate's codes stand for verdicts, and the worst verdict across hosts decides: CRITICAL (11
# missing or unhealthy) > UNKNOWN (13 nvidia-smi failing, 12 absent) > WARN (10 busy). Their numbers
# are not in that order, so they rank here, all at 10's place among the other codes (4 unreachable
# below them, diagnose's 20-22 and 130 above, as by number).
_GPU_RANK = {
    EXIT_GPU_BUSY: 0,
    EXIT_NO_NVIDIA_SMI: 1,
    EXIT_NVIDIA_SMI_FAILED: 2,
    EXIT_GPU_UNHEALTHY: 3,
}


def _severity(code: int) -> tuple[int, int]:
    return (EXIT_GPU_BUSY, _GPU_RANK[code]) if code in _GPU_RANK else (code, 0)


def exit_status(results: list[Result]) -> int:
    code = EXIT_OK
    for r in results:
        if r.status is Status.UNREACHABLE:
            # diagnose: unreachable is CRITICAL (22)
            asks = max(EXIT_UNREACHABLE, r.code or 0, key=_severity)
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
    """The reader of `stream` left (`| head`): its descriptor now points at /dev/null, so what is
    still buffered and the interpreter's last flush go nowhere without a word. Returns
    EXIT_READER_GONE, the status to exit with."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
    # no descriptor (a test's StringIO): nothing to point away
    except (OSError, ValueError, AttributeError):
        pass
    return EXIT_READER_GONE
