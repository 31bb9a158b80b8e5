"""Kernel-log lines, parsed: NVIDIA Xid events and OOM-killer kills. Pure functions (lines in,
dataclasses out), no network, no printing.

The node sends the kernel log's relevant lines as it read them (`dmesg`, or `journalctl -k` where
dmesg is not readable: remote_scripts/health/diagnose.py); the parsing happens here, on the client,
so it is tested on recorded real lines (tests/fixtures/kernel-log/). Formats understood, per line:

    [93297.027938] NVRM: Xid ...                          dmesg: seconds since boot
    [Mon May 18 19:02:39 2026] NVRM: Xid ...              dmesg -T
    2026-05-18T19:02:39+0000 gpu01 kernel: NVRM: Xid ...   journalctl -k -o short-iso
    May 18 19:02:39 gpu01 kernel: NVRM: Xid ...            journalctl -k / syslog (host optional)
    kernel: NVRM: Xid ...                                  bare
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

# ---------------------------------------------------------------- the Xid catalog (the common
# codes)
CRITICAL = "CRITICAL"
WARN = "WARN"
INFO = "INFO"


@dataclass(frozen=True)
class XidInfo:
    name: str
    # CRITICAL: the GPU (or node) needs a reset/reboot/RMA; WARN: an application fault, watch it
    severity: str
    action: str  # what to do, from NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors)
    reset: bool = False  # the documented action resets the GPU (or reboots the machine)


XID_CODES: dict[int, XidInfo] = {
    13: XidInfo(
        "Graphics Engine Exception",
        WARN,
        "usually the application (an out-of-range access); restart it. If it repeats on this GPU "
        "with different applications, run the GPU's diagnostics",
    ),
    31: XidInfo(
        "GPU memory page fault",
        WARN,
        (
            "usually the application (an illegal address); "
            "restart it. Repeats on one GPU: run diagnostics"
        ),
    ),
    32: XidInfo(
        "Invalid or corrupted push buffer stream",
        WARN,
        "restart the application; repeats: check the driver, PCIe and the GPU",
    ),
    38: XidInfo(
        "Driver firmware error",
        CRITICAL,
        "reset the GPU; repeats: update the driver, then RMA",
        reset=True,
    ),
    43: XidInfo(
        "GPU stopped processing",
        WARN,
        "the application hit a fault and its GPU context was stopped; the GPU itself is fine "
        "(NVIDIA: ignore); look at the application's own error",
    ),
    45: XidInfo(
        "Preemptive cleanup, due to previous errors",
        WARN,
        "a consequence of another Xid (often named on the line) or of the application being "
        "killed: follow the earlier Xid",
    ),
    48: XidInfo(
        "Double Bit ECC Error (DBE)",
        CRITICAL,
        "uncorrectable memory error: drain the GPU, check retired pages / row remapping, reset "
        "the GPU when idle; repeats: RMA",
        reset=True,
    ),
    61: XidInfo(
        "Internal micro-controller breakpoint/warning",
        WARN,
        "reset the GPU when idle; repeats: update the driver, then RMA",
        reset=True,
    ),
    62: XidInfo(
        "Internal micro-controller halt",
        CRITICAL,
        "reset the GPU (or reboot); repeats: RMA",
        reset=True,
    ),
    63: XidInfo(
        "ECC page retirement or row remapping recording event",
        WARN,
        "a memory row was marked for remapping: reset the GPU when idle to activate it (NVIDIA: no "
        "other action)",
        reset=True,
    ),
    64: XidInfo(
        "ECC page retirement or row remapper recording failure",
        CRITICAL,
        "the remapping could not be recorded: reset the GPU; repeats: RMA",
        reset=True,
    ),
    68: XidInfo("NVDEC0 Exception", WARN, "a video decoder fault: restart the application"),
    69: XidInfo("Graphics Engine class error", WARN, "restart the application"),
    74: XidInfo(
        "NVLink Error",
        CRITICAL,
        "check the NVLink error counters (nvidia-smi nvlink -e), reset the GPUs of the link; "
        "repeats: reseat or RMA",
        reset=True,
    ),
    79: XidInfo(
        "GPU has fallen off the bus",
        CRITICAL,
        "the GPU no longer answers on PCIe: drain the node and reboot it (a GPU reset is not "
        "enough); check power, cooling and the PCIe link; repeats: RMA",
        reset=True,
    ),
    92: XidInfo(
        "High single-bit ECC error rate",
        WARN,
        "correctable errors at a high rate: watch the ECC counters; NVIDIA: no action needed",
    ),
    94: XidInfo(
        "Contained ECC error",
        WARN,
        "an uncorrectable memory error was contained to one application: restart that "
        "application; the GPU goes on (reset it when idle to retire the row)",
    ),
    95: XidInfo(
        "Uncontained ECC error",
        CRITICAL,
        "an uncorrectable memory error could not be contained: every application on the GPU is "
        "affected; reset the GPU",
        reset=True,
    ),
    109: XidInfo(
        "Context Switch Timeout Error", WARN, "restart the application; repeats: reset the GPU"
    ),
    119: XidInfo(
        "GSP RPC Timeout",
        CRITICAL,
        "the GPU's system processor stopped answering: reset the GPU "
        "(or reboot); repeats: update the driver",
        reset=True,
    ),
    120: XidInfo(
        "GSP Error", CRITICAL, "reset the GPU (or reboot); repeats: update the driver", reset=True
    ),
    121: XidInfo("C2C link error", CRITICAL, "reset the GPU; repeats: RMA", reset=True),
    140: XidInfo("Unrecovered ECC error", CRITICAL, "reset the GPU; repeats: RMA", reset=True),
    154: XidInfo(
        "GPU recovery action changed",
        INFO,
        "informational: the driver says what recovery the GPU needs now (see the line)",
    ),
}


def xid_info(code: int) -> XidInfo:
    return XID_CODES.get(
        code,
        XidInfo(
            f"Xid {code} (not in fleetops' table)",
            WARN,
            "look it up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors)",
        ),
    )


# ---------------------------------------------------------------- one line
_MONO = re.compile(r"^\[\s*(\d+\.\d+)\]\s?")
_CTIME = re.compile(r"^\[([A-Z][a-z]{2} [A-Z][a-z]{2}\s+\d+ \d\d:\d\d:\d\d \d{4})\]\s?")
_ISO = re.compile(
    r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s+(?:(\S+)\s+)?kernel:\s?"
)
_SYSLOG = re.compile(r"^([A-Z][a-z]{2}\s+\d+ \d\d:\d\d:\d\d)\s+(?:(\S+)\s+)?kernel:\s?")
_BARE = re.compile(r"^kernel:\s?")


@dataclass
class KernelLine:
    text: str  # the line as read
    message: str  # without its time/host prefix
    mono_s: float | None = None  # seconds since boot (dmesg)
    stamp: str | None = None  # the wall-clock text the line carried (journalctl, syslog, dmesg -T)
    # wall clock, when known (an ISO stamp, or mono_s + the node's boot time)
    epoch: float | None = None


def parse_line(text: str, boot_time: float | None = None) -> KernelLine:
    line = text.rstrip("\n")
    m = _MONO.match(line)
    if m:
        mono = float(m.group(1))
        return KernelLine(
            line,
            line[m.end() :],
            mono_s=mono,
            epoch=boot_time + mono if boot_time is not None else None,
        )
    m = _CTIME.match(line)
    if m:
        return KernelLine(
            line,
            line[m.end() :],
            stamp=m.group(1),
            epoch=_epoch(m.group(1), "%a %b %d %H:%M:%S %Y"),
        )
    m = _ISO.match(line)
    if m:
        return KernelLine(line, line[m.end() :], stamp=m.group(1), epoch=_iso_epoch(m.group(1)))
    m = _SYSLOG.match(line)
    if m:
        return KernelLine(line, line[m.end() :], stamp=m.group(1))  # no year: no epoch
    m = _BARE.match(line)
    return KernelLine(line, line[m.end() :] if m else line)


def _epoch(text: str, fmt: str) -> float | None:
    try:
        return datetime.strptime(" ".join(text.split()), fmt).timestamp()
    except ValueError:
        return None


def _iso_epoch(text: str) -> float | None:
    text = text.replace(",", ".")
    if re.search(r"[+-]\d{4}$", text):
        text = text[:-2] + ":" + text[-2:]
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# ---------------------------------------------------------------- PCI bus ids
_BUS = re.compile(
    r"(?:PCI:)?(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?$"
)


def bus_key(bus_id: str | None) -> str | None:
    """One spelling for a GPU's PCI address, whoever printed it: nvidia-smi's "00000000:2B:00.0",
    the Xid line's "PCI:0000:2b:00", lspci's "2b:00.0" all become "0000:2b:00"
    (domain:bus:device)."""
    if not bus_id:
        return None
    m = _BUS.search(bus_id.strip())
    if not m:
        return None
    domain = int(m.group(1), 16) if m.group(1) else 0
    return f"{domain:04x}:{m.group(2).lower()}:{m.group(3).lower()}"


# ---------------------------------------------------------------- Xid
_XID = re.compile(r"NVRM: Xid \(([^)]*)\):\s*(\d+)\s*(?:,\s*(.*))?$")
_XID_PID = re.compile(r"^pid='?([^,']*)'?,\s*(?:name=([^,]*),\s*)?")


@dataclass
class XidEvent:
    code: int
    bus_id: str | None  # bus_key() form
    pci: str  # as the line wrote it
    pid: int | None
    process: str | None
    detail: str
    line: KernelLine

    @property
    def info(self) -> XidInfo:
        return xid_info(self.code)


def parse_xid(line: KernelLine) -> XidEvent | None:
    m = _XID.search(line.message)
    if not m:
        return None
    rest = (m.group(3) or "").strip()
    pid: int | None = None
    process: str | None = None
    pm = _XID_PID.match(rest)
    if pm:
        pid = int(pm.group(1)) if pm.group(1).isdigit() else None
        name = (pm.group(2) or "").strip()
        process = name if name and name != "<unknown>" else None
        rest = rest[pm.end() :]
    return XidEvent(
        int(m.group(2)), bus_key(m.group(1)), m.group(1), pid, process, rest.strip(), line
    )


def parse_xids(lines: list[str], boot_time: float | None = None) -> list[XidEvent]:
    out = []
    for text in lines:
        event = parse_xid(parse_line(text, boot_time))
        if event is not None:
            out.append(event)
    return out


# ---------------------------------------------------------------- OOM killer
_KILLED = re.compile(
    r"(?:(Memory cgroup out of memory|Out of memory(?: \(oom_kill_allocating_task\))?): )?"
    r"Kill(?:ed)? process (\d+) \(([^)]*)\)(.*)$"
)
_CONTEXT = re.compile(r"oom-kill:(\S+)")
_INVOKED = re.compile(r"^(.+?) invoked oom-killer: (.*)$")
_KB = re.compile(r"([a-z_-]+):(\d+)kB")
_SLURM = re.compile(r"Detected (\d+) oom[-_]kill event\(s\) in (?:StepId=)?(\S+?)\.? cgroup")


@dataclass
class OomKill:
    pid: int
    process: str
    # a memory cgroup's limit (a container, a Slurm job), not the whole machine's memory
    cgroup_oom: bool
    # total-vm, anon-rss, file-rss, shmem-rss, pgtables
    rss_kb: dict[str, int] = field(default_factory=dict)
    uid: int | None = None
    constraint: str | None = None  # CONSTRAINT_NONE (global), CONSTRAINT_MEMCG, ...
    memcg: str | None = None  # the killed task's memory cgroup
    invoked_by: str | None = None  # the process whose allocation triggered the killer
    lines: list[KernelLine] = field(default_factory=list)

    @property
    def epoch(self) -> float | None:
        return next((ln.epoch for ln in self.lines if ln.epoch is not None), None)

    @property
    def anon_rss_mib(self) -> int | None:
        kb = self.rss_kb.get("anon-rss")
        return kb // 1024 if kb is not None else None


@dataclass
class OomReport:
    kills: list[OomKill]
    # OOM lines that name no killed process (Slurm's summary, an invoker alone)
    other: list[KernelLine]


def parse_ooms(lines: list[str], boot_time: float | None = None) -> OomReport:
    """Every OOM kill, its context and invoker lines joined to it (the kernel prints, in order: `X
    invoked oom-killer`, the memory report, `oom-kill:...,pid=N,...`, then `Out of memory: Killed
    process N`). Older kernels print `Kill process N (x) score S or sacrifice child` then `Killed
    process N (x) ...`."""
    reader = _OomReader()
    for text in lines:
        reader.read(parse_line(text, boot_time))
    return OomReport([reader.kills[p] for p in reader.order], reader.other)


class _OomReader:
    """One pass over the log: the kills in the order of their kill lines, context lines that wait
    for their kill line, the last `invoked oom-killer` line, and the other OOM lines."""

    def __init__(self) -> None:
        self.kills: dict[int, OomKill] = {}
        self.order: list[int] = []
        self.other: list[KernelLine] = []
        self.pending_context: dict[int, tuple[dict[str, str], KernelLine]] = {}
        self.invoker: tuple[str, KernelLine] | None = None

    def read(self, line: KernelLine) -> None:
        handlers = ((_INVOKED, self._invoked), (_CONTEXT, self._context), (_KILLED, self._killed))
        for pattern, handle in handlers:
            m = pattern.search(line.message)
            if m:
                handle(m, line)
                return
        if _SLURM.search(line.message) or "oom" in line.message.lower():
            self.other.append(line)

    def _invoked(self, m: re.Match[str], line: KernelLine) -> None:
        self.invoker = (m.group(1).strip(), line)

    def _context(self, m: re.Match[str], line: KernelLine) -> None:
        ctx = dict(part.split("=", 1) for part in m.group(1).split(",") if "=" in part)
        if not ctx.get("pid", "").isdigit():
            return
        kill = self.kills.get(int(ctx["pid"]))
        if kill is None:  # the usual order: the context line comes before the kill line
            self.pending_context[int(ctx["pid"])] = (ctx, line)
        else:
            _apply_context(kill, ctx, line)

    def _killed(self, m: re.Match[str], line: KernelLine) -> None:
        pid = int(m.group(2))
        kill = self.kills.get(pid)
        if kill is None:
            kill = self.kills[pid] = OomKill(pid, m.group(3), cgroup_oom=False)
            self.order.append(pid)
        if m.group(1) and m.group(1).startswith("Memory cgroup"):
            kill.cgroup_oom = True
        for key, value in _KB.findall(m.group(4)):
            kill.rss_kb[key] = int(value)
        um = re.search(r"UID:(\d+)", m.group(4))
        if um:
            kill.uid = int(um.group(1))
        if self.invoker is not None and kill.invoked_by is None:
            kill.invoked_by = self.invoker[0]
            kill.lines.insert(0, self.invoker[1])
        pending = self.pending_context.pop(pid, None)
        if pending is not None:
            _apply_context(kill, *pending)
        kill.lines.append(line)


def _apply_context(kill: OomKill, ctx: dict[str, str], line: KernelLine) -> None:
    kill.constraint = ctx.get("constraint") or kill.constraint
    kill.memcg = ctx.get("task_memcg") or kill.memcg
    if kill.constraint == "CONSTRAINT_MEMCG":
        kill.cgroup_oom = True
    if ctx.get("uid", "").isdigit() and kill.uid is None:
        kill.uid = int(ctx["uid"])
    kill.lines.append(line)


def slurm_oom_events(lines: list[KernelLine]) -> list[tuple[int, str]]:
    """Slurm's own lines about OOM kills in a job's cgroup: (count, step)."""
    out = []
    for line in lines:
        m = _SLURM.search(line.message)
        if m:
            out.append((int(m.group(1)), m.group(2)))
    return out


# ---------------------------------------------------------------- whose kill: a job's, by its
# record
def when(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def job_pids(job: dict[str, Any]) -> set[int]:
    """The pids a job record names: its main process and its wrapper."""
    return {int(p) for p in (job.get("pid"), job.get("wrapper_pid")) if p}


def match_oom(
    kills: list[OomKill], job: dict[str, Any], pids: set[int] | None = None
) -> tuple[list[OomKill], list[OomKill]]:
    """(kills of the job's processes, other kills). A kill names the job when its pid is the job's
    main process or one of its live processes (`pids`; the record's own when None), or when it
    happened during the job's run (a worker the job started: its pid is not recorded) and the job
    ended by SIGKILL."""
    pids = job_pids(job) if pids is None else pids
    ours, others = [], []
    started = job.get("started_ts")
    ended = (job.get("exit") or {}).get("ended_ts")
    killed = (job.get("exit") or {}).get("signal") == 9 or job.get("state") == "lost"
    for k in kills:
        in_window = (
            started is not None
            and k.epoch is not None
            and started - 1 <= k.epoch
            and (ended is None or k.epoch <= ended + 5)
        )
        if k.pid in pids or (killed and in_window):
            ours.append(k)
        else:
            others.append(k)
    return ours, others


def oom_text(k: OomKill) -> str:
    """`pid 4242 (python, anon-rss 25 MiB; the machine's memory) at 2026-12-02 07:19:58 UTC`."""
    rss = f", anon-rss {k.anon_rss_mib} MiB" if k.anon_rss_mib is not None else ""
    scope = "its memory cgroup's limit" if k.cgroup_oom else "the machine's memory"
    return f"pid {k.pid} ({k.process}{rss}; {scope}) at {when(k.epoch) or 'an unknown time'}"


OOM_ADVICE = (
    "read the end of its log; then give the job less to hold in memory (batch size, "
    "max_model_len) or a node with more, and extract again"
)


def sigkill_note(kernel_read: bool) -> str:
    """What a SIGKILL no OOM-killer line names says about its cause."""
    if kernel_read:
        return "no OOM-killer line in the kernel log names it: a kill -9, or `stop`"
    return "the kernel log could not be read, so an OOM kill cannot be ruled out"


def oom_of_job(kernel: dict[str, Any], job: dict[str, Any]) -> OomKill | None:
    """The kill among the kernel log's lines (an answer of the agent's kernel reader, with its
    boot_time) that took this job: its main process's when there is one, else the first of its
    run."""
    if kernel.get("error") or not kernel.get("lines"):
        return None
    ours, _ = match_oom(parse_ooms(kernel["lines"], kernel.get("boot_time")).kills, job)
    return next((k for k in ours if k.pid == job.get("pid")), ours[0] if ours else None)


def evidence_lines(k: OomKill) -> list[str]:
    """The kernel's own lines of one kill, as read (the evidence an operator can grep for)."""
    return [ln.text for ln in k.lines]
