"""The fleet tables shown after the per-host lines, built from results: plain data; closing.py draws
them. (Rows of one host's answer are plans/tables.py's: tasks build them.)"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..plans.hostrange import header, natural_key
from ..plans.tables import FACT_COLUMNS
from ..redaction import shown
from ..results import Result, Severity, shape_of
from ..results.gpu import AllocationGpus, Facts, GpuGate

if TYPE_CHECKING:
    from ..results.diagnose import Diagnosis


def fleet_sections(results: list[Result], fold: bool = False) -> list[dict]:
    """Tables that compare hosts, shown after the per-host lines. `fold`: hosts with the same row
    share it (GPU summary) or the same column (facts), headed by their host range, so 800 hosts stay
    a few lines. Cells hold what nodes said: cleaned (redaction.shown) before rows are compared,
    folded or cut, so a secret that holds its host's own name is masked whole before the name
    becomes {host}. Each table takes the results of its payload type (a host that never answered:
    the type its task declares)."""
    sections = [
        _gpu_section(results, fold),
        _facts_section(results, fold),
        _diagnose_section(results, fold),
    ]
    return [section for section in sections if section is not None]


def _gpu_row(r: Result) -> list[str]:
    """host, verdict, GPUs by state."""
    states: dict[str, int] = {}
    for item in r.items:
        state = item.details.get("state", "?")
        states[state] = states.get(state, 0) + 1
    # The verdict word (OK / WARN / CRITICAL / UNKNOWN); a host the gate never judged says its
    # status.
    verdict = r.payload.verdict if isinstance(r.payload, (GpuGate, AllocationGpus)) else None
    word = verdict or r.status.value
    counted = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
    return [r.host, shown(word), shown(counted or r.msg.removeprefix(f"{word}: "))]


def _gpu_section(results: list[Result], fold: bool) -> dict[str, Any] | None:
    gpu = [r for r in results if shape_of(r) in (GpuGate, AllocationGpus)]
    if len(gpu) <= 1:
        return None
    rows = [_gpu_row(r) for r in gpu]
    if fold:
        rows = [
            [header(hosts), *row] for row, hosts in _same(rows, lambda row: tuple(row[1:])).items()
        ]
    # Worst first, as diagnose's summary: a host not judged (unreachable, an error) is as unknown
    # as UNKNOWN.
    rows.sort(
        key=lambda row: (
            -(Severity.named(row[1]) or Severity.UNKNOWN).level,
            natural_key(row[0]),
        )
    )
    return {
        "title": "GPU fleet summary",
        "columns": ["hosts" if fold else "host", "verdict", "GPUs"],
        "rows": rows,
    }


def _facts_section(results: list[Result], fold: bool) -> dict[str, Any] | None:
    """One row per fact, one column per host (per group of hosts with the same facts, when
    folding)."""
    facts = [(r.host, r.payload) for r in results if isinstance(r.payload, Facts)]
    if not facts:
        return None
    columns = [
        (host, [shown(str(v)) for v in payload.fact_row])
        for host, payload in sorted(facts, key=lambda hp: natural_key(hp[0]))
    ]
    if fold:
        columns = [
            (header(hosts), list(row))
            for row, hosts in _same(columns, lambda col: tuple(col[1])).items()
        ]
    rows, differ = [], []
    for i, name in enumerate(FACT_COLUMNS):
        values = [col[i] for _, col in columns]
        rows.append([name, *values])
        if len(set(values)) > 1:
            differ.append(len(rows) - 1)
    return {
        "title": "facts (rows that differ between hosts are highlighted)",
        "columns": ["fact", *[name for name, _ in columns]],
        "rows": rows,
        "highlight_rows": differ,
        "whole": True,
    }


def _fold_findings(rows: list[list[str]]) -> list[list[str]]:
    """The same finding on many hosts is one row: each host's own name is {host} to compare them,
    and in the row of a group."""
    groups = _same(rows, lambda row: tuple(str(c).replace(row[0], "{host}") for c in row[1:]))
    first = {row[0]: row for row in rows}
    folded = []
    for hosts in groups.values():
        cells = first[hosts[0]][1:]
        if len(hosts) > 1:
            cells = [str(c).replace(hosts[0], "{host}") for c in cells]
        folded.append([header(hosts), *cells])
    return folded


def _diagnose_section(results: list[Result], fold: bool) -> dict[str, Any] | None:
    """One row per host (per group of hosts with the same worst finding, when folding), worst
    first."""
    # a Diagnosis exists only once its module is loaded (by a run of diagnose): a run that has none
    # does not load it to find that out
    loaded = sys.modules.get("fleetops.results.diagnose")
    kind: type[Diagnosis] | None = loaded.Diagnosis if loaded else None
    diag = [
        (r.host, r.payload.summary_row)
        for r in results
        if kind is not None and isinstance(r.payload, kind)
    ]
    if len(diag) <= 1:
        return None
    rows = [
        [host, *(shown(str(c)) for c in (row.verdict, row.area, row.msg))] for host, row in diag
    ]
    if fold:
        rows = _fold_findings(rows)
    rows.sort(key=lambda row: (_worst_first(row[1]), natural_key(row[0])))
    # No command here: a table cell would wrap it; each host's block ends with its next commands,
    # whole.
    return {
        "title": "diagnose: fleet summary (worst first)",
        "columns": ["hosts" if fold else "host", "verdict", "what", "worst finding"],
        "rows": rows,
    }


def _worst_first(word: object) -> int:
    """Severities worst first; a word that names none (not a verdict) after them all."""
    severity = Severity.named(word)
    return -severity.level if severity is not None else 1


def _same(entries: list, key: Callable[[Any], tuple]) -> dict[tuple, list[str]]:
    """Entries whose first element is a host name → {key: [hosts]}, the most common key first."""
    out: dict[tuple, list[str]] = {}
    for entry in entries:
        out.setdefault(key(entry), []).append(entry[0])
    return dict(sorted(out.items(), key=lambda kv: -len(kv[1])))
