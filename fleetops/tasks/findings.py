"""A diagnose finding and the commands it names: what diagnose.py and jobs/findings.py build their verdicts from."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

OK, WARN, UNKNOWN, CRITICAL = "OK", "WARN", "UNKNOWN", "CRITICAL"
SEVERITY = {OK: 0, WARN: 1, UNKNOWN: 2, CRITICAL: 3}


@dataclass
class Finding:
    verdict: str
    area: str  # reach, clock, patch, gpu, gpuN, kernel, job, oom, processes, disk, memory, load
    msg: str
    next: list[str]  # the commands to run next, each whole (report/ prints each on a line of its own)
    rank: int = 50  # within a verdict: lower first (how likely it is the cause of trouble)
    details: dict = field(default_factory=dict)
    why: str = ""  # what the commands are for, in a few words


def fab_cmd(host: str, *words: str) -> str:
    """A command the operator may paste: every word quoted, since some (job ids, bus ids, paths) are what a
    node answered, and a node must not choose what the operator's shell runs."""
    return "fab -H " + shlex.quote(host) + " " + " ".join(shlex.quote(w) for w in words)


def run_cmd(host: str, command: str) -> str:
    """`fab run COMMAND` (COMMAND runs in the node's shell: a node value in it goes in through quoted)."""
    return fab_cmd(host, "run", command)


def quoted(value: object) -> str:
    return shlex.quote(str(value))
