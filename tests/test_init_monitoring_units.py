"""What `fleet init` writes for verification on a schedule: the shipped alert rules (as the package
has them), and a systemd service and timer that run `patch --check verify --metrics` from the
project as the user who ran init, each accepted by systemd's own `systemd-analyze verify`, and by
`promtool check rules`."""

from __future__ import annotations

import getpass
import shlex
import shutil
import subprocess
from importlib.resources import files
from pathlib import Path

import pytest

from fleetops.init import TEXTFILE, make_project


def systemd_accepts(*units: Path) -> subprocess.CompletedProcess:
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze not found (Debian's systemd package)"
    return subprocess.run(
        [tool, "verify", *map(str, units)], capture_output=True, text=True, timeout=120
    )


def test_init_writes_rules_a_service_and_a_timer_that_systemd_and_prometheus_accept(tmp_path: Path):
    project = tmp_path / "ops"
    made = make_project(project)
    monitoring = project / "monitoring"
    assert {
        "monitoring/fleetops.rules.yml",
        "monitoring/fleetops-verify.service",
        "monitoring/fleetops-verify.timer",
    } <= set(made.written)
    shipped = files("fleetops").joinpath("monitoring", "fleetops.rules.yml").read_bytes()
    assert (monitoring / "fleetops.rules.yml").read_bytes() == shipped
    checked = subprocess.run(
        [
            shutil.which("promtool") or "promtool",
            "check",
            "rules",
            str(monitoring / "fleetops.rules.yml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

    service = (monitoring / "fleetops-verify.service").read_text()
    settings = dict(
        line.split("=", 1)
        for line in service.splitlines()
        if "=" in line and not line.startswith("#")
    )
    assert (
        settings["WorkingDirectory"] == str(project.absolute())
        and settings["User"] == getpass.getuser()
    )
    program, *words = shlex.split(settings["ExecStart"])
    assert (
        Path(program).is_absolute() and Path(program).name == "fleet" and Path(program).exists()
    ), program
    assert words == ["-H", "@gpus", "patch", "--check", "verify", "--metrics", TEXTFILE]
    analysed = systemd_accepts(
        monitoring / "fleetops-verify.service", monitoring / "fleetops-verify.timer"
    )
    assert analysed.returncode == 0 and analysed.stderr.strip() == "", analysed.stderr


@pytest.mark.parametrize(
    ("unit", "old", "new"),
    [
        ("fleetops-verify.timer", "OnUnitActiveSec=15min", "OnUnitActiveSec=fifteen"),
        ("fleetops-verify.service", "Type=oneshot", "Type=one-shot"),
    ],
)
def test_the_check_sees_a_broken_unit(tmp_path: Path, unit: str, old: str, new: str):
    """systemd-analyze verify, as used above, says so when a unit is wrong: a clean result means
    something."""
    make_project(tmp_path)
    path = tmp_path / "monitoring" / unit
    path.write_text(path.read_text().replace(old, new))
    analysed = systemd_accepts(path)
    assert analysed.stderr.strip() != "", analysed
