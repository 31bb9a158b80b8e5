"""diagnose's answer: every finding with its named severity, the host's verdict (the worst of them)
and its row of the fleet summary. A finding is also what the jobs family's reading of the latest job
is made of."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import Payload, Severity, declare, optional


@dataclass
class Finding:
    verdict: Severity
    area: str  # reach, clock, patch, gpu, gpuN, kernel, job, oom, processes, disk, memory, load
    msg: str
    # the commands to run next, each whole (report/ prints each on a line of its own)
    next: list[str]
    # Named at every call (keyword-only): a bare number there read like a severity.
    # within a verdict: lower first (how likely the cause of trouble)
    rank: int = field(default=50, kw_only=True)
    details: dict[str, Any] = field(default_factory=dict, kw_only=True)
    why: str = field(default="", kw_only=True)  # what the commands are for, in a few words

    def __post_init__(self) -> None:
        if not isinstance(self.verdict, Severity):
            raise TypeError(f"a finding's verdict is a Severity, not {self.verdict!r}")

    @property
    def order(self) -> tuple[int, int]:
        """Worst first; within a verdict, the likelier cause first."""
        return (-self.verdict.level, self.rank)


@dataclass(frozen=True)
class SummaryRow:
    """The host's row of the fleet summary: its verdict, the area and words of its worst finding,
    and that finding's first command ("-" where there is none). --json writes it as a list, in this
    order."""

    host: str
    verdict: Severity
    area: str
    msg: str
    command: str

    def cells(self) -> list[Any]:
        return [self.host, self.verdict, self.area, self.msg, self.command]


@declare
@dataclass(frozen=True)
class Diagnosis(Payload):
    """`reach`: how the host was reached (or not); `error_kind`: why the agent could not diagnose; a
    host that answered adds where its kernel log came from and whether its GPUs are a lab's
    replay."""

    of_tasks = ("diagnose",)
    verdict: Severity
    findings: list[Finding]
    summary_row: SummaryRow
    error_kind: str | None = optional()
    reach: dict[str, Any] | None = optional()

    def data(self) -> dict[str, Any]:
        out = super().data()
        out["summary_row"] = self.summary_row.cells()
        return out


@dataclass(frozen=True)
class RefusedDiagnosis(Diagnosis):
    """The agent answered with an error instead of what it read: its kind, None when the node named
    none."""

    error_kind: str | None = None


@dataclass(frozen=True)
class NodeDiagnosis(Diagnosis):
    """A host whose agent answered: `kernel_source` may be None (no kernel log could be read), and
    is there."""

    kernel_source: str | None = None
    simulated: bool = False
