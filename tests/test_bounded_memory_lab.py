"""Bounded memory on both ends, against real lab nodes and hostile ones (tests/hostile_node_agent.py
behind a lab node's sshd, tests/hostile_hosts.py):

- the node agent keeps the head and the tail of `run` output and counts what it dropped: 800 MB of
  output costs it under 100 MB (its VmHWM, sampled from /proc while it runs), and the client shows
  the count;
- the client caps each host's session: a node flooding 400 MB of stderr, or 400 MB with no newline,
  is dropped with one line naming it while the other host goes on, the client under 200 MB (its
  ru_maxrss); an answer nested too deeply or of the wrong types is one line, never a traceback;
- `fetch` refuses a file over its size limit (1 GiB, --max-size raises it) before copying a byte;
- `tail` and `logs` cut a 1 MiB log line and go on to the traceback after it."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest
from conftest import fab_json, run_fab
from hostile_hosts import fab_with_peak_rss, hostile_inventory

pytestmark = pytest.mark.lab

MB = 1000 * 1000
KEEP = 1024 * 1024  # remote_scripts/jobs/adhoc.py KEEP_BYTES: the head and the tail of each stream


# ---------------------------------------------------------------- the node agent's `run`
def _agent_pids(state_dir: str) -> list[int]:
    """Processes whose argv names this state dir's agent zip: the serving agent, however it was
    started."""
    prefix = f"{state_dir}/bin/".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.startswith(prefix) and a.endswith(b".pyz") for a in argv):
            pids.append(int(entry))
    return pids


def _vm_hwm(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class AgentPeak(threading.Thread):
    """Samples the peak RSS (VmHWM: the kernel's own high-water mark) of every agent of a state
    dir."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(daemon=True)
        self.state_dir = str(state_dir)
        self.peaks: dict[int, int] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for pid in _agent_pids(self.state_dir):
                hwm = _vm_hwm(pid)
                if hwm is not None:
                    self.peaks[pid] = max(hwm, self.peaks.get(pid, 0))
            time.sleep(0.01)

    def __enter__(self) -> AgentPeak:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()


def test_node_agent_keeps_head_and_tail_of_800_mb_of_run_output_under_100_mb(lab):
    node = lab.node("lab01")
    command = "head -c 800000000 /dev/zero | tr '\\0' a; echo; echo the-end"
    with AgentPeak(node.state_dir) as peak:
        started = time.monotonic()
        proc = run_fab(lab.root, "-H", "lab01", "run", command, timeout=600)
        took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert peak.peaks, "the agent was never seen in /proc"
    worst = max(peak.peaks.values())
    print(f"agent peak RSS {worst / MB:.1f} MB for 800 MB of run output ({took:.1f} s)")
    assert worst < 100 * MB, f"the node agent peaked at {worst / MB:.0f} MB"
    dropped = 800_000_001 + len("the-end\n") - 2 * KEEP
    lines = proc.stdout.splitlines()
    assert f"lab01 | … {dropped:,} bytes dropped …" in lines, [x[:120] for x in lines]
    marker = lines.index(f"lab01 | … {dropped:,} bytes dropped …")
    assert lines[marker - 1] == "lab01 | " + "a" * KEEP  # the head, whole
    assert lines[marker + 1 : marker + 3] == [
        "lab01 | " + "a" * (KEEP - len("\nthe-end\n")),
        "lab01 | the-end",
    ]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_the_json_answer_counts_what_the_node_dropped(lab):
    rc, doc = fab_json(
        lab.root, "-H", "lab01", "run", "head -c 3000000 /dev/zero | tr '\\0' b; echo x >&2"
    )
    assert rc == 0, doc
    data = doc["results"][0]["data"]
    assert (
        data["stdout_dropped_bytes"] == 3_000_000 - 2 * KEEP and data["stderr_dropped_bytes"] == 0
    )
    head, marker, tail = data["stdout"].split("\n")
    assert head == tail == "b" * KEEP and marker == f"… {3_000_000 - 2 * KEEP:,} bytes dropped …"
    assert data["stderr"] == "x\n"


# ---------------------------------------------------------------- the client against hostile nodes
@pytest.mark.parametrize(
    "mode,cause",
    [
        ("stderrflood", "to stderr while serving one request"),
        ("nonewline", "without ending its answer line"),
    ],
)
def test_client_stays_under_200_mb_against_a_node_flooding_400_mb(
    lab, tmp_path_factory, mode, cause
):
    inventory = hostile_inventory(lab, tmp_path_factory.mktemp("hostile"), {"evil01": mode}, mb=400)
    started = time.monotonic()
    proc, peak = fab_with_peak_rss(
        lab.root, "-H", "lab01,evil01", "ping", "--inventory", str(inventory), timeout=300
    )
    took = time.monotonic() - started
    out = proc.stdout + proc.stderr
    print(f"{mode}: client peak RSS {peak / MB:.1f} MB, {took:.1f} s")
    assert peak < 200 * MB, f"the client peaked at {peak / MB:.0f} MB\n{out[-3000:]}"
    assert "Traceback" not in out
    assert re.search(r"^lab01 \| ping \| ok", proc.stdout, re.M), out[-3000:]
    failed = [
        line for line in proc.stdout.splitlines() if line.startswith("evil01 | ping | failed")
    ]
    assert len(failed) == 1 and cause in failed[0] and "session is dropped" in failed[0], out[
        -3000:
    ]
    assert proc.returncode != 0
    assert took < 60, (
        f"{took:.0f} s: the client read on after the cap (the node sleeps 30 s when done)"
    )
    shown = max(len(line) for line in proc.stdout.splitlines())
    assert shown < 2000, f"a {shown}-character line reached the screen"


@pytest.mark.parametrize("mode", ["deep", "types"])
@pytest.mark.parametrize(
    "task",
    [
        ["ping"],
        ["run", "true"],
        ["capture", "--module", "speculators.data_generation.custom_worker"],
    ],
)
def test_a_malformed_answer_is_one_line_never_a_traceback(lab, tmp_path_factory, mode, task):
    root = tmp_path_factory.mktemp("hostile")
    inventory = hostile_inventory(lab, root, {"evil01": mode})
    extra = ["--playbook", str(root / "captured.yaml")] if task[0] == "capture" else []
    proc = run_fab(
        lab.root, "-H", "evil01", *task, *extra, "--inventory", str(inventory), timeout=120
    )
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "internal error" not in out, out[-3000:]
    result = [line for line in proc.stdout.splitlines() if line.startswith(f"evil01 | {task[0]} |")]
    assert len(result) == 1 and "| failed |" in result[0], out[-3000:]
    assert "malformed" in result[0] or "no JSON answer" in result[0], result[0]
    assert proc.returncode != 0 and not (root / "captured.yaml").exists()


# ---------------------------------------------------------------- fetch
def test_fetch_refuses_a_file_over_its_size_limit_unless_raised(lab, tmp_path):
    node = lab.node("lab01")
    small, sparse = node.state_dir / "three-mb.bin", node.state_dir / "sparse-2g.bin"
    small.write_bytes(os.urandom(3 * MB))
    with open(sparse, "wb") as f:
        f.truncate(2 * 1024**3)  # no disk used: the size is what a node claims
    try:
        dest = tmp_path / "fetched"
        refused = run_fab(
            lab.root, "-H", "lab01", "fetch", "--path", sparse.name, "--dest", str(dest)
        )
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, (
            refused.stdout + refused.stderr
        )
        assert "2,147,483,648 bytes (2.00 GiB) is over the 1.00 GiB" in refused.stdout, (
            refused.stdout
        )
        assert "--max-size 2G" in refused.stdout
        capped = run_fab(
            lab.root,
            "-H",
            "lab01",
            "fetch",
            "--path",
            small.name,
            "--dest",
            str(dest),
            "--max-size",
            "1M",
        )
        assert capped.returncode != 0 and "is over the 1.0 MiB" in capped.stdout, (
            capped.stdout + capped.stderr
        )
        assert not list(dest.rglob("*.bin*")), "a refused file was (partly) downloaded"
        raised = run_fab(
            lab.root,
            "-H",
            "lab01",
            "fetch",
            "--path",
            small.name,
            "--dest",
            str(dest),
            "--max-size",
            "4M",
        )
        assert raised.returncode == 0, raised.stdout + raised.stderr
        assert (dest / "lab01" / "state" / small.name).read_bytes() == small.read_bytes()
        bad = run_fab(lab.root, "-H", "lab01", "fetch", "--path", small.name, "--max-size", "lots")
        assert bad.returncode == 2 and "--max-size 'lots'" in bad.stderr + bad.stdout
    finally:
        small.unlink(missing_ok=True)
        sparse.unlink(missing_ok=True)


# ---------------------------------------------------------------- tail and logs
LONG_LINE_SCRIPT = (
    "import sys\n"
    "print('before the long line', flush=True)\n"
    "sys.stdout.write('L' * 1048576 + '\\n')\n"
    "sys.stdout.flush()\n"
    "raise ValueError('after the long line')\n"
)
LONG_LINE_JOB = f"""name: long-line
description: a job that prints a 1 MiB line, then fails with a traceback
jobs:
  longline:
    kind: command
    command: {json.dumps(["{python}", "-c", LONG_LINE_SCRIPT])}
    preflight: []
    gpu_gate: false
"""


def test_tail_and_logs_cut_a_1_mib_line_and_show_the_traceback_after_it(lab, tmp_path):
    book = tmp_path / "long-line.yaml"
    book.write_text(LONG_LINE_JOB)
    proc = run_fab(
        lab.root,
        "-H",
        "lab01",
        "extract",
        "--job",
        "longline",
        "--playbook",
        str(book),
        "tail",
        "--job",
        "longline",
        "--playbook",
        str(book),
        timeout=300,
    )
    out = proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "lab01 | before the long line" in out
    assert re.search(r"^lab01 \| Traceback \(most recent call last\):$", out, re.M), out[-3000:]
    assert re.search(r"^lab01 \| ValueError: after the long line$", out, re.M), out[-3000:]
    cut = [line for line in out.splitlines() if "L" * 100 in line]
    assert len(cut) == 1 and "bytes of this 1,048,576-byte line not shown" in cut[0], [
        x[:200] for x in cut
    ]
    assert len(cut[0]) < 10_000
    assert re.search(r"^lab01 \| tail \| failed \| .*exit status 1", out, re.M), out[-2000:]

    logs = run_fab(lab.root, "-H", "lab01", "logs", "--lines", "10")
    assert re.search(r"ValueError: after the long line$", logs.stdout, re.M), logs.stdout[-3000:]
    long = [line for line in logs.stdout.splitlines() if "L" * 100 in line]
    assert (
        len(long) == 1
        and "this line starts earlier in the log" in long[0]
        and len(long[0]) < 10_000
    ), [x[:200] for x in long]
