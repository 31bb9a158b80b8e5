"""One way to write a length of time across the client: a GPU process's age, a job's runtime and the
bars' ETA agree (125 s is 2m05s wherever it is shown, and an ETA is a clock). No lab."""

from __future__ import annotations

import pytest

from fleetops.plans.gpugate import describe_process
from fleetops.plans.tables import bar, short_process
from fleetops.plans.timefmt import clock, duration
from fleetops.tasks.jobs import interpret_jobs_list
from fleetops.tasks.plan import Plan


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "?"),
        (0, "0s"),
        (59.9, "59s"),
        (119, "119s"),
        (120, "2m00s"),
        (125, "2m05s"),
        (7199, "119m59s"),
        (7200, "2h00m"),
        (7325, "2h02m"),
        (-3, "0s"),
    ],
)
def test_duration(seconds, text):
    assert duration(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "text"), [(None, "-"), (5, "0:05"), (125, "2:05"), (3725, "1:02:05")]
)
def test_clock(seconds, text):
    assert clock(seconds) == text


def test_every_place_that_shows_125_seconds_says_2m05s():
    process = {
        "pid": 7,
        "name": "python",
        "used_mib": 10,
        "user": "alice",
        "age_s": 125,
        "command": "python x",
    }
    assert "2m05s" in short_process(process).split()
    assert ", 2m05s," in describe_process(process)
    job = {"id": "j1", "state": "running", "runtime_s": 125, "started": "2026-01-01T00:00:00Z"}
    result = interpret_jobs_list(
        "h", Plan("jobs_list", {}, 1, None), {"jobs": [job], "total": 1, "jobs_dir": "/x"}
    )
    assert result.data["table"]["rows"][0][4] == "2m05s", result.data


def test_a_bar_writes_its_eta_as_a_clock():
    assert bar({"done": 1, "total": 4, "eta": 3725}).endswith(" ETA 1:02:05")
    assert bar({"done": 1, "total": 4, "eta": 125}).endswith(" ETA 2:05")
