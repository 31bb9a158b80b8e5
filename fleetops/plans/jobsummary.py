"""What a job did, in a few words for `tail`'s closing line: samples done/total and tok/s, read from
the job's own progress reports (the playbook's `progress:` pattern), SSH job or Slurm array alike.
Pure: lines in, text out."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from .jobspec import parse_progress


def job_summary(reports: Iterable[dict[str, Any] | None]) -> str:
    """Samples done/total and tok/s from the job's last progress report (one per task of a Slurm
    array, summed), e.g. `64/64 samples, 5563 tok/s`; "" when it reported none (no log line matched
    the pattern), so no line says `0/0 samples`."""
    got = [r for r in reports if r and r.get("total") is not None and r.get("done") is not None]
    if not got:
        return ""
    text = f"{sum(int(r['done']) for r in got)}/{sum(int(r['total']) for r in got)} samples"
    speeds = [r["tok_s"] for r in got if r.get("tok_s") is not None]
    return text + (f", {sum(speeds):.0f} tok/s" if speeds else "")


def log_summary(lines: Iterable[str], progress: re.Pattern[str]) -> str:
    """job_summary of a log's lines read with the job's progress pattern: its last report counts."""
    last = None
    for line in lines:
        last = parse_progress(line, progress) or last
    return job_summary([last])
