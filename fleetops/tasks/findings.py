"""A diagnose finding and the commands it names: what diagnose.py and jobs/findings.py build their verdicts from."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from ..results import Severity

OK, WARN, UNKNOWN, CRITICAL = Severity.OK, Severity.WARN, Severity.UNKNOWN, Severity.CRITICAL


@dataclass
class Finding:
    verdict: Severity
    area: str  # reach, clock, patch, gpu, gpuN, kernel, job, oom, processes, disk, memory, load
    msg: str
    next: list[str]  # the commands to run next, each whole (report/ prints each on a line of its own)
    # Named at every call (keyword-only): a bare number there read like a severity.
    rank: int = field(default=50, kw_only=True)  # within a verdict: lower first (how likely the cause of trouble)
    details: dict = field(default_factory=dict, kw_only=True)
    why: str = field(default="", kw_only=True)  # what the commands are for, in a few words

    def __post_init__(self) -> None:
        if not isinstance(self.verdict, Severity):
            raise TypeError(f"a finding's verdict is a Severity, not {self.verdict!r}")

    @property
    def order(self) -> tuple[int, int]:
        """Worst first; within a verdict, the likelier cause first."""
        return (-self.verdict.level, self.rank)


def fab_cmd(host: str, *words: str) -> str:
    """A command the operator may paste: every word quoted, since some (job ids, bus ids, paths) are what a
    node answered, and a node must not choose what the operator's shell runs."""
    return "fab -H " + shlex.quote(host) + " " + " ".join(shlex.quote(w) for w in words)


def run_cmd(host: str, command: str) -> str:
    """`fab run COMMAND` (COMMAND runs in the node's shell: a node value in it goes in through quoted)."""
    return fab_cmd(host, "run", command)


def quoted(value: object) -> str:
    return shlex.quote(str(value))
