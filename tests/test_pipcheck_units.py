"""The client's pip check reads a node's answer with bounded work: a requirement too long, a marker
of too many clauses or too deep, too many requirements or too much text in all, is refused in one
line before packaging parses any of it; a real venv's answer is checked as pip check would."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from fleetops.plans import pipcheck
from fleetops.tasks.plan import unmet_warnings

# Python calls: parsing the thirty-mebibyte bomb on an unbounded client takes millions
CALL_BUDGET = 200_000


class TooMuchWork(Exception):
    pass


@contextmanager
def counted_calls(budget: int) -> Iterator[list[int]]:
    """Counts every Python function call made in this thread; past `budget` the work is stopped by
    raising, so a check that would cost seconds fails at once instead of being timed."""
    seen = [0]

    def profile(frame, event, arg):
        if event == "call":
            seen[0] += 1
            if seen[0] > budget:
                sys.setprofile(None)
                raise TooMuchWork(f"over {budget} calls")

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)


def bomb(count: int = 12, clauses: int = 100_000) -> dict:
    """The hostile facts answer: `count` Requires-Dist lines, each a marker of `clauses` `and`
    clauses (12 x 100,000 is 30 MiB, under the wire's cap)."""
    one = "dep; python_version > '1'" + " and python_version > '1'" * clauses
    return {
        "environment": {"python_version": "3.11"},
        "dists": [{"name": "dep", "version": "1"}]
        + [{"name": f"p{i}", "version": "1", "requires": [one + " " * i]} for i in range(count)],
    }


def real_venv(dists: int = 200, each: int = 15) -> dict:
    """An answer shaped like vLLM's venv: a few thousand short requirements, all met."""
    out = [
        {
            "name": f"d{i}",
            "version": "1.0",
            "requires": [
                f"d{(i + k) % dists}>=0.5; python_version >= '3.8' and platform_system == 'Linux'"
                for k in range(1, each)
            ],
        }
        for i in range(dists)
    ]
    return {"environment": {"python_version": "3.11", "platform_system": "Linux"}, "dists": out}


def test_a_thirty_mebibyte_marker_bomb_is_refused_in_one_line_with_bounded_work():
    answer = bomb()
    with counted_calls(CALL_BUDGET) as seen:
        warnings = unmet_warnings(answer)
    assert len(warnings) == 1 and warnings[0].startswith(
        "pip check not done: a requirement of 2500025 characters"
    )
    assert "\n" not in warnings[0]
    assert seen[0] < 1000, seen[0]  # refused on the text's size, before any parse


@pytest.mark.parametrize(
    ("requirement", "bound"),
    [
        ("dep; " + " and ".join(["os_name>'a'"] * 33), "joins 33 clauses"),
        ("dep; " + "(" * 17 + "python_version > '1'" + ")" * 17, "17 parentheses deep"),
        ("dep; " + "(" * 400 + "python_version > '1'" + ")" * 400, "400 parentheses deep"),
        ("dep; python_version > '" + "1" * 1100 + "'", "1124 characters"),
    ],
)
def test_a_marker_past_a_bound_is_refused_before_it_is_parsed(requirement, bound):
    answer = {
        "environment": {},
        "dists": [{"name": "dep", "version": "1", "requires": [requirement]}],
    }
    with counted_calls(1000), pytest.raises(pipcheck.Refused, match=bound):
        pipcheck.unmet(answer)


def test_many_short_requirements_are_refused_by_count_and_by_total_size():
    many = {
        "environment": {},
        "dists": [{"name": f"d{i}", "version": "1", "requires": ["x"] * 100} for i in range(201)],
    }
    with pytest.raises(pipcheck.Refused, match="over 20000 requirements"):
        pipcheck.unmet(many)
    long = "dep; " + " and ".join(["python_version > '1'"] * 30)
    big = {
        "environment": {},
        "dists": [{"name": f"d{i}", "version": "1", "requires": [long] * 10} for i in range(200)],
    }
    with pytest.raises(pipcheck.Refused, match="characters together"):
        pipcheck.unmet(big)
    with pytest.raises(pipcheck.Refused, match="distributions"):
        pipcheck.unmet({"dists": [{"name": f"d{i}"} for i in range(5001)]})


def test_a_real_venvs_answer_is_checked_within_the_bounds():
    answer = real_venv()
    answer["dists"][0]["requires"].append("torch==2.10.0")
    answer["dists"].append({"name": "torch", "version": "2.9.1"})
    found = pipcheck.unmet(answer)
    assert found == ["d0 1.0 requires torch==2.10.0, but you have torch 2.9.1"]
