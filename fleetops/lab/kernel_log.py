"""A lab node's simulated kernel log, so `diagnose` can be tried and tested end to end:
<node>/kernel.log holds the node's "ring buffer" (dmesg's own format, `[seconds since boot]
message`), and stand-ins for `dmesg` and `journalctl` in <node>/bin (first on the node's PATH, as
the simulated nvidia-smi is) print it.

What can be put in it (`fab lab.kernel`):
  --xid 79 --gpu 1   an NVIDIA Xid line for a simulated GPU, with that GPU's real recorded PCI bus
                     id
  --oom              the OOM killer takes the node's running fleetops job: its main process is
                     really SIGKILLed and the kernel's three lines (invoker, oom-kill context, "Out
                     of memory: Killed process") are appended, naming its pid, command and memory as
                     /proc showed them just before
  --readable dmesg|journal|denied
                     dmesg readable (the default); dmesg refused as with kernel.dmesg_restrict=1 but
                     `journalctl -k` readable; both refused (diagnose then says UNKNOWN for the
                     kernel log)
  --clear            an empty log
"""

from __future__ import annotations

import json
import os
import signal
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from ..agent.core.procfs import stat_fields, uptime
from .common import LabError
from .node import Node

READABLE = ("dmesg", "journal", "denied")
RECORDED_XML = Path(__file__).resolve().parent / "recordings" / "h200x2" / "busy_q.xml"
# What the driver prints after the Xid code, for the codes the lab injects (texts as in the public
# examples).
XID_TEXT = {
    79: "GPU has fallen off the bus.",
    13: "Graphics Exception: ESR 0x52e7b0=0x101000e 0x52e7b4=0x4",
    31: (
        "Ch 00000010, intr 10000000. MMU Fault: ENGINE "
        "GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_00000000."
    ),
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    94: "Contained: CE User Channel (0x9). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
}

# The stand-ins, copied to <node>/bin and run by the node's own python. Standalone: they read
# kernel.json and kernel.log next to bin/ and import nothing of fleetops.
_DMESG = """
import json, sys
from pathlib import Path
HERE = Path(__file__).resolve().parent.parent
mode = json.loads((HERE / "kernel.json").read_text()).get("readable", "dmesg")
if mode != "dmesg":
    sys.stderr.write("dmesg: read kernel buffer failed: Operation not permitted\\n")
    sys.exit(1)
sys.stdout.write((HERE / "kernel.log").read_text())
"""
_JOURNALCTL = """
import json, socket, sys, time
from datetime import datetime, timezone
from pathlib import Path
HERE = Path(__file__).resolve().parent.parent
mode = json.loads((HERE / "kernel.json").read_text()).get("readable", "dmesg")
if mode == "denied":
    sys.stderr.write("Hint: You are currently not seeing messages from other users and the \
system.\\n"
                     "      Users in groups 'adm', 'systemd-journal' can see all messages.\\n"
                     "      Pass -q to turn off this notice.\\n")
    print("-- No entries --")
    sys.exit(0)
boot = time.time() - float(Path("/proc/uptime").read_text().split()[0])
host = socket.gethostname()
for line in (HERE / "kernel.log").read_text().splitlines():
    if line.startswith("[") and "]" in line:
        mono, msg = line[1:].split("]", 1)
        stamp = datetime.fromtimestamp(boot + float(mono), \
timezone.utc).strftime("%Y-%m-%dT%H:%M:%S+0000")
        print(f"{stamp} {host} kernel:{msg}")
"""


def install(node: Node) -> None:
    """The stand-ins and an empty log, once; an existing log and mode are kept."""
    bin_dir = node.dir / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, source in (("dmesg", _DMESG), ("journalctl", _JOURNALCTL)):
        path = bin_dir / name
        path.write_text(
            f"#!{node.python}\n# fleetops lab: simulated {name} (reads ../kernel.log)\n{source}"
        )
        path.chmod(0o755)
    if not (node.dir / "kernel.log").exists():
        (node.dir / "kernel.log").write_text("")
    if not (node.dir / "kernel.json").exists():
        set_readable(node, "dmesg")


def set_readable(node: Node, mode: str) -> None:
    if mode not in READABLE:
        raise LabError(f"unknown kernel-log mode {mode!r}; one of {', '.join(READABLE)}")
    (node.dir / "kernel.json").write_text(json.dumps({"readable": mode}) + "\n")


def clear(node: Node) -> None:
    install(node)
    (node.dir / "kernel.log").write_text("")


def append(node: Node, messages: list[str]) -> list[str]:
    """Lines as dmesg prints them, stamped with the machine's real seconds since boot."""
    install(node)
    stamp = uptime()
    lines = [f"[{stamp:12.6f}] {m}" for m in messages]
    with open(node.dir / "kernel.log", "a", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    return lines


def gpu_bus_ids() -> dict[int, str]:
    """The simulated GPUs' PCI bus ids, from the recorded `nvidia-smi -q -x` (index →
    "00000000:00:07.0")."""
    root = ET.parse(RECORDED_XML).getroot()
    return {int(g.findtext("minor_number", "-1")): str(g.get("id")) for g in root.findall("gpu")}


def inject_xid(node: Node, code: int, gpu: int) -> list[str]:
    buses = gpu_bus_ids()
    if gpu not in buses:
        raise LabError(f"the lab's simulated GPUs are {sorted(buses)}; no GPU {gpu}")
    domain, bus, rest = buses[gpu].split(":")
    pci = f"PCI:{int(domain, 16):04x}:{bus.lower()}:{rest.split('.')[0].lower()}"
    text = XID_TEXT.get(code, "simulated by fleetops' lab")
    return append(node, [f"NVRM: Xid ({pci}): {code}, pid='<unknown>', name=<unknown>, {text}"])


def _status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def _kb(status: dict[str, str], key: str) -> int:
    return int((status.get(key) or "0 kB").split()[0])


def inject_oom(node: Node, timeout: float = 30.0) -> dict:
    """The OOM killer takes the node's running job: SIGKILL its main process, log the kernel's
    lines."""
    try:
        current = json.loads((node.state_dir / "jobs" / "current.json").read_text())
        job = json.loads((node.state_dir / "jobs" / current["id"] / "job.json").read_text())
        pid = int(job["pid"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LabError(
            f"{node.name}: no running job to OOM-kill ({exc}); start one with `fab -H {node.name} "
            "extract`"
        ) from None
    try:
        status = _status(pid)
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        raise LabError(f"{node.name}: job {current['id']}'s process {pid} is not running") from None
    uid = int(status["Uid"].split()[0])
    lines = append(
        node,
        [
            (
                f"{comm} invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), "
                "order=0, oom_score_adj=0"
            ),
            "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,"
            f"global_oom,task_memcg=/user.slice/user-{uid}.slice,task={comm},pid={pid},uid={uid}",
            f"Out of memory: Killed process {pid} ({comm}) total-vm:{_kb(status, 'VmSize')}kB, "
            f"anon-rss:{_kb(status, 'RssAnon')}kB, file-rss:{_kb(status, 'RssFile')}kB, "
            f"shmem-rss:{_kb(status, 'RssShmem')}kB, UID:{uid} "
            f"pgtables:{_kb(status, 'VmPTE')}kB oom_score_adj:0",
        ],
    )
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    # As an operator finds it after a real OOM kill: the job's end recorded and its wrapper and
    # keeper gone (right after the kill they may still be exiting, and what diagnose shows would
    # depend on the timing).
    exit_record = node.state_dir / "jobs" / current["id"] / "exit.json"
    for waited in (pid, job.get("wrapper_pid"), job.get("keeper_pid")):
        while isinstance(waited, int) and _alive(waited) and time.monotonic() < deadline:
            time.sleep(0.02)
    while not exit_record.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return {"job": current["id"], "pid": pid, "process": comm, "lines": lines}


def _alive(pid: int) -> bool:
    """Running (a zombie its parent has not reaped yet counts as gone)."""
    fields = stat_fields(pid)
    return fields is not None and bool(fields) and fields[0] not in "ZX"
