"""A tail's request (tasks/reconnect.py tail_request), the same for SSH jobs and Slurm jobs:
attaching (no offset yet) asks for the last N lines or the whole log; later turns ask from where the
last answer ended."""

from __future__ import annotations

from fleetops.tasks.reconnect import TAIL_WAIT_S, tail_request


def test_attaching_asks_for_the_last_lines_or_the_whole_log():
    assert tail_request({"job_id": None, "offset": None}, (20, False)) == {
        "job_id": None,
        "offset": None,
        "wait_s": TAIL_WAIT_S,
        "last_lines": 20,
        "from_start": False,
    }
    assert tail_request({"job_id": "j1", "offsets": None}, (None, True)) == {
        "job_id": "j1",
        "offsets": None,
        "wait_s": TAIL_WAIT_S,
        "last_lines": None,
        "from_start": True,
    }


def test_later_turns_go_on_from_the_offsets():
    assert tail_request({"job_id": "j1", "offset": 0}, (20, False)) == {
        "job_id": "j1",
        "offset": 0,
        "wait_s": TAIL_WAIT_S,
    }
    assert tail_request({"job_id": "j1", "offsets": [10, 0]}, (20, True)) == {
        "job_id": "j1",
        "offsets": [10, 0],
        "wait_s": TAIL_WAIT_S,
    }
