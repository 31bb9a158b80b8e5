"""The commands a diagnose finding names (the finding itself is results/diagnose.py's): what
diagnose.py and jobs/findings.py build their verdicts from."""

from __future__ import annotations

import shlex

from ..results import Severity
from ..results.diagnose import Finding

__all__ = ["CRITICAL", "OK", "UNKNOWN", "WARN", "Finding", "fab_cmd", "quoted", "run_cmd"]

OK, WARN, UNKNOWN, CRITICAL = Severity.OK, Severity.WARN, Severity.UNKNOWN, Severity.CRITICAL


def fab_cmd(host: str, *words: str) -> str:
    """A command the operator may paste: every word quoted, since some (job ids, bus ids, paths) are
    what a node answered, and a node must not choose what the operator's shell runs."""
    return "fab -H " + shlex.quote(host) + " " + " ".join(shlex.quote(w) for w in words)


def run_cmd(host: str, command: str) -> str:
    """`fab run COMMAND` (COMMAND runs in the node's shell: a node value in it goes in through
    quoted)."""
    return fab_cmd(host, "run", command)


def quoted(value: object) -> str:
    return shlex.quote(str(value))
