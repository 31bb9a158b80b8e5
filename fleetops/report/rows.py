"""The rows and bars the operator reads, built from results and agent answers: plain data (stdlib only, so
scripts/gpu-smoke.py can use it without rich); console.py turns it into tables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..plans.gpugate import Verdict, age
from ..plans.hostrange import header, natural_key
from ..redaction import shown
from ..results import Result

GPU_COLUMNS = ["gpu", "name", "memory", "util", "temp", "ecc", "state", "processes"]

FACT_COLUMNS = ["os", "python", "vllm", "speculators", "torch", "transformers", "driver", "cuda", "gpus",
                "venv free GiB", "state free GiB"]


def bar(progress: dict, width: int = 24) -> str:
    done, total = progress.get("done", 0), progress.get("total", 0)
    frac = done / total if total else 0.0
    filled = int(round(frac * width))
    eta = progress.get("eta")
    eta_text = f" ETA {int(eta) // 60}:{int(eta) % 60:02d}" if eta is not None else ""
    rate = f" {progress['tok_s']:.0f} tok/s" if "tok_s" in progress else ""
    return f"[{'#' * filled}{'.' * (width - filled)}] {int(done)}/{int(total)} {frac:.0%}{rate}{eta_text}"


def fact_row(answer: dict) -> list[str]:
    pk = answer.get("packages", {})
    disk = answer.get("disk_free_gib", {})
    gpus = f"{answer.get('gpu_count')} x {', '.join(answer.get('gpu_names') or []) or '-'}"
    return [str(v) for v in (answer.get("os"), answer.get("python"), pk.get("vllm"), pk.get("speculators"),
                             pk.get("torch"), pk.get("transformers"), answer.get("driver"), answer.get("cuda"),
                             gpus, disk.get("venv"), disk.get("state_dir"))]


def fleet_sections(results: list[Result], fold: bool = False) -> list[dict]:
    """Tables that compare hosts, shown after the per-host lines. `fold`: hosts with the same row share it
    (GPU summary) or the same column (facts), headed by their host range, so 800 hosts stay a few lines.
    Cells hold what nodes said: cleaned (redaction.shown) before rows are compared, folded or cut, so a secret
    that holds its host's own name is masked whole before the name becomes {host}."""
    sections = []
    gpu = [r for r in results if r.task == "gpu"]
    if len(gpu) > 1:
        rows = []
        for r in gpu:
            states: dict[str, int] = {}
            for item in r.items:
                states[item.details.get("state", "?")] = states.get(item.details.get("state", "?"), 0) + 1
            # The verdict word (OK / WARN / CRITICAL / UNKNOWN); a host the gate never judged says its status.
            word = r.data.get("verdict") or r.status.value
            rows.append([r.host, shown(word), shown(", ".join(f"{n} {s}" for s, n in sorted(states.items()))
                                                   or r.msg.removeprefix(f"{word}: "))])
        if fold:
            rows = [[header(hosts), *row] for row, hosts in _same(rows, lambda row: tuple(row[1:])).items()]
        # Worst first, as diagnose's summary: a host not judged (unreachable, an error) is as unknown as UNKNOWN.
        worst = {"CRITICAL": 0, "WARN": 2, "OK": 3}
        rows.sort(key=lambda row: (worst.get(row[1], 1), natural_key(row[0])))
        sections.append({"title": "GPU fleet summary", "columns": ["hosts" if fold else "host", "verdict", "GPUs"],
                         "rows": rows})
    facts = [r for r in results if r.task == "facts" and "fact_row" in r.data]
    if facts:
        # One row per fact, one column per host (per group of hosts with the same facts, when folding).
        columns = [(r.host, [shown(str(v)) for v in r.data["fact_row"]]) for r in facts]
        if fold:
            columns = [(header(hosts), list(row))
                       for row, hosts in _same(columns, lambda col: tuple(col[1])).items()]
        rows, differ = [], []
        for i, name in enumerate(FACT_COLUMNS):
            values = [col[i] for _, col in columns]
            rows.append([name, *values])
            if len(set(values)) > 1:
                differ.append(len(rows) - 1)
        sections.append({"title": "facts (rows that differ between hosts are highlighted)",
                         "columns": ["fact", *[name for name, _ in columns]], "rows": rows, "highlight_rows": differ})
    diag = [r for r in results if r.task == "diagnose" and r.data.get("summary_row")]
    if len(diag) > 1:
        # One row per host (per group of hosts with the same worst finding, when folding), worst first.
        rows = [[r.host, *(shown(str(c)) for c in r.data["summary_row"][1:])] for r in diag]
        if fold:  # the same finding on many hosts (their own name as {host}) is one row
            rows = [[header(hosts), *row] for row, hosts in _same(
                rows, lambda row: tuple(str(c).replace(row[0], "{host}") for c in row[1:])).items()]
        order = {"CRITICAL": 0, "UNKNOWN": 1, "WARN": 2, "OK": 3}
        rows.sort(key=lambda row: (order.get(row[1], 9), row[0]))
        sections.append({"title": "diagnose: fleet summary (worst first)",
                         "columns": ["hosts" if fold else "host", "verdict", "what", "worst finding", "next"],
                         "rows": rows})
    return sections


def _same(entries: list, key: Callable[[Any], tuple]) -> dict[tuple, list[str]]:
    """Entries whose first element is a host name → {key: [hosts]}, the most common key first."""
    out: dict[tuple, list[str]] = {}
    for entry in entries:
        out.setdefault(key(entry), []).append(entry[0])
    return dict(sorted(out.items(), key=lambda kv: -len(kv[1])))


def short_process(p: dict) -> str:
    owner = f"job {p['job']}" if p.get("job") else "foreign"
    return f"{p['pid']} {p.get('name')} {p.get('used_mib')}MiB {p.get('user') or '?'} {age(p.get('age_s'))} {owner}"


def gpu_rows(verdict: Verdict) -> list[list[str]]:
    """One row per selected GPU, then one per missing GPU."""
    rows = []
    for g, state in verdict.gpus:
        used = g.get("memory_used_mib") or 0
        mem = f"{used}/{g.get('memory_total_mib')} MiB, {g.get('memory_free_mib')} free"
        rows.append([str(g["index"]), str(g.get("name")), mem, f"{g.get('utilization_gpu_pct')}%",
                     f"{g.get('temperature_c')}C", str(g.get("ecc_uncorrected")), state,
                     "\n".join(short_process(p) for p in g.get("processes") or []) or "-"])
    for index in verdict.missing:
        rows.append([str(index), "-", "-", "-", "-", "-", "missing", "-"])
    return rows
