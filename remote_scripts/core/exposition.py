"""The Prometheus text exposition format, written once for both sides: the client's `--metrics FILE`
(fleetops/report/metrics.py) and a node's scheduled verification (health/schedule.py) produce the
same metric names, HELP lines and label rules. Stdlib only, cheap to import: no dataclasses, no
typing at run time.

A label value is printable text of at most MAX_LABEL characters; metrics.py says where values may
come from."""

from __future__ import annotations

MAX_LABEL = 128  # characters of a label value; longer ones end in "..."
PATCH_STATES = ("patched", "original", "drifted", "unknown")
# The node agent's status words for a file of a patch set, as a file state (protocol.py).
PATCH_STATE_OF = {
    "applied": "patched",
    "already_applied": "patched",
    "would_restore": "patched",
    "restored": "original",
    "already_original": "original",
    "would_apply": "original",
    "drifted": "drifted",
}

HELP = {
    "fleetops_host_reachable": ("gauge", "1 if fleetops reached the host in its last run, else 0."),
    "fleetops_check_ok": ("gauge", "1 if the playbook's check passed on the host, 0 if it failed."),
    "fleetops_verify_seconds": ("gauge", "Seconds the last verify of the host took."),
    "fleetops_patch_state": (
        "gauge",
        "1 for the state each file of the patch set is in on the host, else 0.",
    ),
    "fleetops_gpu_memory_used_bytes": ("gauge", "GPU memory in use, as nvidia-smi reported it."),
    "fleetops_job_state": ("gauge", "1 for the state the host's latest job is in, else 0."),
    "fleetops_last_run_timestamp_seconds": (
        "gauge",
        "When fleetops last ran the task, in Unix seconds.",
    ),
}

TYPE_CHECKING = False
if TYPE_CHECKING:
    Labels = tuple[tuple[str, str], ...]


class Exposition:
    """Series by metric name, each a (labels, value) pair; `text()` renders them in a stable
    order."""

    def __init__(self) -> None:
        self.series: dict[str, list[tuple[Labels, float]]] = {}

    def add(self, name: str, value: float, **labels: str) -> None:
        pairs = tuple(sorted((key, label_value(text)) for key, text in labels.items()))
        self.series.setdefault(name, []).append((pairs, value))

    def text(self) -> str:
        out: list[str] = []
        for name in sorted(self.series):
            kind, help_text = HELP[name]
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            seen: set[Labels] = set()
            for pairs, value in sorted(self.series[name]):
                if pairs in seen:  # one sample per series: the first result for it stands
                    continue
                seen.add(pairs)
                labels = ",".join(f'{key}="{_escaped(text)}"' for key, text in pairs)
                out.append(
                    f"{name}{{{labels}}} {_number(value)}" if labels else f"{name} {_number(value)}"
                )
        return "\n".join(out) + "\n" if out else ""


def label_value(text: object) -> str:
    """A label value from text: printable characters only (anything else becomes `?`), at most
    MAX_LABEL."""
    value = "".join(ch if ch.isprintable() else "?" for ch in str(text))
    return value if len(value) <= MAX_LABEL else value[: MAX_LABEL - 3] + "..."


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))


def add_patch_states(out: Exposition, host: str, items: list[dict]) -> None:
    """fleetops_patch_state of each file of a patch answer's items ({module|label,
    status|state})."""
    for item in items:
        label = item.get("label") or item.get("module")
        if not label or label == "requirements":
            continue
        current = PATCH_STATE_OF.get(str(item.get("state") or ""), "unknown")
        for state in PATCH_STATES:
            out.add(
                "fleetops_patch_state",
                1 if state == current else 0,
                host=host,
                file=label,
                state=state,
            )
