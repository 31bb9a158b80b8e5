"""GPU health from `nvidia-smi -q -x`: ECC error counts (volatile: since the driver loaded;
aggregate: the GPU's lifetime), retired and pending pages, row remapping, and the active clock
throttle ("event") reasons. Pure: the XML text in, dicts out (xml.etree from the standard library;
nothing here reaches a node).

The node sends the XML as nvidia-smi printed it (remote_scripts/health/diagnose.py); tested on a
real H200 capture (tests/fixtures/nvidia-smi/h200x2/busy_q.xml). Field names moved between drivers,
both spellings are read: ECC counters are `volatile/dram_uncorrectable` etc. on Hopper (driver 5xx)
and `volatile/double_bit/total` on older GPUs; throttle reasons are `clocks_event_reasons` since
driver 535 and `clocks_throttle_reasons` before.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from ..results import Severity

# Throttle reasons that mean the hardware is protecting itself (heat, power delivery), not a
# setting.
SERIOUS_THROTTLE = {
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
}
_ABSENT = {"N/A", "[N/A]", "Not Supported", "[Not Supported]", ""}


@dataclass
class GpuHealth:
    index: int | None
    bus_id: str | None
    uuid: str | None
    name: str | None
    ecc_mode: str | None
    # volatile/aggregate → {correctable, uncorrectable}
    ecc: dict[str, dict[str, int]] = field(default_factory=dict)
    retired: dict[str, int | None] = field(default_factory=dict)  # single_bit, double_bit (counts)
    retirement_pending: bool | None = None
    remapped: dict[str, int | None] = field(default_factory=dict)  # correctable, uncorrectable
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    throttle: list[str] = field(default_factory=list)  # active reasons, e.g. ["gpu_idle"]
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    processes: list[dict[str, Any]] = field(default_factory=list)  # pid, name, used_mib


class HealthParseError(ValueError):
    pass


def _int(text: str | None) -> int | None:
    if text is None or text.strip() in _ABSENT:
        return None
    m = re.match(r"\s*(-?\d+)", text)
    return int(m.group(1)) if m else None


def _yes(text: str | None) -> bool | None:
    if text is None or text.strip() in _ABSENT:
        return None
    return text.strip().lower() in ("yes", "true", "active")


def _ecc_counts(node: ET.Element | None) -> dict[str, int]:
    """Correctable and uncorrectable totals of one <volatile> or <aggregate> block, either
    layout."""
    if node is None:
        return {}
    corr = unc = 0
    seen = False
    for child in node:
        tag = child.tag
        if tag in ("single_bit", "double_bit"):  # older drivers: <single_bit><total>N</total>...
            value = _int(child.findtext("total"))
            if value is not None:
                seen = True
                if tag == "single_bit":
                    corr += value
                else:
                    unc += value
            continue
        value = _int(child.text)
        if value is None or tag.endswith("threshold_exceeded"):
            continue
        if "uncorrectable" in tag:
            unc += value
            seen = True
        elif "correctable" in tag:
            corr += value
            seen = True
    return {"correctable": corr, "uncorrectable": unc} if seen else {}


def parse_health_xml(text: str) -> list[GpuHealth]:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise HealthParseError(f"nvidia-smi -q -x output is not XML: {exc}") from None
    if root.tag != "nvidia_smi_log":
        raise HealthParseError(f"expected <nvidia_smi_log>, got <{root.tag}>")
    return [_gpu_health(g) for g in root.findall("gpu")]


def _gpu_health(g: ET.Element) -> GpuHealth:
    """One <gpu> of the report."""
    ecc = {kind: _ecc_counts(g.find(f"ecc_errors/{kind}")) for kind in ("volatile", "aggregate")}
    retired, pending = _retired_pages(g.find("retired_pages"))
    rr = g.find("remapped_rows")
    fb = g.find("fb_memory_usage")
    return GpuHealth(
        index=_int(g.findtext("minor_number")),
        bus_id=g.get("id"),
        uuid=g.findtext("uuid"),
        name=g.findtext("product_name"),
        ecc_mode=g.findtext("ecc_mode/current_ecc"),
        ecc={k: v for k, v in ecc.items() if v},
        retired=retired,
        retirement_pending=pending,
        remapped=_remapped_rows(rr),
        remap_pending=_yes(rr.findtext("remapped_row_pending")) if rr is not None else None,
        remap_failure=_yes(rr.findtext("remapped_row_failure")) if rr is not None else None,
        throttle=_throttle_reasons(g),
        memory_used_mib=_int(fb.findtext("used")) if fb is not None else None,
        memory_total_mib=_int(fb.findtext("total")) if fb is not None else None,
        processes=[
            {
                "pid": _int(p.findtext("pid")),
                "name": p.findtext("process_name"),
                "used_mib": _int(p.findtext("used_memory")),
            }
            for p in g.findall("processes/process_info")
        ],
    )


def _retired_pages(rp: ET.Element | None) -> tuple[dict[str, int | None], bool | None]:
    """Pages retired for single- and double-bit errors, and whether a retirement is pending (older
    GPUs; remapped rows replaced it)."""
    if rp is None:
        return {}, None
    retired = {
        "single_bit": _int(rp.findtext("multiple_single_bit_retirement/retired_count")),
        "double_bit": _int(rp.findtext("double_bit_retirement/retired_count")),
    }
    return retired, _yes(rp.findtext("pending_retirement"))


def _remapped_rows(rr: ET.Element | None) -> dict[str, int | None]:
    if rr is None:
        return {}
    return {
        "correctable": _int(rr.findtext("remapped_row_corr")),
        "uncorrectable": _int(rr.findtext("remapped_row_unc")),
    }


def _throttle_reasons(g: ET.Element) -> list[str]:
    """The clock event reasons that are active, by their short name (older drivers call them
    throttle reasons)."""
    reasons = g.find("clocks_event_reasons")
    if reasons is None:
        reasons = g.find("clocks_throttle_reasons")
    if reasons is None:
        return []
    return [
        re.sub(r"^clocks_(?:event|throttle)_reason_", "", child.tag)
        for child in reasons
        if _yes(child.text)
    ]


@dataclass
class HealthFinding:
    severity: Severity  # CRITICAL or WARN
    gpu: GpuHealth
    what: str
    action: str


def assess(gpus: list[GpuHealth]) -> list[HealthFinding]:
    """What in the counters needs a person. Uncorrectable errors since the driver loaded, a failed
    or pending remap, pending retirement: CRITICAL or WARN with NVIDIA's documented action; lifetime
    counts only WARN."""
    out = []
    for g in gpus:
        vol, agg = g.ecc.get("volatile", {}), g.ecc.get("aggregate", {})
        if g.remap_failure:
            out.append(
                HealthFinding(
                    Severity.CRITICAL,
                    g,
                    "row remapping failed (no spare rows left)",
                    "drain the GPU and RMA it (NVIDIA: remapping failure)",
                )
            )
        if vol.get("uncorrectable"):
            out.append(
                HealthFinding(
                    Severity.CRITICAL,
                    g,
                    f"{vol['uncorrectable']} uncorrectable ECC errors since the driver loaded",
                    "drain the GPU, reset it when idle; repeats: RMA",
                )
            )
        if g.remap_pending or g.retirement_pending:
            what = "a row remap is pending" if g.remap_pending else "a page retirement is pending"
            out.append(
                HealthFinding(
                    Severity.WARN, g, what, "reset the GPU when it is idle to activate it"
                )
            )
        if agg.get("uncorrectable") and not vol.get("uncorrectable"):
            out.append(
                HealthFinding(
                    Severity.WARN,
                    g,
                    f"{agg['uncorrectable']} uncorrectable ECC errors in the GPU's "
                    "lifetime (none since the driver loaded)",
                    "watch it; check retired pages / remapped rows",
                )
            )
        if g.remapped.get("uncorrectable"):
            out.append(
                HealthFinding(
                    Severity.WARN,
                    g,
                    f"{g.remapped['uncorrectable']} rows remapped for uncorrectable errors",
                    "watch it; NVIDIA's threshold for RMA is in the row remapper docs",
                )
            )
        serious = sorted(SERIOUS_THROTTLE.intersection(g.throttle))
        if serious:
            out.append(
                HealthFinding(
                    Severity.WARN,
                    g,
                    "clocks throttled by " + ", ".join(serious),
                    "check cooling and power delivery (nvidia-smi -q -d PERFORMANCE,TEMPERATURE)",
                )
            )
    return out
