"""What `fleet schedule` installs, without a lab: the intervals cron and systemd agree on, the words
a crontab line cannot carry, the unit files' shape. The lab test (tests/test_schedule_lab.py) runs
what is installed."""

from __future__ import annotations

import pytest

from fleetops.tasks.plan import UsageError
from fleetops.tasks.schedule import every_seconds
from remote_scripts.core.nodeio import NodeError
from remote_scripts.health import schedule

WORDS = [
    "/venv/bin/python",
    "-I",
    "-S",
    "-c",
    schedule.LAUNCHER,
    "bootstrap-1.py",
    "a" * 64,
    "..",
    "../bin/fleetops-agent-1.pyz",
    "b" * 64,
    "scheduled",
    "verify.request",
    "c" * 64,
]


@pytest.mark.parametrize(
    ("text", "seconds", "cron", "calendar"),
    [
        ("15m", 900, "*/15 * * * *", "*-*-* *:00/15:00"),
        ("1m", 60, "* * * * *", "*-*-* *:00/1:00"),
        ("30", 1800, "*/30 * * * *", "*-*-* *:00/30:00"),
        ("1h", 3600, "0 * * * *", "*-*-* 00/1:00:00"),
        ("6h", 21600, "0 */6 * * *", "*-*-* 00/6:00:00"),
    ],
)
def test_an_interval_runs_at_the_same_wall_clock_times_under_cron_and_systemd(
    text, seconds, cron, calendar
):
    assert every_seconds(text) == seconds
    assert schedule.interval_words(seconds) == (cron, calendar)


@pytest.mark.parametrize("text", ["7m", "45m", "5h", "0m", "15s", "m", "-5m", "1d"])
def test_an_interval_cron_cannot_keep_is_refused_before_anything_connects(text):
    with pytest.raises(UsageError, match="--every"):
        every_seconds(text)


def test_the_launcher_is_one_line_that_neither_cron_nor_systemd_rewrites():
    assert not set(schedule.LAUNCHER) & {"%", "\n", "'", "$"}


def test_a_path_with_a_percent_or_a_line_break_is_refused_not_written_into_the_crontab():
    with pytest.raises(NodeError, match="% or a line break"):
        schedule.shell_line(
            "/srv/state%d/schedule", WORDS, "verify.log", "/var/lib/node-exporter/x.prom"
        )


def test_the_line_removes_the_textfile_and_fails_when_the_run_refuses():
    line = schedule.shell_line("/srv/state/schedule", WORDS, "verify.log", "/var/lib/n e/x.prom")
    assert line.startswith(
        "cd /srv/state/schedule && /venv/bin/python -I -S -c 'import sys,hashlib;"
    )
    assert line.endswith(">>verify.log 2>&1 || { rm -f -- '/var/lib/n e/x.prom'; exit 1; }")


def test_the_units_run_from_the_schedule_folder_and_keep_no_textfile_after_a_failed_run():
    made = schedule.units(
        "verify", "/srv/state", 900, WORDS, "/var/lib/node-exporter/x.prom", False
    )
    unit = schedule.unit_name("/srv/state", "verify")
    assert sorted(made) == [f"{unit}.service", f"{unit}.timer"]
    service = made[f"{unit}.service"]
    assert (
        "WorkingDirectory=/srv/state/schedule" in service
        and "StandardOutput=append:/srv/state/schedule/verify.log" in service
    )
    assert '$$SERVICE_RESULT" = success || rm -f -- /var/lib/node-exporter/x.prom' in service
    assert "OnCalendar=*-*-* *:00/15:00" in made[f"{unit}.timer"]


def test_hosts_sharing_a_machine_get_a_textfile_each():
    assert schedule.textfile_name("verify", "gpu-01") == "fleetops-verify-gpu-01.prom"
    assert schedule.textfile_name("verify", "a/b c") == "fleetops-verify-a_b_c.prom"


def test_a_new_project_gets_the_dashboard_beside_the_alert_rules():
    import json
    from importlib.resources import files

    from fleetops.init import project_files

    made = project_files()
    shipped = files("fleetops").joinpath("monitoring", "fleetops.dashboard.json").read_bytes()
    assert made["monitoring/fleetops.dashboard.json"] == shipped
    assert json.loads(shipped)["uid"] == "fleetops-verify"
