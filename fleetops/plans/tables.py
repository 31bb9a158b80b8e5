"""Rows, columns and progress bars built from agent answers: plain strings that tasks put in their
Results and report/ draws (stdlib only, so scripts/gpu-smoke.py can use them without rich)."""

from __future__ import annotations

from typing import Any

from .gpugate import Verdict
from .timefmt import clock, duration

GPU_COLUMNS = ["gpu", "name", "memory", "util", "temp", "ecc", "state", "processes"]

FACT_COLUMNS = [
    "os",
    "python",
    "vllm",
    "speculators",
    "torch",
    "transformers",
    "driver",
    "cuda",
    "gpus",
    "venv free GiB",
    "state free GiB",
]


def bar(progress: dict[str, Any], width: int = 24) -> str:
    done, total = progress.get("done", 0), progress.get("total", 0)
    frac = done / total if total else 0.0
    filled = int(round(frac * width))
    eta = progress.get("eta")
    eta_text = f" ETA {clock(eta)}" if eta is not None else ""
    rate = f" {progress['tok_s']:.0f} tok/s" if "tok_s" in progress else ""
    return (
        f"[{'#' * filled}{'.' * (width - filled)}] {int(done)}/{int(total)} "
        f"{frac:.0%}{rate}{eta_text}"
    )


def fact_row(answer: dict[str, Any]) -> list[str]:
    pk = answer.get("packages", {})
    disk = answer.get("disk_free_gib", {})
    count = answer.get("gpu_count")
    gpus = f"{'?' if count is None else count} x {', '.join(answer.get('gpu_names') or []) or '-'}"
    # a missing value in words an operator can act on, never Python's `None`
    packages = [
        ("not installed", pk.get(name)) for name in ("vllm", "speculators", "torch", "transformers")
    ]
    cells = [
        ("unknown", answer.get("os")),
        ("unknown", answer.get("python")),
        *packages,
        ("not found", answer.get("driver")),
        ("not found", answer.get("cuda")),
        ("", gpus),
        ("unknown", disk.get("venv")),
        ("unknown", disk.get("state_dir")),
    ]
    return [missing if v is None else str(v) for missing, v in cells]


def short_process(p: dict[str, Any]) -> str:
    owner = f"job {p['job']}" if p.get("job") else "foreign"
    age = duration(p.get("age_s"))
    return f"{p['pid']} {p.get('name')} {p.get('used_mib')}MiB {p.get('user') or '?'} {age} {owner}"


def gpu_rows(verdict: Verdict) -> list[list[str]]:
    """One row per selected GPU, then one per missing GPU."""
    rows = []
    for g, state in verdict.gpus:
        used = g.get("memory_used_mib") or 0
        mem = f"{used}/{g.get('memory_total_mib')} MiB, {g.get('memory_free_mib')} free"
        rows.append(
            [
                str(g["index"]),
                str(g.get("name")),
                mem,
                f"{g.get('utilization_gpu_pct')}%",
                f"{g.get('temperature_c')}C",
                str(g.get("ecc_uncorrected")),
                state,
                "\n".join(short_process(p) for p in g.get("processes") or []) or "-",
            ]
        )
    for index in verdict.missing:
        rows.append([str(index), "-", "-", "-", "-", "-", "missing", "-"])
    return rows
