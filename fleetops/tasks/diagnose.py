"""diagnose: "what is wrong with this node?" in one agent exec, answered as findings ordered by
likelihood, each with a verdict (OK / WARN / CRITICAL / UNKNOWN) and the next command to run.

The node sends what it read (remote_scripts/health/diagnose.py: kernel-log lines, `nvidia-smi -q
-x`, the latest job, its processes, disk, memory, load); the reading of it is here and in plans/
(kernellog, gpuhealth), pure.

Verdicts and exit statuses (a run exits with the worst across hosts; exit codes chosen not to clash
with results.py's 0/1/2/4/10-13/130):
    OK        0    nothing found
    WARN      20   something to look at; the node can run work (a failed job, low disk, an app-level
                   Xid)
    UNKNOWN   21   a part could not be read (no nvidia-smi, an unreadable kernel log, no playbook
                   checks)
    CRITICAL  22   the node needs a person before it runs work (Xid 79/48/..., OOM-killed job,
                   missing GPU, uncorrectable ECC, wrong packages, drifted patch, unreachable)
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..agent.core.protocol import ALREADY_APPLIED, DRIFTED, REFUSED, WOULD_APPLY
from ..plans.jobspec import DEFAULT_FAILURES, DEFAULT_PROGRESS, resolve
from ..plans.versions import judged_checks, judged_patch
from ..plans.yamlsrc import ConfigError
from ..results import EXIT_OK, Item, Next, Result, Severity, Status
from ..results.diagnose import Diagnosis, NodeDiagnosis, RefusedDiagnosis, SummaryRow
from ..wire.connector import Connector, TransportError
from .findings import CRITICAL, OK, UNKNOWN, WARN, Finding
from .findings import fab_cmd as _fab
from .findings import quoted as _q
from .findings import run_cmd as _run_cmd
from .jobs.backend import backend_for
from .jobs.findings import job_findings, process_findings, with_state
from .plan import Plan

if TYPE_CHECKING:
    from ..plans.host import Host
    from ..plans.kernellog import OomKill, XidEvent
    from ..plans.playbook import Playbook
    from ..state import RunState

EXIT_DIAG_WARN = 20
EXIT_DIAG_UNKNOWN = 21
EXIT_DIAG_CRITICAL = 22
EXIT_FOR = {
    OK: EXIT_OK,
    WARN: EXIT_DIAG_WARN,
    UNKNOWN: EXIT_DIAG_UNKNOWN,
    CRITICAL: EXIT_DIAG_CRITICAL,
}
FAST_KINDS = {"requires", "grep", "compile"}
SKEW_WARN_S = 5.0
# as tasks/registry.py counts them
UNREACHABLE_KINDS = ("unreachable", "hostkey", "auth", "refused")


@dataclass(frozen=True)
class Kind:
    """One kind of finding: its verdict, its area, its rank within the verdict (lower first: the
    likelier cause of trouble) and what its next commands are for. Called with what was found and
    those commands, it is that finding."""

    verdict: Severity
    area: str
    rank: int
    why: str = ""

    def __call__(
        self,
        msg: str,
        *commands: str,
        area: str = "",
        details: dict[str, Any] | None = None,
        why: str = "",
    ) -> Finding:
        return Finding(
            self.verdict,
            area or self.area,
            msg,
            list(commands),
            rank=self.rank,
            details=details or {},
            why=why or self.why,
        )


# ---------------------------------------------------------------- every kind, likeliest cause first
NOT_REACHED = Kind(CRITICAL, "reach", 0, "try the connection alone")
REACHED = Kind(OK, "reach", 0, "the connection alone")
AGENT_FAILED = Kind(UNKNOWN, "agent", 1, "the agent alone")
DRAINED = Kind(WARN, "drain", 3)
XID_CRITICAL = Kind(CRITICAL, "gpu", 5)
GPUS_MISSING = Kind(CRITICAL, "gpu", 6, "which GPUs the driver and the PCI bus see")
GPU_PROBLEMS = Kind(CRITICAL, "gpu", 7, "the GPU's full record")
NVIDIA_SMI_FAILS = Kind(CRITICAL, "gpu", 8, "nvidia-smi's own words")
GPU_HEALTH_CRITICAL = Kind(
    CRITICAL, "gpu", 9, "the GPU's ECC, retirement, remapping and throttle record"
)
DISK_FULL = Kind(CRITICAL, "disk", 12, "space and inodes where it is short")
WRONG_PACKAGES = Kind(
    CRITICAL,
    "patch",
    20,
    "see what is installed: a playbook is for the versions it pins (runbook new-version-landed)",
)
OOM_EARLIER_JOB = Kind(WARN, "oom", 21)
OOM_NO_JOB = Kind(WARN, "oom", 21, "the kernel's account of the kill")
SLURM_OOM = Kind(WARN, "oom", 22, "the kernel log's end")
PATCH_DRIFTED = Kind(CRITICAL, "patch", 25, "see the edited lines (runbook node-drifted)")
PATCHED_CHECKS_FAIL = Kind(CRITICAL, "patch", 25, "see which checks fail, with their evidence")
PATCHED_IN_PART = Kind(CRITICAL, "patch", 25, "see which hunks are in and which not")
NOT_PATCHED = Kind(WARN, "patch", 30, "patch the node, then prove it")
CHECKS_FAIL = Kind(WARN, "patch", 30, "see which checks fail, with their evidence")
NO_NVIDIA_SMI = Kind(UNKNOWN, "gpu", 35, "look for the driver and nvidia-smi")
KERNEL_LOG_UNREAD = Kind(
    UNKNOWN,
    "kernel",
    36,
    "read it as root (or add the login user to the adm / systemd-journal group)",
)
XID_WARN = Kind(WARN, "gpu", 40)
XID_OTHER = Kind(OK, "gpu", 40)
CLOCK_SKEWED = Kind(WARN, "clock", 41, "the node's clock and its sync")
DISK_LOW = Kind(WARN, "disk", 42, "space and inodes where it is short")
MEMORY_LOW = Kind(WARN, "memory", 43, "memory and its largest users")
LOAD_HIGH = Kind(WARN, "load", 44, "what keeps the CPUs busy")
GPU_HEALTH_WARN = Kind(WARN, "gpu", 45, "the GPU's ECC, retirement, remapping and throttle record")
FOREIGN_GPU_PROCESSES = Kind(WARN, "gpu", 50, "who holds them (pid, user, age): ask their owners")
SLURM_UNANSWERED = Kind(UNKNOWN, "slurm", 50, "ask again once slurmctld answers")
SLURM_ALLOCATION = Kind(OK, "slurm", 50, "the allocation's GPUs")
SLURM_NO_JOB = Kind(OK, "slurm", 50, "start one")
GPU_HEALTH_UNREAD = Kind(UNKNOWN, "gpu", 55, "nvidia-smi's own words")
PATCH_UNCLEAR = Kind(UNKNOWN, "patch", 60, "see what the patch would do")
CHECKS_UNREAD = Kind(UNKNOWN, "patch", 60, "run the checks on their own")
PATCHED = Kind(OK, "patch", 90, "the deep checks too (callsites, the probe)")
NO_PATCHES = Kind(OK, "patch", 90, "the deep checks too")
GPUS_FINE = Kind(OK, "gpu", 90, "the GPUs and their processes")
NO_XID = Kind(OK, "kernel", 94, "the kernel log's end")
CLOCK_IN_STEP = Kind(OK, "clock", 96, "the node's clock and its sync")
DISKS_FINE = Kind(OK, "disk", 97, "every filesystem")
MEMORY_FINE = Kind(OK, "memory", 98, "memory and its largest users")
LOAD_FINE = Kind(OK, "load", 99, "what keeps the CPUs busy")


# ---------------------------------------------------------------- the pieces, each pure
@dataclass(frozen=True)
class _FastChecks:
    """The playbook's fast checks (requires, grep, compile) as patch_state words them."""

    items: list[dict]
    failed: list[dict]

    @property
    def counts(self) -> str:
        if not self.items:
            return "no fast checks"
        return f"{len(self.items) - len(self.failed)}/{len(self.items)} fast checks pass"

    @property
    def first_bad(self) -> str:
        if not self.failed:
            return ""
        return f"; first failing: {self.failed[0]['name']}: {self.failed[0]['msg']}"

    @property
    def tail(self) -> str:
        return f"{self.counts}{self.first_bad}"


def _fast_checks(checks: dict) -> _FastChecks:
    items = [] if checks.get("error") else checks.get("items", [])
    return _FastChecks(items, [i for i in items if not i["ok"]])


def _short_modules(files: list[dict], status: str) -> str:
    """The last dotted part of each file's module whose check mode answered `status`."""
    return ", ".join(
        str(f.get("module")).rsplit(".", 1)[-1] for f in files if f.get("status") == status
    )


def _refusal(files: list[dict], fast: _FastChecks) -> str | None:
    """Why the installed packages are the wrong ones, or None when nothing says so."""
    refused = [f for f in files if f.get("status") == REFUSED]
    if not refused and not any(i["kind"] == "requires" for i in fast.failed):
        return None
    if refused and refused[0]["msg"]:
        return str(refused[0]["msg"])
    return str(fast.failed[0]["msg"])


def _patched_finding(host: str, files: list[dict], fast: _FastChecks, details: dict) -> Finding:
    """Every file already carries the patch: do the fast checks agree?"""
    if fast.failed:
        return PATCHED_CHECKS_FAIL(
            f"patched, but {fast.tail}", _fab(host, "verify"), details=details
        )
    return PATCHED(
        f"patched ({len(files)} files; {fast.counts})", _fab(host, "verify"), details=details
    )


def _files_finding(host: str, files: list[dict], fast: _FastChecks, details: dict) -> Finding:
    """The verdict when the patch's check mode answered for each file."""
    words = {f.get("status") for f in files}
    if words == {ALREADY_APPLIED}:
        return _patched_finding(host, files, fast, details)
    if words == {WOULD_APPLY}:
        return NOT_PATCHED(
            f"not patched: {len(files)} files as installed ({fast.counts})",
            _fab(host, "patch", "verify"),
            details=details,
        )
    if words == {WOULD_APPLY, ALREADY_APPLIED}:
        return PATCHED_IN_PART(
            f"drifted: only partly patched ({_short_modules(files, ALREADY_APPLIED)} patched, "
            f"the rest not; {fast.counts})",
            _fab(host, "patch", "--check"),
            details=details,
        )
    return PATCH_UNCLEAR(
        f"the patch's check mode answered {sorted(set(map(str, words)))}: {files[0].get('msg')}",
        _fab(host, "patch", "--check"),
        details=details,
    )


def _unchecked_finding(
    host: str, checks: dict, patch: dict | None, fast: _FastChecks, details: dict
) -> Finding:
    """The verdict when no file was checked: the playbook has no patches, or a check failed."""
    if patch and patch.get("error"):
        return PATCH_UNCLEAR(
            f"not checked: {patch['error']}", _fab(host, "patch", "--check"), details=details
        )
    if checks.get("error"):
        return CHECKS_UNREAD(
            f"not checked: {checks['error']}", _fab(host, "verify"), details=details
        )
    if fast.failed:
        return CHECKS_FAIL(fast.tail, _fab(host, "verify"), details=details)
    return NO_PATCHES(
        f"the playbook has no patches; {fast.counts}", _fab(host, "verify"), details=details
    )


def patch_state(host: str, checks: dict, patch: dict | None = None) -> Finding:
    """One line: patched / not patched / drifted (the patch's own check mode, per file), and whether
    the playbook's fast checks (requires, grep, compile) agree."""
    fast = _fast_checks(checks)
    files = (patch or {}).get("items") or []
    details: dict = {
        "checks": [
            {"name": i["name"], "kind": i["kind"], "ok": i["ok"], "msg": i["msg"]}
            for i in fast.items
        ],
        "files": [
            {"module": f.get("module"), "status": f.get("status"), "msg": f.get("msg")}
            for f in files
        ],
    }
    why = _refusal(files, fast)
    if why is not None:
        return WRONG_PACKAGES(f"wrong packages: {why}", _fab(host, "facts"), details=details)
    if any(f.get("status") == DRIFTED for f in files):
        return PATCH_DRIFTED(
            f"drifted: {_short_modules(files, DRIFTED)} matches neither the original nor the "
            f"patched form ({fast.tail})",
            _fab(host, "patch", "--check"),
            details=details,
        )
    if files:
        return _files_finding(host, files, fast, details)
    return _unchecked_finding(host, checks, patch, fast, details)


def _gpu_label(bus: str | None, index_by_bus: dict[str, int]) -> str:
    index = index_by_bus.get(bus or "")
    return f"gpu{index}" if index is not None else "gpu"


def xid_findings(host: str, events: list[XidEvent], index_by_bus: dict[str, int]) -> list[Finding]:
    """One finding per (Xid code, GPU): its meaning, how often, the last line, NVIDIA's action."""
    groups: dict[tuple[int, str | None], list[XidEvent]] = {}
    for e in events:
        groups.setdefault((e.code, e.bus_id), []).append(e)
    from ..plans.kernellog import when as kernel_when

    out = []
    for (code, bus), evs in groups.items():
        last = evs[-1]
        info = last.info
        kind = {"CRITICAL": XID_CRITICAL, "WARN": XID_WARN}.get(info.severity, XID_OTHER)
        label = _gpu_label(bus, index_by_bus)
        where = f"GPU {label[3:]} " if label != "gpu" else "GPU "
        when = kernel_when(last.line.epoch) or last.line.stamp or "since boot"
        who = f", process {last.process} (pid {last.pid})" if last.pid else ""
        times = f"{len(evs)} times, last {when}" if len(evs) > 1 else when
        msg = (
            f"Xid {code} on {where}(PCI {bus or last.pci}): "
            f"{info.name}{who} [{times}]: {info.action}"
        )
        if code == 79:
            why = (
                "drain the node (so nothing launches there), stop its job, reboot it; after the "
                "reboot diagnose it, then undrain it"
            )
            nxt = [
                _fab(host, "drain", "--reason", f"Xid 79 on {where.strip()}"),
                _fab(host, "stop"),
                _run_cmd(host, "sudo reboot"),
                _fab(host, "diagnose"),
                _fab(host, "undrain"),
            ]
        elif info.reset:
            why = "reset the GPU once it is idle"
            nxt = [_run_cmd(host, f"sudo nvidia-smi --gpu-reset -i {_q(bus or last.pci)}")]
        else:
            why = "the GPU's ECC, retired pages and row remapping"
            nxt = [
                _run_cmd(
                    host,
                    f"nvidia-smi -q -i {_q(bus or last.pci)} -d ECC,PAGE_RETIREMENT,ROW_REMAPPER",
                )
            ]
        out.append(
            kind(
                msg,
                *nxt,
                area=label,
                details={
                    "xid": code,
                    "meaning": info.name,
                    "bus_id": bus,
                    "count": len(evs),
                    "pid": last.pid,
                    "process": last.process,
                    "last_line": last.line.text,
                },
                why=why,
            )
        )
    return out


def _smi_unusable(host: str, snap: dict) -> Finding | None:
    """The finding when nvidia-smi is missing or fails, None when it answered."""
    if snap.get("error_kind") == "no_nvidia_smi":
        return NO_NVIDIA_SMI(
            f"GPUs not checked: {snap['error']}",
            _run_cmd(host, "ls -l /usr/bin/nvidia-smi /dev/nvidia*; lsmod | grep nvidia"),
        )
    if not snap.get("ok"):
        return NVIDIA_SMI_FAILS(
            f"nvidia-smi fails: {snap.get('error')}", _run_cmd(host, "nvidia-smi")
        )
    return None


def _index_by_bus(gpus: list[dict]) -> dict[str, int]:
    """Each GPU's index by its PCI bus, in the kernel log's spelling of the bus."""
    from ..plans.kernellog import bus_key  # ~15 ms: only when a node's GPUs are there to be checked

    index_by_bus: dict[str, int] = {}
    for g in gpus:
        key = bus_key(g.get("bus_id"))
        if key and g.get("index") is not None:
            index_by_bus[key] = int(g["index"])
    return index_by_bus


def _gpu_count_findings(host: str, expected: int | None, gpus: list[dict]) -> list[Finding]:
    """GPUs missing against the inventory, and values nvidia-smi could not read, per GPU."""
    out: list[Finding] = []
    if expected is not None and len(gpus) < expected:
        out.append(
            GPUS_MISSING(
                f"{len(gpus)} of {expected} GPUs visible (inventory says {expected})",
                _run_cmd(host, "nvidia-smi -L; lspci | grep -i nvidia"),
            )
        )
    for g in gpus:
        if g.get("problems"):
            out.append(
                GPU_PROBLEMS(
                    f"GPU {g.get('index')} ({g.get('bus_id')}) reads {'; '.join(g['problems'])}",
                    _run_cmd(host, f"nvidia-smi -q -i {_q(g.get('index'))}"),
                    area=f"gpu{g.get('index')}",
                )
            )
    return out


def _foreign_finding(host: str, gpus: list[dict], job_pids: frozenset[int]) -> Finding | None:
    """GPUs held by processes no fleetops job started (nor left behind)."""
    foreign = [
        (g, p)
        for g in gpus
        for p in g.get("processes", [])
        if not p.get("job") and p["pid"] not in job_pids
    ]
    if not foreign:
        return None
    held = ", ".join(
        f"GPU {g['index']}: pid {p['pid']} {p.get('name')} {p.get('used_mib')} MiB, user "
        f"{p.get('user') or '?'}"
        for g, p in foreign
    )
    return FOREIGN_GPU_PROCESSES(
        f"GPUs held by processes that are not a fleetops job: {held}",
        _fab(host, "gpu"),
        details={"foreign": [p for _, p in foreign]},
    )


def _health_finding(host: str, h: Any) -> Finding:
    """One GPU's ECC / retired pages / row remapping / throttling problem."""
    label = f"gpu{h.gpu.index}" if h.gpu.index is not None else "gpu"
    kind = GPU_HEALTH_CRITICAL if h.severity is CRITICAL else GPU_HEALTH_WARN
    return kind(
        f"GPU {h.gpu.index} ({h.gpu.bus_id}): {h.what}: {h.action}",
        _run_cmd(
            host,
            f"nvidia-smi -q -i {_q(h.gpu.index)} -d ECC,PAGE_RETIREMENT,ROW_REMAPPER,PERFORMANCE",
        ),
        area=label,
    )


def _health_findings(host: str, xml: dict) -> tuple[list[Finding], list[Any]]:
    """The findings of `nvidia-smi -q -x` and the per-GPU health they were drawn from."""
    from ..plans.gpuhealth import HealthParseError, assess, parse_health_xml  # xml.etree

    if xml.get("error"):
        unread = f"ECC / retired pages / row remapping not read: {xml['error']}"
        return [GPU_HEALTH_UNREAD(unread, _run_cmd(host, "nvidia-smi -q -x | head"))], []
    if not xml.get("xml"):
        return [], []
    out: list[Finding] = []
    try:
        health = parse_health_xml(xml["xml"])
    except HealthParseError as exc:
        out.append(
            GPU_HEALTH_UNREAD(
                f"nvidia-smi -q -x unreadable: {exc}", _run_cmd(host, "nvidia-smi -q -x | head")
            )
        )
        health = []
    out.extend(_health_finding(host, h) for h in assess(health))
    return out, health


def _gpus_fine(host: str, gpus: list[dict], health: list[Any]) -> Finding:
    vol = sum(h.ecc.get("volatile", {}).get("uncorrectable", 0) for h in health)
    names = ", ".join(sorted({str(g.get("name")) for g in gpus}))
    return GPUS_FINE(
        f"{len(gpus)} GPUs ({names}), {vol} uncorrectable ECC errors, no pending remap or "
        "retirement, no hardware throttling",
        _fab(host, "gpu"),
    )


def gpu_findings(
    host: str, expected: int | None, snap: dict, xml: dict, job_pids: frozenset[int] = frozenset()
) -> tuple[list[Finding], dict[str, int]]:
    """GPU count against the inventory, values nvidia-smi could not read, foreign holders (the job's
    own processes, even those an ended job left behind, are the processes finding's),
    ECC/remap/throttle."""
    unusable = _smi_unusable(host, snap)
    if unusable is not None:
        return [unusable], {}
    gpus = snap.get("gpus", [])
    out = _gpu_count_findings(host, expected, gpus)
    foreign = _foreign_finding(host, gpus, job_pids)
    if foreign is not None:
        out.append(foreign)
    health_out, health = _health_findings(host, xml)
    out.extend(health_out)
    if health and not any(f.area.startswith("gpu") and f.verdict != OK for f in out):
        out.append(_gpus_fine(host, gpus, health))
    return out, _index_by_bus(gpus)


def drain_finding(host: str, marker: dict | None) -> Finding | None:
    """A node marked drained: nothing new runs there (extract and patch refuse) until it is
    undrained."""
    if not marker:
        return None
    return DRAINED(
        f"drained by {marker.get('by', '?')} at {marker.get('at', '?')}: "
        f"{marker.get('reason') or '?'}; extract and patch refuse here",
        _fab(host, "undrain"),
        details={"drain": marker},
    )


def _disk_finding(host: str, d: dict) -> tuple[Finding | None, str]:
    """A full or low filesystem's finding, else None and its words on the healthy line."""
    free_pct = 100 * d["free_bytes"] / d["total_bytes"]
    inode_pct = 100.0
    if d.get("inodes_total"):
        inode_pct = 100 * d["inodes_free"] / d["inodes_total"]
    free_gib = f"{d['free_bytes'] / 2**30:.1f}"
    text = (
        f"{d['label']} {d['path']}: {free_gib} GiB free ({free_pct:.0f}%), "
        f"inodes {inode_pct:.0f}% free"
    )
    nxt = _run_cmd(host, f"df -h {_q(d['path'])}; df -i {_q(d['path'])}")
    if free_pct < 1 or inode_pct < 1:
        return DISK_FULL(text, nxt), ""
    if free_pct < 5 or inode_pct < 5 or d["free_bytes"] < 2 * 2**30:
        return DISK_LOW(text, nxt), ""
    return None, f"{d['label']} {free_gib} GiB ({free_pct:.0f}%, inodes {inode_pct:.0f}%)"


def _disk_findings(host: str, disks: list) -> list[Finding]:
    """One finding per full or low filesystem, and the healthy ones on one line."""
    out: list[Finding] = []
    fine: list[str] = []
    for d in disks if isinstance(disks, list) else []:
        if d.get("error") or not d.get("total_bytes"):
            continue
        finding, words = _disk_finding(host, d)
        if finding is not None:
            out.append(finding)
        else:
            fine.append(words)
    if fine:
        out.append(DISKS_FINE("free: " + ", ".join(fine), _run_cmd(host, "df -h; df -i")))
    return out


def _memory_finding(host: str, load: dict) -> Finding | None:
    mem = load.get("memory_kb") or {}
    if not mem.get("MemTotal"):
        return None
    pct = 100 * mem.get("MemAvailable", 0) / mem["MemTotal"]
    text = (
        f"memory: {mem.get('MemAvailable', 0) / 2**20:.1f} "
        f"of {mem['MemTotal'] / 2**20:.1f} GiB available"
    )
    kind = MEMORY_LOW if pct < 5 else MEMORY_FINE
    return kind(text, _run_cmd(host, "free -m; ps aux --sort=-rss | head"))


def _load_finding(host: str, load: dict) -> Finding | None:
    if not (load.get("load") and load.get("cpus")):
        return None
    text = f"load {' '.join(str(x) for x in load['load'])} on {load['cpus']} CPUs"
    kind = LOAD_HIGH if load["load"][0] > 2 * load["cpus"] else LOAD_FINE
    return kind(text, _run_cmd(host, "top -bn1 | head -20"))


def resource_findings(host: str, disks: list, load: dict) -> list[Finding]:
    out = _disk_findings(host, disks)
    if not isinstance(load, dict):
        return out
    for finding in (_memory_finding(host, load), _load_finding(host, load)):
        if finding is not None:
            out.append(finding)
    return out


def clock_finding(
    host: str, node_epoch: float | None, sent: float, received: float
) -> Finding | None:
    """The node's clock against this machine's, within the call's round trip."""
    if node_epoch is None:
        return None
    if sent <= node_epoch <= received:
        return CLOCK_IN_STEP(
            f"in step with this machine (within the call's {received - sent:.1f}s)",
            _run_cmd(host, "timedatectl"),
        )
    skew = node_epoch - sent if node_epoch < sent else node_epoch - received
    kind = CLOCK_SKEWED if abs(skew) > SKEW_WARN_S else CLOCK_IN_STEP
    side = "behind" if skew < 0 else "ahead of"
    return kind(
        f"node clock {abs(skew):.1f}s {side} this machine",
        _run_cmd(host, "timedatectl; chronyc tracking"),
    )


def kernel_findings(
    host: str, kernel: dict, index_by_bus: dict[str, int]
) -> tuple[list[Finding], list[OomKill]]:
    if kernel.get("error"):
        return [
            KERNEL_LOG_UNREAD(
                f"Xid and OOM events not checked: {kernel['error']}",
                _run_cmd(host, "sudo dmesg | grep -E 'NVRM: Xid|Killed process' | tail -20"),
            )
        ], []
    from ..plans.kernellog import parse_ooms, parse_xids, slurm_oom_events

    boot = kernel.get("boot_time")
    lines = kernel.get("lines", [])
    out = xid_findings(host, parse_xids(lines, boot), index_by_bus)
    report = parse_ooms(lines, boot)
    if not out:
        out.append(
            NO_XID(
                f"no NVIDIA Xid in the kernel log ({kernel.get('source')}, "
                f"{kernel.get('total_lines')} lines)",
                _run_cmd(host, "dmesg | tail -50"),
            )
        )
    for count, step in slurm_oom_events(report.other):
        out.append(
            SLURM_OOM(
                f"Slurm saw {count} OOM kill(s) in {step}", _run_cmd(host, "dmesg | tail -50")
            )
        )
    return out, report.kills


def oom_elsewhere(host: str, job: dict, kills: list[OomKill], earlier: object) -> list[Finding]:
    """OOM kills that are not the latest job's: an earlier job of this node (its record names the
    pid, or it was SIGKILLed while the kill happened), else a process that is no fleetops job of
    this node."""
    from ..plans.kernellog import OOM_ADVICE, evidence_lines, match_oom, oom_text

    others = match_oom(kills, job)[1] if not job.get("error") else kills
    records = [e for e in earlier if isinstance(e, dict)] if isinstance(earlier, list) else []
    out = []
    for k in others:
        owner = next((e for e in records if match_oom([k], e)[0]), None)
        evidence = {"lines": evidence_lines(k)}
        if owner is not None:
            latest = (
                f"; the latest job is {job.get('id')} ({job.get('state')})" if job.get("id") else ""
            )
            out.append(
                OOM_EARLIER_JOB(
                    f"the kernel OOM killer killed an earlier job of this node, "
                    f"{owner.get('id')}: {oom_text(k)}{latest}",
                    _fab(host, "logs", "--job-id", str(owner.get("id"))),
                    details={**evidence, "job_id": owner.get("id")},
                    why=OOM_ADVICE,
                )
            )
        else:
            out.append(
                OOM_NO_JOB(
                    f"the OOM killer killed {oom_text(k)} (no fleetops job of this node)",
                    _run_cmd(host, "dmesg | grep -B5 -A20 'invoked oom-killer' | tail -60"),
                    details=evidence,
                )
            )
    return out


def _patch_finding(name: str, answer: dict, book: Playbook | None) -> Finding:
    """The patch's state, judged against what the playbook allows (prereleases, its requires)."""
    allow = bool(book and book.allow_prereleases)
    patch = answer.get("patch")
    if isinstance(patch, dict):
        patch = judged_patch(patch, allow, book.requires_hint if book else "")
    return patch_state(name, judged_checks(answer.get("checks") or {}, allow), patch)


def _job_patterns(host: Host, job: dict, book: Playbook | None) -> tuple[Any, list[Any]]:
    """The progress and failure patterns of the job's spec in the playbook, else the defaults."""
    jobs = (book.jobs if book is not None else None) or {}
    if job.get("name") in jobs:
        try:
            spec = resolve(job["name"], jobs[job["name"]], host.groups)
            return spec.progress, spec.failures
        except ConfigError:
            pass
    return re.compile(DEFAULT_PROGRESS), [re.compile(p) for p in DEFAULT_FAILURES]


def assess_answer(
    host: Host, answer: dict, sent: float, received: float, book: Playbook | None
) -> list[Finding]:
    name = host.name
    findings: list[Finding] = []
    clock = answer.get("clock") or {}
    f = clock_finding(name, clock.get("epoch"), sent, received)
    if f:
        findings.append(f)
    findings.append(_patch_finding(name, answer, book))
    drained = drain_finding(name, answer.get("drain"))
    if drained:
        findings.append(drained)
    job_pids = frozenset(
        int(p["pid"]) for p in answer.get("processes") or [] if isinstance(p, dict)
    )
    gpu_f, index_by_bus = gpu_findings(
        name, host.gpus, answer.get("gpu") or {}, answer.get("smi_xml") or {}, job_pids
    )
    findings += gpu_f
    kernel = {**(answer.get("kernel") or {}), "boot_time": clock.get("boot_time")}
    kern_f, kills = kernel_findings(name, kernel, index_by_bus)
    findings += kern_f
    job = with_state(answer.get("job") or {}, clock.get("epoch"))
    progress_rx, failure_rxs = _job_patterns(host, job, book)
    findings += job_findings(name, job, kills, not kernel.get("error"), progress_rx, failure_rxs)
    findings += oom_elsewhere(name, job, kills, answer.get("earlier_jobs"))
    findings += process_findings(name, job, answer.get("processes") or [])
    findings += resource_findings(name, answer.get("disk") or [], answer.get("host") or {})
    return sorted(findings, key=lambda x: x.order)


def verdict_of(findings: list[Finding]) -> Severity:
    return max((f.verdict for f in findings), default=OK)


def _headline(findings: list[Finding], verdict: Severity, top: Finding | None) -> str:
    """The worst finding's words, and how many more are not OK."""
    if top is None or verdict == OK:
        return f"{verdict}: nothing wrong found"
    others = sum(1 for f in findings if f.verdict != OK) - 1
    more = f" (+{others} more)" if others > 0 else ""
    return f"{verdict}: {top.msg}{more}"


def _summary_row(host: str, verdict: Severity, top: Finding | None) -> SummaryRow:
    """One row of a fleet summary (host, verdict, what, the worst finding, its first command), for
    report/."""
    if top is None:
        return SummaryRow(host, verdict, "-", "-", "-")
    return SummaryRow(host, verdict, top.area, top.msg, top.next[0] if top.next else "-")


def _result(
    host: str,
    findings: list[Finding],
    error_kind: str | None = None,
    reach: dict | None = None,
    node: dict | None = None,
    refused: bool = False,
) -> Result:
    """Each finding an item (its verdict word, what was found, its next commands); report/ shows the
    ones that are not OK, and -v all of them."""
    verdict = verdict_of(findings)
    top = next((f for f in findings if f.verdict == verdict), None)
    items = [
        Item(
            f.area,
            Status.OK if f.verdict == OK else Status.FAILED,
            f.msg,
            {"verdict": f.verdict, "next": Next(f.why, f.next)},
        )
        for f in findings
    ]
    # Counted as its exit status says (20-22 is a failed host in the recap too), as `gpu` counts its
    # WARN.
    status = Status.OK if verdict == OK else Status.FAILED
    summary_row = _summary_row(host, verdict, top)
    payload: Diagnosis
    if node is not None:
        payload = NodeDiagnosis(verdict, list(findings), summary_row, reach=reach, **node)
    elif refused:
        payload = RefusedDiagnosis(verdict, list(findings), summary_row, error_kind=error_kind)
    else:
        payload = Diagnosis(
            verdict, list(findings), summary_row, error_kind=error_kind, reach=reach
        )
    msg = _headline(findings, verdict, top)
    return Result(host, "diagnose", status, msg, items, code=EXIT_FOR[verdict], payload=payload)


# ---------------------------------------------------------------- the task
def plan(run: RunState, kwargs: dict) -> Plan:
    """diagnose's plan (declared in deferred.py): the playbook's fast checks and its patch check,
    when it has them; a playbook named on the command line that cannot be read is a usage error,
    before anything connects."""
    book = None
    try:
        book = run.playbook(kwargs.get("playbook"))
    except ConfigError:
        if kwargs.get("playbook"):
            raise  # named on the command line: a bad one is a usage error, before anything connects
    request = (
        book.verify_request(FAST_KINDS) if book is not None else {"requires": [], "checks": []}
    )
    if book is not None and book.patches:
        request["patch"] = book.patch_request(check=True)
    return Plan("diagnose", request, 300, book)


def run_diagnose(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host
    started = time.monotonic()
    opener = getattr(node, "open", None)
    try:
        if callable(opener):
            opener()
        connect_s = time.monotonic() - started
        sent = time.time()
        # squeue/sacct for a Slurm job
        env = {k: v for k, v in host.env_values if k.startswith("SLURM_")}
        answer, evidence = node.call(
            "diagnose",
            {**plan.request, "scheduler_env": env} if env else plan.request,
            timeout=plan.timeout,
        )
        received = time.time()
    except TransportError as exc:
        f = NOT_REACHED(
            f"not reached after {time.monotonic() - started:.1f}s: {exc}", _fab(host.name, "ping")
        )
        result = _result(
            host.name,
            [f],
            exc.kind,
            {"reached": False, "seconds": round(time.monotonic() - started, 3)},
        )
        result.status = Status.UNREACHABLE if exc.kind in UNREACHABLE_KINDS else Status.FAILED
        result.evidence = exc.evidence
        return result
    total = time.monotonic() - started
    if answer.get("error"):
        f = AGENT_FAILED(
            f"the node agent could not diagnose: {answer['error']}", _fab(host.name, "ping")
        )
        result = _result(host.name, [f], answer.get("error_kind"), refused=True)
        result.evidence = evidence
        return result
    findings = assess_answer(host, answer, sent, received, plan.playbook)
    backend = backend_for(host)
    if backend.allocates:  # a login node: where our job's allocation is says more than its own GPUs
        note = backend.allocation_note(node)
        # A controller that cannot be reached leaves the job's state unknown: never an OK line.
        blind = bool(note and note.details.get("controller"))
        if note is None:
            findings.append(
                SLURM_NO_JOB(
                    "no job of fleetops queued or running here", _fab(host.name, "extract")
                )
            )
        else:
            kind, task = (SLURM_UNANSWERED, "status") if blind else (SLURM_ALLOCATION, "gpu")
            findings.append(kind(note.msg, _fab(host.name, task), details=dict(note.details)))
    on_node = answer.get("seconds")
    reach = f"reached in {connect_s:.2f}s, answered in {total:.1f}s" + (
        f" ({on_node}s on the node)" if on_node else ""
    )
    findings.insert(0, REACHED(reach, _fab(host.name, "ping")))
    findings.sort(key=lambda x: x.order)
    result = _result(
        host.name,
        findings,
        reach={
            "reached": True,
            "connect_s": round(connect_s, 3),
            "total_s": round(total, 3),
            "node_s": on_node,
        },
        node={
            "kernel_source": (answer.get("kernel") or {}).get("source"),
            "simulated": bool(host.lab),
        },
    )
    if host.lab:
        result.msg += " (lab: simulated GPUs and kernel log)"
    # no evidence block: the findings are the evidence, the agent itself answered fine
    return result
