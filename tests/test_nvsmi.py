"""nvidia-smi parsers and GPU gates, on real output recorded from a 2×H200 machine
(tests/fixtures/nvidia-smi)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetops.plans.gpugate import Gate, evaluate
from fleetops.results import (
    EXIT_GPU_BUSY,
    EXIT_GPU_UNHEALTHY,
    EXIT_NO_NVIDIA_SMI,
    EXIT_NVIDIA_SMI_FAILED,
)
from remote_scripts.health import nvsmi

FIX = Path(__file__).parent / "fixtures" / "nvidia-smi" / "h200x2"
UUID0 = "GPU-65d02187-7ce6-eaa9-78fb-da62b0d8fe2f"
UUID1 = "GPU-96672edd-7c8a-e406-22f4-69b8156406b5"


def read(name: str) -> str:
    return (FIX / name).read_text()


@pytest.mark.parametrize(
    "name",
    [
        "idle_query.csv",
        "idle_query_nounits.csv",
        "busy_query.csv",
        "busy_query_nounits.csv",
        "after_query.csv",
    ],
)
def test_every_query_file_parses_to_two_h200s(name):
    gpus = nvsmi.parse_query(read(name))
    assert [g["index"] for g in gpus] == [0, 1]
    assert [g["uuid"] for g in gpus] == [UUID0, UUID1]
    for g in gpus:
        assert g["name"] == "NVIDIA H200" and g["memory_total_mib"] == 143771
        assert g["driver"] == "580.159.04" and g["pstate"] == "P0" and g["ecc_uncorrected"] == 0
        assert isinstance(g["power_draw_w"], float) and g["power_limit_w"] == 700.0
        assert g["problems"] == []


def test_free_is_not_total_minus_used():
    g = nvsmi.parse_query(read("idle_query.csv"))[0]
    assert (g["memory_total_mib"], g["memory_used_mib"], g["memory_free_mib"]) == (
        143771,
        0,
        143156,
    )
    assert g["memory_free_mib"] != g["memory_total_mib"] - g["memory_used_mib"]


def test_renamed_throttle_field_is_understood_from_the_header():
    header = read("idle_query.csv").splitlines()[0]
    assert "clocks_event_reasons.active" in header and "clocks_throttle_reasons" not in header
    g = nvsmi.parse_query(read("idle_query.csv"))[0]
    assert g["throttle_reasons"] == "0x0000000000000001"
    assert (
        nvsmi.parse_query(read("idle_query_nounits.csv"))[0]["throttle_reasons"]
        == "0x0000000000000001"
    )


def test_units_and_leading_spaces_are_stripped():
    with_units = nvsmi.parse_query(read("busy_query.csv"))
    without = nvsmi.parse_query(read("busy_query_nounits.csv"))
    assert [g["memory_used_mib"] for g in with_units] == [21099, 22123]
    assert [g["memory_used_mib"] for g in without] == [21099, 22123]
    assert with_units[0]["utilization_gpu_pct"] == 0 and with_units[0]["temperature_c"] == 41


@pytest.mark.parametrize("name", ["busy_apps.csv", "busy_apps_nounits.csv"])
def test_busy_apps_join_to_gpus_by_uuid(name):
    apps = nvsmi.parse_apps(read(name))
    assert [(a["pid"], a["used_mib"]) for a in apps] == [(580, 21090), (581, 22114)]
    gpus = nvsmi.parse_query(read("busy_query.csv"))
    # Present the GPUs in the other order: the join must not depend on position or index.
    orphans = nvsmi.join_processes(list(reversed(gpus)), apps)
    assert orphans == []
    by_index = {g["index"]: g for g in gpus}
    assert [p["pid"] for p in by_index[0]["processes"]] == [580]
    assert [p["pid"] for p in by_index[1]["processes"]] == [581]


def test_idle_apps_is_a_header_alone_and_means_no_process():
    text = read("idle_apps.csv")
    assert text.splitlines()[0].startswith("pid,") and "rc=0" in text
    assert nvsmi.parse_apps(text) == []
    assert nvsmi.parse_apps("") == []  # the noheader form of the same answer


@pytest.mark.parametrize(
    "name,used", [("idle_table.txt", []), ("busy_table.txt", [(0, 580, 21090), (1, 581, 22114)])]
)
def test_plain_table(name, used):
    text = read(name)
    assert nvsmi.parse_table_header(text) == {"driver": "580.159.04", "cuda": "13.0"}
    assert [
        (p["gpu_index"], p["pid"], p["used_mib"]) for p in nvsmi.parse_table_processes(text)
    ] == used


def test_xml():
    doc = nvsmi.parse_xml(read("busy_q.xml"))
    assert doc["driver"] == "580.159.04" and doc["cuda"] == "13.0" and doc["attached_gpus"] == 2
    assert [g["uuid"] for g in doc["gpus"]] == [UUID0, UUID1]
    assert [(p["pid"], p["used_mib"]) for g in doc["gpus"] for p in g["processes"]] == [
        (580, 21090),
        (581, 22114),
    ]


def test_env_capture_names_the_holders_seen_in_busy_output():
    env = read("env.txt")
    assert " 580 " in env and " 581 " in env and "torch.empty" in env


def test_wrong_column_count_is_a_clear_parse_error():
    with pytest.raises(nvsmi.ParseError, match="expected 17 columns, got 3"):
        nvsmi.parse_query("0, GPU-x, NVIDIA H200\n")


def test_gpu_in_trouble_values_mark_it_unhealthy():
    row = read("idle_query_nounits.csv").splitlines()[0].replace(", 41, ", ", [GPU is lost], ")
    g = nvsmi.parse_query(row + "\n")[0]
    assert g["problems"] == ["temperature_c: [GPU is lost]"]


# ---------------------------------------------------------------- gates
def snap(query: str, apps: str) -> dict:
    gpus = nvsmi.parse_query(read(query))
    nvsmi.join_processes(gpus, nvsmi.parse_apps(read(apps)))
    return {"ok": True, "gpus": gpus}


def test_gate_idle_is_free():
    v = evaluate(snap("idle_query.csv", "idle_apps.csv"), Gate(expected=2))
    assert v.code == 0 and v.msg == "2/2 selected GPUs free"


def test_gate_busy_names_holders():
    v = evaluate(snap("busy_query.csv", "busy_apps.csv"), Gate())
    assert v.code == EXIT_GPU_BUSY
    assert v.holders[0].startswith("GPU 0: pid 580 python3 21090 MiB")


def test_gate_process_makes_busy_even_under_threshold_and_selection_limits_scope():
    v = evaluate(snap("busy_query.csv", "busy_apps.csv"), Gate(threshold_mib=100000, select=(1,)))
    assert v.code == EXIT_GPU_BUSY and len(v.items) == 1 and "1 processes" in v.items[0].msg
    v = evaluate(snap("busy_query.csv", "idle_apps.csv"), Gate(threshold_mib=100000))
    assert v.code == 0  # memory under the threshold and no process


def test_gate_missing_gpu_names_the_index():
    s = snap("idle_query.csv", "idle_apps.csv")
    s["gpus"] = s["gpus"][:1]
    v = evaluate(s, Gate(expected=2))
    assert v.code == EXIT_GPU_UNHEALTHY and "missing GPU 1" in v.msg
    v = evaluate(snap("idle_query.csv", "idle_apps.csv"), Gate(select=(0, 5)))
    assert v.code == EXIT_GPU_UNHEALTHY and "missing GPU 5" in v.msg


def test_gate_ecc_errors_are_unhealthy():
    s = snap("idle_query.csv", "idle_apps.csv")
    s["gpus"][1]["ecc_uncorrected"] = 3
    v = evaluate(s, Gate())
    assert v.code == EXIT_GPU_UNHEALTHY and "3 uncorrected ECC errors" in v.items[1].msg


def test_gate_nvidia_smi_errors_have_their_own_codes():
    assert (
        evaluate({"ok": False, "error_kind": "no_nvidia_smi", "error": "x"}, Gate()).code
        == EXIT_NO_NVIDIA_SMI
    )
    v = evaluate(
        {
            "ok": False,
            "error_kind": "nvidia_smi_failed",
            "error": "Failed to initialize NVML: Driver/library version mismatch",
        },
        Gate(),
    )
    assert v.code == EXIT_NVIDIA_SMI_FAILED and "Driver/library version mismatch" in v.msg
