"""The diagnose parsers on recorded real output, no lab: Xid and OOM-killer lines from the kernel
log (tests/fixtures/kernel-log/, README there says where each line comes from), GPU health from the
real H200 `nvidia-smi -q -x` (tests/fixtures/nvidia-smi/h200x2/busy_q.xml), and the pure reading of
a node's answer (verdicts, patch state, OOM kills joined to the job, exit statuses)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fleetops import results
from fleetops.plans.gpuhealth import assess, parse_health_xml
from fleetops.plans.kernellog import (
    XID_CODES,
    bus_key,
    match_oom,
    parse_line,
    parse_ooms,
    parse_xids,
    slurm_oom_events,
)
from fleetops.results import Severity
from fleetops.tasks import diagnose as dg
from remote_scripts.core.kernel import KERNEL_RELEVANT

FIX = Path(__file__).parent / "fixtures"
KLOG = FIX / "kernel-log"
XML = (FIX / "nvidia-smi" / "h200x2" / "busy_q.xml").read_text()


def lines(name: str) -> list[str]:
    return (KLOG / name).read_text().splitlines()


# ---------------------------------------------------------------- Xid
def test_every_public_xid_line_parses_with_code_bus_and_process():
    events = parse_xids(lines("xid-public-examples.txt"))
    got = [(e.code, e.bus_id, e.pid, e.process) for e in events]
    assert got == [
        (13, "0000:43:00", None, None),
        (45, "0000:dc:00", 1818990, "python3"),
        (119, "0000:9b:00", 2024380, "nvidia-smi"),
        (79, "0000:2b:00", None, None),
        (63, "0000:10:1c", 1896, None),
        (14, "0000:03:00", None, None),
    ]
    assert events[0].line.mono_s == pytest.approx(93297.027938)
    assert events[1].detail == "Ch 00000001 caused by previous Xid 149"
    assert (
        events[3].line.stamp == "May 18 19:02:39"
        and events[3].detail == "GPU has fallen off the bus."
    )
    assert events[4].detail.startswith("Row Remapper: New row marked for remapping")


def test_xid_table_has_the_common_codes_with_meaning_and_action():
    for code in (13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95):
        info = XID_CODES[code]
        assert info.name and info.action and info.severity in ("CRITICAL", "WARN", "INFO"), code
    assert (
        XID_CODES[79].name == "GPU has fallen off the bus" and XID_CODES[79].severity == "CRITICAL"
    )
    assert XID_CODES[48].severity == XID_CODES[95].severity == "CRITICAL"
    # NVIDIA's device plugin treats 13, 31, 43, 45 as application errors, not the GPU's: so do we.
    assert {XID_CODES[c].severity for c in (13, 31, 43, 45)} == {"WARN"}
    unknown = parse_xids(lines("xid-public-examples.txt"))[-1]
    assert unknown.code == 14 and "not in fleetops' table" in unknown.info.name


def test_healthy_h200_boot_lines_have_no_xid_and_no_oom():
    healthy = lines("h200-healthy-dmesg-nvidia-lines.txt")
    assert len(healthy) == 6
    assert parse_xids(healthy) == []
    assert parse_ooms(healthy).kills == [] and parse_ooms(healthy).other == []


def test_bus_ids_match_across_nvidia_smi_and_xid_spellings():
    smi = {g.index: bus_key(g.bus_id) for g in parse_health_xml(XML)}
    assert smi == {0: "0000:00:06", 1: "0000:00:07"}
    assert (
        bus_key("PCI:0000:00:07")
        == bus_key("00000000:00:07.0")
        == bus_key("00:07.0")
        == "0000:00:07"
    )
    assert bus_key("PCI:0000:2B:00") == "0000:2b:00" and bus_key("garbage") is None


@pytest.mark.parametrize(
    "prefix,mono,stamp",
    [
        ("[12288.496384] ", 12288.496384, None),
        ("2026-11-30T13:40:01+0000 lab01 kernel: ", None, "2026-11-30T13:40:01+0000"),
        ("Nov 30 13:40:01 lab01 kernel: ", None, "Nov 30 13:40:01"),
        ("[Mon Nov 30 13:40:01 2026] ", None, "Mon Nov 30 13:40:01 2026"),
        ("kernel: ", None, None),
    ],
)
def test_every_time_prefix_is_stripped_to_the_same_message(prefix, mono, stamp):
    real = next(ln for ln in lines("oom-memcg-real-capture.txt") if "Killed process" in ln)
    message = real.split("] ", 1)[1]
    line = parse_line(prefix + message, boot_time=1_000_000.0)
    assert line.message == message and line.mono_s == mono and line.stamp == stamp
    if mono is not None:
        assert line.epoch == pytest.approx(1_000_000.0 + mono)
    if prefix.startswith("2026"):
        assert line.epoch == pytest.approx(1796045201.0)  # 2026-11-30T13:40:01Z


# ---------------------------------------------------------------- OOM
def test_public_global_oom_kill_names_pid_process_and_memory():
    report = parse_ooms(lines("oom-public-examples.txt"))
    [kill] = report.kills
    assert (kill.pid, kill.process, kill.cgroup_oom, kill.uid) == (1440763, "perl", False, 21417)
    assert kill.rss_kb == {
        "total-vm": 87033376,
        "anon-rss": 60356340,
        "file-rss": 0,
        "shmem-rss": 0,
        "pgtables": 169956,
    }
    assert kill.anon_rss_mib == 58941 and kill.constraint == "CONSTRAINT_NONE"
    assert kill.memcg == "/user.slice/user-21417.slice/user@21417.service"
    assert slurm_oom_events(report.other) == [(1, "191.batch")]


def test_real_memcg_oom_capture_is_one_kill_with_its_invoker_and_cgroup():
    capture = lines("oom-memcg-real-capture.txt")
    report = parse_ooms(capture, boot_time=1_000_000.0)
    [kill] = report.kills
    assert (kill.pid, kill.process, kill.cgroup_oom, kill.invoked_by) == (
        31284,
        "python3",
        True,
        "python3",
    )
    assert kill.constraint == "CONSTRAINT_MEMCG" and kill.memcg.endswith("/fleetops-oom-capture")
    assert kill.rss_kb["anon-rss"] == 65280 and kill.uid == 0
    # the first line of the event: the invoker
    assert kill.epoch == pytest.approx(1_000_000.0 + 12288.495793)
    assert [ln.message.split(":")[0].split(" ")[0] for ln in kill.lines] == [
        "python3",
        "oom-kill",
        "Memory",
    ]


def test_node_side_filter_keeps_every_line_the_parsers_need():
    """The node sends only lines matching KERNEL_RELEVANT: parsing those must give what parsing all
    gives."""
    for name in (
        "oom-memcg-real-capture.txt",
        "oom-public-examples.txt",
        "xid-public-examples.txt",
    ):
        every = lines(name)
        sent = [ln for ln in every if KERNEL_RELEVANT.search(ln)]
        assert [(e.code, e.bus_id) for e in parse_xids(sent)] == [
            (e.code, e.bus_id) for e in parse_xids(every)
        ]
        assert [(k.pid, k.rss_kb, k.constraint) for k in parse_ooms(sent).kills] == [
            (k.pid, k.rss_kb, k.constraint) for k in parse_ooms(every).kills
        ]
    assert (
        len([ln for ln in lines("oom-memcg-real-capture.txt") if KERNEL_RELEVANT.search(ln)]) < 10
    )


# ---------------------------------------------------------------- GPU health (-q -x)
def test_real_h200_xml_health_fields():
    gpus = parse_health_xml(XML)
    assert [(g.index, g.bus_id, g.name) for g in gpus] == [
        (0, "00000000:00:06.0", "NVIDIA H200"),
        (1, "00000000:00:07.0", "NVIDIA H200"),
    ]
    for g in gpus:
        assert g.ecc_mode == "Enabled"
        assert g.ecc == {
            "volatile": {"correctable": 0, "uncorrectable": 0},
            "aggregate": {"correctable": 0, "uncorrectable": 0},
        }
        # N/A on H200
        assert (
            g.retired == {"single_bit": None, "double_bit": None} and g.retirement_pending is None
        )
        assert (g.remap_pending, g.remap_failure, g.remapped) == (
            False,
            False,
            {"correctable": 0, "uncorrectable": 0},
        )
        assert g.throttle == []  # every clocks_event_reason is "Not Active" in this capture
    assert [p["pid"] for g in gpus for p in g.processes] == [580, 581]
    assert assess(gpus) == []


def _edited(edits: dict[str, str], gpu: int = 1) -> str:
    """The real capture with some values of one GPU changed (what a sick GPU reports in those
    fields)."""
    root = ET.fromstring(XML)
    node = root.findall("gpu")[gpu]
    for path, value in edits.items():
        found = node.find(path)
        assert found is not None, path
        found.text = value
    return ET.tostring(root, encoding="unicode")


def test_uncorrectable_ecc_remap_failure_and_hw_throttle_are_findings():
    text = _edited(
        {
            "ecc_errors/volatile/dram_uncorrectable": "2",
            "ecc_errors/aggregate/dram_uncorrectable": "2",
            "remapped_rows/remapped_row_failure": "Yes",
            "remapped_rows/remapped_row_pending": "Yes",
            "clocks_event_reasons/clocks_event_reason_hw_thermal_slowdown": "Active",
        }
    )
    gpus = parse_health_xml(text)
    assert gpus[1].ecc["volatile"]["uncorrectable"] == 2 and gpus[1].throttle == [
        "hw_thermal_slowdown"
    ]
    found = [(f.severity, f.gpu.index, f.what.split(" (")[0]) for f in assess(gpus)]
    assert ("CRITICAL", 1, "row remapping failed") in found
    assert ("CRITICAL", 1, "2 uncorrectable ECC errors since the driver loaded") in found
    assert ("WARN", 1, "a row remap is pending") in found
    assert ("WARN", 1, "clocks throttled by hw_thermal_slowdown") in found
    assert all(f.gpu.index == 1 for f in assess(gpus))


def test_older_ecc_layout_single_and_double_bit_totals():
    root = ET.fromstring(XML)
    gpu = root.find("gpu")
    vol = gpu.find("ecc_errors/volatile")
    for child in list(vol):
        vol.remove(child)
    for tag, total in (("single_bit", "7"), ("double_bit", "1")):
        block = ET.SubElement(vol, tag)
        ET.SubElement(block, "device_memory").text = total
        ET.SubElement(block, "total").text = total
    parsed = parse_health_xml(ET.tostring(root, encoding="unicode"))[0]
    assert parsed.ecc["volatile"] == {"correctable": 7, "uncorrectable": 1}


def test_not_xml_is_a_clear_error():
    from fleetops.plans.gpuhealth import HealthParseError

    with pytest.raises(HealthParseError, match="not XML"):
        parse_health_xml("Failed to initialize NVML: Driver/library version mismatch")


# ---------------------------------------------------------------- reading a node's answer
def test_xid_79_finding_names_the_gpu_its_bus_id_and_the_next_step():
    line = next(ln for ln in lines("xid-public-examples.txt") if ": 79," in ln)
    real_bus = line.replace("PCI:0000:2b:00", "PCI:0000:00:07")  # the recorded H200's GPU 1
    index_by_bus = {bus_key(g.bus_id): g.index for g in parse_health_xml(XML)}
    [f] = dg.xid_findings("gpu01", parse_xids([real_bus]), index_by_bus)
    assert f.verdict == "CRITICAL" and f.area == "gpu1"
    assert "Xid 79 on GPU 1 (PCI 0000:00:07): GPU has fallen off the bus" in f.msg
    assert f.next == [
        "fab -H gpu01 drain --reason 'Xid 79 on GPU 1'",
        "fab -H gpu01 stop",
        "fab -H gpu01 run 'sudo reboot'",
        "fab -H gpu01 diagnose",
        "fab -H gpu01 undrain",
    ], f.next
    assert f.why.startswith("drain the node"), f.why


def test_app_level_xids_are_warnings_and_repeats_are_counted():
    line = lines("xid-public-examples.txt")[0]
    [f] = dg.xid_findings("gpu01", parse_xids([line, line, line]), {})
    assert f.verdict == "WARN" and "Graphics Engine Exception" in f.msg and "3 times" in f.msg


def _check(name: str, kind: str, ok: bool) -> dict:
    return {"name": name, "kind": kind, "ok": ok, "msg": f"{name} {'ok' if ok else 'failed'}"}


def test_patch_state_patched_not_patched_drifted_wrong_packages():
    """The patch's check mode classifies each file (protocol status words); the fast checks must
    agree."""
    greps = ["prefix-caching-off", "no-block-hasher", "async-scheduling-off"]
    gen = "speculators.data_generation.vllm_hidden_states_generator"
    worker = "speculators.data_generation.custom_worker"

    def state(words: list[str], grep_ok: list[bool], req_ok: bool = True) -> dg.Finding:
        items = [_check("requires", "requires", req_ok)] + [
            _check(n, "grep", o) for n, o in zip(greps, grep_ok)
        ]
        files = [{"module": m, "status": w, "msg": w} for m, w in zip((gen, worker), words)]
        return dg.patch_state("h", {"items": items}, {"items": files})

    patched = state(["already_applied"] * 2, [True] * 3)
    assert (patched.verdict, patched.msg) == ("OK", "patched (2 files; 4/4 fast checks pass)")
    pristine = state(["would_apply"] * 2, [False, True, False])
    assert pristine.verdict == "WARN" and pristine.msg.startswith(
        "not patched: 2 files as installed (2/4"
    )
    assert pristine.next == ["fab -H h patch verify"]
    drifted = state(["drifted", "not_written"], [True, False, True])
    assert drifted.verdict == "CRITICAL" and drifted.next == ["fab -H h patch --check"]
    assert drifted.msg.startswith(
        "drifted: vllm_hidden_states_generator matches neither the original nor the "
        "patched form (3/4 fast checks pass; first failing: no-block-hasher"
    )
    half = state(["already_applied", "would_apply"], [True] * 3)
    assert half.verdict == "CRITICAL" and half.msg.startswith(
        "drifted: only partly patched (vllm_hidden_states_"
    )
    broken = state(["already_applied"] * 2, [True, False, True])
    assert broken.verdict == "CRITICAL" and broken.msg.startswith(
        "patched, but 3/4 fast checks pass"
    )
    refused = dg.patch_state(
        "h",
        {"items": []},
        {
            "items": [
                {
                    "module": None,
                    "status": "refused",
                    "msg": "requirements not met: need vllm==0.16.*",
                }
            ]
        },
    )
    assert (
        refused.verdict == "CRITICAL"
        and refused.msg == "wrong packages: requirements not met: need vllm==0.16.*"
    )
    none = dg.patch_state(
        "h", {"error": "the playbook has no fast checks", "error_kind": "no_checks"}, None
    )
    assert none.verdict == "UNKNOWN" and none.msg == "not checked: the playbook has no fast checks"


def test_oom_kill_is_joined_to_the_job_by_pid_or_by_its_run():
    kill = parse_ooms(lines("oom-memcg-real-capture.txt"), boot_time=1_000_000.0).kills[0]
    start = 1_000_000.0 + 12000
    job = {
        "id": "j",
        "pid": 31284,
        "started_ts": start,
        "state": "killed",
        "exit": {"signal": 9, "ended_ts": kill.epoch + 1},
    }
    assert match_oom([kill], job, {31284}) == ([kill], [])
    assert match_oom([kill], job) == ([kill], [])  # the record's own pids
    # the kill is of a process the job started, within its run, and it died by 9
    worker = {**job, "pid": 4242}
    assert match_oom([kill], worker, {4242}) == ([kill], [])
    before = {
        **worker,
        "started_ts": kill.epoch + 60,
        "exit": {"signal": 9, "ended_ts": kill.epoch + 99},
    }
    assert match_oom([kill], before, {4242}) == ([], [kill])
    clean = {
        **worker,
        "state": "succeeded",
        "exit": {"exit_code": 0, "signal": None, "ended_ts": kill.epoch + 1},
    }
    assert match_oom([kill], clean, {4242}) == ([], [kill])


def test_job_killed_by_oom_is_critical_and_names_process_and_job():
    kill = parse_ooms(lines("oom-memcg-real-capture.txt"), boot_time=1_000_000.0).kills[0]
    job = {
        "id": "extract-1",
        "pid": 31284,
        "state": "killed",
        "started_ts": 1_000_000.0,
        "exit": {"signal": 9, "exit_code": None, "ended_ts": kill.epoch + 1},
        "log_tail": ["samples=3/10"],
    }
    [f] = dg.job_findings("gpu01", job, [kill], True, re.compile("samples"), [])
    assert f.verdict == "CRITICAL" and f.area == "oom"
    assert (
        "OOM killer killed job extract-1's main process: pid 31284 (python3, anon-rss 63 MiB; "
        "its memory cgroup's limit)"
        in f.msg
        and "killed by signal 9" in f.msg
    )
    # The same death without an OOM line: a warning that says the kernel log rules the OOM killer
    # out.
    [g] = dg.job_findings("gpu01", job, [], True, re.compile("samples"), [])
    assert g.verdict == "WARN" and "no OOM-killer line in the kernel log names it" in g.msg


def test_verdicts_order_and_exit_statuses_do_not_clash():
    taken = {
        results.EXIT_OK,
        results.EXIT_FAILED,
        results.EXIT_USAGE,
        results.EXIT_UNREACHABLE,
        results.EXIT_GPU_BUSY,
        results.EXIT_GPU_UNHEALTHY,
        results.EXIT_NO_NVIDIA_SMI,
        results.EXIT_NVIDIA_SMI_FAILED,
        results.EXIT_INTERRUPTED,
    }
    assert dg.EXIT_FOR == {"OK": 0, "WARN": 20, "UNKNOWN": 21, "CRITICAL": 22}
    assert not (set(dg.EXIT_FOR.values()) - {0}) & taken
    # exit_status takes the largest code: the codes rise with the verdict's severity, so max = the
    # worst.
    assert sorted(dg.EXIT_FOR, key=dg.EXIT_FOR.__getitem__) == sorted(Severity)
    fs = [
        dg.Finding(dg.WARN, "disk", "low", ["x"]),
        dg.Finding(dg.UNKNOWN, "gpu", "no smi", ["y"]),
        dg.Finding(dg.OK, "load", "fine", ["z"]),
    ]
    assert dg.verdict_of(fs) == "UNKNOWN" and dg.verdict_of([]) == "OK"
    warn = dg._result("h1", fs[:1], {})
    unknown = dg._result("h2", fs, {})
    # A WARN host is counted failed in the recap, as its exit status 20 says (gpu counts its WARN so
    # too).
    failed = results.Status.FAILED
    assert (warn.status, warn.code, unknown.status, unknown.code) == (failed, 20, failed, 21)
    assert results.exit_status([warn, unknown]) == 21
    assert unknown.msg == "UNKNOWN: no smi (+1 more)"
    assert unknown.data["summary_row"] == ["h2", "UNKNOWN", "gpu", "no smi", "y"]


def test_real_h200_node_answer_reads_without_a_crash_and_an_xid_on_its_gpu_is_found():
    """The op's answer as a real H200 node gave it: healthy GPU from the real XML, the real boot
    lines are no Xid; the same answer with a public Xid 79 line moved onto that GPU's bus names GPU
    0 and its bus id."""
    import json

    from fleetops.plans.inventory import Host

    answer = json.loads((KLOG / "h200-diagnose-answer.json").read_text())
    host = Host("gpu01", "127.0.0.1", gpus=1)
    sent = answer["clock"]["epoch"] - 0.5
    found = dg.assess_answer(host, answer, sent, sent + 1.0, None)
    by_area = {f.area: f for f in found}
    assert by_area["gpu"].verdict == "OK" and by_area["gpu"].msg.startswith(
        "1 GPUs (NVIDIA H200), 0 uncorrectable"
    )
    assert (
        by_area["kernel"].verdict == "OK"
        and by_area["kernel"].msg == "no NVIDIA Xid in the kernel log (dmesg, 358 lines)"
    )
    assert by_area["job"].msg == "no job has been started on this node"
    assert by_area["patch"].verdict == "UNKNOWN" and by_area["clock"].verdict == "OK"
    assert dg.verdict_of(found) == "UNKNOWN"
    xid79 = next(ln for ln in lines("xid-public-examples.txt") if ": 79," in ln).replace(
        "2b:00", "00:06"
    )
    answer["kernel"]["lines"].append(xid79)
    found = dg.assess_answer(host, answer, sent, sent + 1.0, None)
    assert found[0].verdict == "CRITICAL" and found[0].area == "gpu0"
    assert found[0].msg.startswith("Xid 79 on GPU 0 (PCI 0000:00:06): GPU has fallen off the bus")
    # With two GPUs in the inventory, the one the node no longer shows is CRITICAL too.
    two = dg.assess_answer(Host("gpu01", "127.0.0.1", gpus=2), answer, sent, sent + 1.0, None)
    assert any(
        f.verdict == "CRITICAL" and f.msg == "1 of 2 GPUs visible (inventory says 2)" for f in two
    )
