"""--metrics seen by a real Prometheus: `fleet ... --metrics` on real lab nodes writes into a real
node_exporter's textfile folder, a real Prometheus (Debian's packages, loopback only,
tests/promlab.py) scrapes it and evaluates the shipped alert rules. A patched file edited by hand on
a node turns the drift alert from inactive to firing, with the command to run next; every file
written is accepted by `promtool check metrics`."""

from __future__ import annotations

import shutil
import subprocess
from importlib.resources import files
from pathlib import Path

import promlab
import pytest
from conftest import GENERATOR, run_fab

from fleetops.lab import Lab

pytestmark = pytest.mark.lab
RULES = Path(str(files("fleetops") / "monitoring" / "fleetops.rules.yml"))


def verify_into(lab: Lab, textfile: Path) -> subprocess.CompletedProcess:
    """What the verification timer runs: the patch's state and every check, into the collector's
    folder."""
    return run_fab(
        lab.root, "-H", "lab01,lab02", "patch", "--check", "verify", "--metrics", str(textfile)
    )


def promtool_accepts(path: Path) -> None:
    checked = subprocess.run(
        [shutil.which("promtool") or "promtool", "check", "metrics"],
        input=path.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def drifted_alerts(mon: promlab.Monitoring) -> list[dict]:
    return [a for a in mon.alerts() if a["labels"]["alertname"] == "FleetopsPatchDrifted"]


def test_a_hand_edit_of_a_patched_file_fires_the_drift_alert_with_what_to_run(
    lab: Lab, tmp_path: Path
):
    assert promlab.available(), (
        "needs Debian's prometheus and prometheus-node-exporter (scripts/setup)"
    )
    assert run_fab(lab.root, "-H", "lab01", "patch").returncode == 0
    with promlab.Monitoring(tmp_path, RULES) as mon:
        textfile = mon.textfiles / "fleetops.prom"
        first = verify_into(lab, textfile)
        # lab02 is not patched: its checks fail
        assert first.returncode == 1, first.stdout + first.stderr
        promtool_accepts(textfile)
        checks = mon.wait_until(
            "lab01's checks scraped", lambda: mon.query('fleetops_check_ok{host="lab01"}')
        )
        assert {r["value"][1] for r in checks} == {"1"} and len(checks) >= 8, checks
        failing = mon.query('fleetops_check_ok{host="lab02"} == 0')
        assert {r["metric"]["check"] for r in failing} >= {"prefix-caching-off"}, failing
        patched = mon.query('fleetops_patch_state{host="lab01",state="patched"} == 1')
        assert patched and not drifted_alerts(mon), mon.alerts()  # inactive: nothing drifted yet

        target = lab.node("lab01").module_file(GENERATOR)
        target.write_text(
            target.read_text().replace(
                "            kv_cache_groups=kv_cache_groups,\n",
                "            kv_cache_groups=groups,  # local edit\n",
            )
        )
        second = verify_into(lab, textfile)
        assert second.returncode == 1, second.stdout + second.stderr
        promtool_accepts(textfile)
        firing = mon.wait_until(
            "the drift alert firing",
            lambda: [a for a in drifted_alerts(mon) if a["state"] == "firing"],
        )
        [alert] = firing
        assert alert["labels"]["host"] == "lab01" and alert["labels"]["severity"] == "page", alert
        assert alert["annotations"]["next"] == "fleet -H lab01 patch --check", alert
        # the file edited, not the other of the set
        assert alert["labels"]["file"] == GENERATOR, alert
        # the command the alert says
        typed = run_fab(lab.root, *alert["annotations"]["next"].split()[1:])
        assert typed.returncode == 1 and "drifted" in typed.stdout, typed.stdout + typed.stderr
