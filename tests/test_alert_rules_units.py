"""The shipped Prometheus alert rules, evaluated by Prometheus' own rule engine (`promtool test
rules`) over series with the names and labels fleetops' --metrics writes (taken from exposition() of
results recorded off the lab): each alert fires when it should, not before, and its `next`
annotation is the command fleetops would print."""

from __future__ import annotations

import re
import shutil
import subprocess
from importlib.resources import files
from pathlib import Path

import pytest
import yaml
from test_metrics_units import NOW, recorded, samples

from fleetops.report.metrics import exposition

RULES = Path(str(files("fleetops") / "monitoring" / "fleetops.rules.yml"))


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    tool = shutil.which("promtool")
    assert tool, "promtool not found: install Debian's prometheus package (scripts/setup does)"
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def series_of(name: str, run: str, **where: str) -> str:
    """One series fleetops writes, as promtool's `series:` notation: its labels from a recorded
    run."""
    for metric, labels, _ in samples(
        exposition(recorded(run), playbook="speculators-0.3.0-vllm-0.16", now=NOW)
    ):
        if metric == name and all(labels.get(k) == v for k, v in where.items()):
            inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
            return f"{name}{{{inner}}}"
    raise AssertionError(f"no {name} {where} in the recorded {run} run")


def evaluate(tmp_path: Path, tests: list[dict]) -> subprocess.CompletedProcess:
    shutil.copy(RULES, tmp_path / "rules.yml")
    (tmp_path / "test.yml").write_text(
        yaml.safe_dump(
            {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests},
            sort_keys=False,
        )
    )
    return promtool("test", "rules", "test.yml", cwd=tmp_path)


def annotated(alertname: str, labels: dict[str, str], next_cmd: str, value: str = "") -> dict:
    """What Prometheus should attach: the rule's annotations with its labels filled in; the `next`
    command is the one stated here (the one fleetops prints), checked against the rule's own before
    the engine runs."""
    [rule] = [
        r
        for g in yaml.safe_load(RULES.read_text())["groups"]
        for r in g["rules"]
        if r["alert"] == alertname
    ]
    filled = {
        k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m[1]], v)
        for k, v in rule["annotations"].items()
    }
    filled = {
        k: re.sub(r"\{\{ \$value \| humanizeDuration \}\}", value, v) for k, v in filled.items()
    }
    assert filled["next"] == next_cmd, (alertname, filled["next"])
    return {"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": filled}


def labels_of(series: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', series))


def test_promtool_accepts_the_shipped_rules():
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0 and "SUCCESS: 5 rules found" in checked.stdout, (
        checked.stdout + checked.stderr
    )


def test_each_alert_fires_when_it_should_with_the_command_to_run_next(tmp_path: Path):
    drifted = series_of("fleetops_patch_state", "patch", host="lab02", state="drifted")
    original = series_of("fleetops_patch_state", "patch", host="lab02", state="original")
    patched = series_of("fleetops_patch_state", "patch", host="lab02", state="patched")
    failing = series_of("fleetops_check_ok", "verify", host="lab02", check="prefix-caching-off")
    unreachable = series_of("fleetops_host_reachable", "verify-unreachable", host="lab02")
    last_run = series_of("fleetops_last_run_timestamp_seconds", "verify", task="verify")
    tests = [
        {
            "interval": "1m",
            "input_series": [{"series": drifted, "values": "0 0 1x5"}],
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "FleetopsPatchDrifted", "exp_alerts": []},
                {
                    "eval_time": "3m",
                    "alertname": "FleetopsPatchDrifted",
                    "exp_alerts": [
                        annotated(
                            "FleetopsPatchDrifted",
                            labels_of(drifted),
                            "fleet -H lab02 patch --check",
                        )
                    ],
                },
            ],
        },
        {
            "interval": "10m",
            "input_series": [
                {"series": patched, "values": "1x6 0x6"},
                {"series": original, "values": "0x6 1x6"},
            ],
            "alert_rule_test": [
                {"eval_time": "50m", "alertname": "FleetopsPatchUndone", "exp_alerts": []},
                {
                    "eval_time": "70m",
                    "alertname": "FleetopsPatchUndone",
                    "exp_alerts": [
                        annotated(
                            "FleetopsPatchUndone",
                            labels_of(original),
                            "fleet -H lab02 patch verify",
                        )
                    ],
                },
            ],
        },
        {
            "interval": "5m",
            "input_series": [{"series": failing, "values": "1 0x10"}],
            "alert_rule_test": [
                {"eval_time": "15m", "alertname": "FleetopsCheckFailing", "exp_alerts": []},
                {
                    "eval_time": "25m",
                    "alertname": "FleetopsCheckFailing",
                    "exp_alerts": [
                        annotated(
                            "FleetopsCheckFailing", labels_of(failing), "fleet -H lab02 verify"
                        )
                    ],
                },
            ],
        },
        {
            "interval": "5m",
            "input_series": [{"series": unreachable, "values": "0x10"}],
            "alert_rule_test": [
                {"eval_time": "25m", "alertname": "FleetopsHostUnreachable", "exp_alerts": []},
                {
                    "eval_time": "35m",
                    "alertname": "FleetopsHostUnreachable",
                    "exp_alerts": [
                        annotated(
                            "FleetopsHostUnreachable",
                            labels_of(unreachable),
                            "fleet -H lab02 diagnose",
                        )
                    ],
                },
            ],
        },
        {
            "interval": "15m",
            "input_series": [{"series": last_run, "values": "0+900x4 3600x8"}],
            "alert_rule_test": [
                {"eval_time": "45m", "alertname": "FleetopsVerificationStale", "exp_alerts": []},
                {
                    "eval_time": "135m",
                    "alertname": "FleetopsVerificationStale",
                    "exp_alerts": [
                        annotated(
                            "FleetopsVerificationStale",
                            labels_of(last_run),
                            "systemctl status fleetops-verify.timer",
                            "1h 15m 0s",
                        )
                    ],
                },
            ],
        },
    ]
    evaluated = evaluate(tmp_path, tests)
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr


@pytest.mark.parametrize("wrong", ["fleet -H lab02 verify", "fab -H lab02 patch --check"])
def test_a_wrong_next_command_is_caught_by_the_rule_engine(tmp_path: Path, wrong: str):
    """The evaluation above can fail: the same drift, the wrong command expected."""
    drifted = series_of("fleetops_patch_state", "patch", host="lab02", state="drifted")
    tests = [
        {
            "interval": "1m",
            "input_series": [{"series": drifted, "values": "1x5"}],
            "alert_rule_test": [
                {
                    "eval_time": "2m",
                    "alertname": "FleetopsPatchDrifted",
                    "exp_alerts": [
                        {
                            "exp_labels": {**labels_of(drifted), "severity": "page"},
                            "exp_annotations": {"next": wrong},
                        }
                    ],
                }
            ],
        }
    ]
    evaluated = evaluate(tmp_path, tests)
    assert evaluated.returncode != 0 and "unmarshal" not in evaluated.stderr, (
        evaluated.stdout + evaluated.stderr
    )
    assert "FleetopsPatchDrifted" in evaluated.stderr and wrong in evaluated.stderr, (
        evaluated.stderr
    )
