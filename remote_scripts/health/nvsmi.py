"""Parsers for nvidia-smi output. Pure functions (text in, dicts out), stdlib only, so the node runs
the very code the tests check against recorded real output.

nvidia-smi is not a stable interface: fields get renamed between drivers (clocks_throttle_reasons →
clocks_event_reasons), memory.free is not total − used (the driver reserves some), values carry
units unless `nounits` is given, and with no compute process --query-compute-apps prints a header or
nothing.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

# What we ask for, in this order (the positional meaning of a noheader answer).
QUERY_FIELDS = [
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "memory.total",
    "memory.used",
    "memory.free",
    "utilization.gpu",
    "utilization.memory",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "ecc.errors.uncorrected.volatile.total",
    "compute_mode",
    "pstate",
    "clocks_throttle_reasons.active",
]
# Fields a driver may reject or rename; asked for again without them if the query is refused.
OPTIONAL_FIELDS = {
    "clocks_throttle_reasons.active",
    "ecc.errors.uncorrected.volatile.total",
    "power.limit",
}
APPS_FIELDS = ["pid", "process_name", "used_gpu_memory", "gpu_uuid", "gpu_bus_id"]
RENAMED = {
    "clocks_event_reasons.active": "clocks_throttle_reasons.active",
    "clocks_event_reasons": "clocks_throttle_reasons",
}
KEYS = {  # nvidia-smi field → our key
    "index": "index",
    "uuid": "uuid",
    "name": "name",
    "pci.bus_id": "bus_id",
    "driver_version": "driver",
    "memory.total": "memory_total_mib",
    "memory.used": "memory_used_mib",
    "memory.free": "memory_free_mib",
    "utilization.gpu": "utilization_gpu_pct",
    "utilization.memory": "utilization_memory_pct",
    "temperature.gpu": "temperature_c",
    "power.draw": "power_draw_w",
    "power.limit": "power_limit_w",
    "ecc.errors.uncorrected.volatile.total": "ecc_uncorrected",
    "compute_mode": "compute_mode",
    "pstate": "pstate",
    "clocks_throttle_reasons.active": "throttle_reasons",
}
INTS = {
    "index",
    "memory_total_mib",
    "memory_used_mib",
    "memory_free_mib",
    "utilization_gpu_pct",
    "utilization_memory_pct",
    "temperature_c",
    "ecc_uncorrected",
}
FLOATS = {"power_draw_w", "power_limit_w"}
ABSENT = {"[N/A]", "N/A", "[Not Supported]", "Not Supported", ""}
# Values nvidia-smi prints in place of a reading when the GPU itself is in trouble.
TROUBLE = re.compile(r"\[(GPU is lost|Unknown Error|GPU requires reset|Requires Reset)\]", re.I)
UNIT = re.compile(r"^\s*(-?[0-9.]+)\s*(MiB|%|W|C)?\s*$")


class ParseError(ValueError):
    pass


def _field_name(header: str) -> str:
    name = re.sub(r"\s*\[[^\]]*\]\s*$", "", header.strip())  # "memory.total [MiB]" → "memory.total"
    return RENAMED.get(name, name)


def _value(key: str, raw: str, problems: list[str]) -> object:
    raw = raw.strip()
    if TROUBLE.search(raw):
        problems.append(f"{key}: {raw}")
        return None
    if raw in ABSENT:
        return None
    if key in INTS or key in FLOATS:
        m = UNIT.match(raw)
        if not m:
            raise ParseError(f"{key}: expected a number, got {raw!r}")
        number = float(m.group(1))
        return int(number) if key in INTS else number
    return raw


def _rows(text: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if not line.strip() or re.fullmatch(r"rc=\d+", line.strip()):
            continue
        rows.append([c.strip() for c in line.split(",")])
    return rows


def parse_query(text: str, fields: list[str] | None = None) -> list[dict]:
    """--query-gpu output, with or without header and units. Without a header, columns are `fields`
    in order."""
    rows = _rows(text)
    if rows and rows[0] and rows[0][0] == "index":
        names = [_field_name(h) for h in rows.pop(0)]
    else:
        names = list(fields or QUERY_FIELDS)
    gpus = []
    for row in rows:
        if len(row) != len(names):
            raise ParseError(f"expected {len(names)} columns, got {len(row)}: {','.join(row)!r}")
        gpu: dict = {"problems": []}
        for name, raw in zip(names, row):
            key = KEYS.get(name, name)
            gpu[key] = _value(key, raw, gpu["problems"])
        gpus.append(gpu)
    return gpus


def parse_apps(text: str) -> list[dict]:
    """--query-compute-apps output; a header alone (or nothing) means no process holds a GPU."""
    rows = _rows(text)
    if rows and rows[0] and rows[0][0] == "pid":
        rows.pop(0)
    apps = []
    for row in rows:
        if len(row) != len(APPS_FIELDS):
            raise ParseError(
                f"expected {len(APPS_FIELDS)} columns, got {len(row)}: {','.join(row)!r}"
            )
        pid, name, mem, uuid, bus = row
        m = UNIT.match(mem)
        apps.append(
            {
                "pid": int(pid),
                "name": name,
                "used_mib": int(float(m.group(1))) if m else None,
                "gpu_uuid": uuid,
                "gpu_bus_id": bus,
            }
        )
    return apps


def parse_table_header(text: str) -> dict:
    """Driver and CUDA version from plain `nvidia-smi` (the only place the CUDA version is
    printed)."""
    m = re.search(r"Driver Version:\s*([0-9.]+)\s+CUDA Version:\s*([0-9.]+)", text)
    return {"driver": m.group(1), "cuda": m.group(2)} if m else {"driver": None, "cuda": None}


def parse_table_processes(text: str) -> list[dict]:
    out = []
    for m in re.finditer(
        r"^\|\s+(\d+)\s+\S+\s+\S+\s+(\d+)\s+(\S+)\s+(.+?)\s+(\d+)MiB\s*\|\s*$", text, re.M
    ):
        out.append(
            {
                "gpu_index": int(m.group(1)),
                "pid": int(m.group(2)),
                "type": m.group(3),
                "name": m.group(4),
                "used_mib": int(m.group(5)),
            }
        )
    return out


def parse_xml(text: str) -> dict:
    """`nvidia-smi -q -x`: versions, and per GPU its uuid, memory and processes."""
    root = ET.fromstring(text)

    def mib(node: ET.Element | None) -> int | None:
        if node is None or node.text is None:
            return None
        m = UNIT.match(node.text)
        return int(float(m.group(1))) if m else None

    gpus = []
    for g in root.findall("gpu"):
        fb = g.find("fb_memory_usage")
        procs = [
            {
                "pid": int(p.findtext("pid", "0")),
                "name": p.findtext("process_name"),
                "used_mib": mib(p.find("used_memory")),
            }
            for p in g.findall("processes/process_info")
        ]
        gpus.append(
            {
                "bus_id": g.get("id"),
                "name": g.findtext("product_name"),
                "uuid": g.findtext("uuid"),
                "index": int(g.findtext("minor_number", "-1")),
                "memory_total_mib": mib(fb.find("total")) if fb is not None else None,
                "memory_used_mib": mib(fb.find("used")) if fb is not None else None,
                "memory_free_mib": mib(fb.find("free")) if fb is not None else None,
                "processes": procs,
            }
        )
    return {
        "driver": root.findtext("driver_version"),
        "cuda": root.findtext("cuda_version"),
        "attached_gpus": int(root.findtext("attached_gpus", "0")),
        "gpus": gpus,
    }


def join_processes(gpus: list[dict], apps: list[dict]) -> list[dict]:
    """Processes belong to GPUs by UUID (indices can differ between nvidia-smi and
    CUDA_VISIBLE_DEVICES)."""
    by_uuid = {g.get("uuid"): g for g in gpus}
    for g in gpus:
        g["processes"] = []
    orphans: list[dict] = []
    for app in apps:
        gpu = by_uuid.get(app["gpu_uuid"])
        (gpu["processes"] if gpu is not None else orphans).append(app)
    return orphans
