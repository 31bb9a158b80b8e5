"""`tail`'s closing line carries the job's summary (samples, tok/s), read from the job's own
progress lines with the playbook's `progress:` pattern: here on the log of a real lab extraction
(tests/fixtures/jobs/README.md)."""

from __future__ import annotations

import re

import yaml
from conftest import REPO

from fleetops.plans.jobspec import DEFAULT_PROGRESS
from fleetops.plans.jobsummary import job_summary, log_summary

LOG = (REPO / "tests" / "fixtures" / "jobs" / "lab-extract-output.log").read_text().splitlines()


def playbook_progress(name: str) -> re.Pattern[str]:
    book = yaml.safe_load((REPO / "playbooks" / f"{name}.yaml").read_text())
    return re.compile(book["jobs"]["extract"]["progress"])


def test_the_summary_of_a_real_lab_extraction_is_its_last_progress_report():
    for pattern in (
        playbook_progress("speculators-0.3.0-vllm-0.16"),
        playbook_progress("speculators-0.3.0-vllm-0.17"),
        re.compile(DEFAULT_PROGRESS),
    ):
        assert log_summary(LOG, pattern) == "64/64 samples, 5563 tok/s"


def test_a_job_cut_short_says_how_far_it_got():
    cut = LOG[: LOG.index(next(line for line in LOG if "samples=24/64" in line)) + 1]
    assert log_summary(cut, re.compile(DEFAULT_PROGRESS)) == "24/64 samples, 7336 tok/s"


def test_a_log_without_progress_gives_no_summary_rather_than_zeros():
    head = [line for line in LOG if "samples=" not in line]
    assert head and log_summary(head, re.compile(DEFAULT_PROGRESS)) == ""
    assert job_summary([]) == job_summary([None]) == ""


def test_the_tasks_of_a_slurm_array_are_summed():
    assert (
        job_summary(
            [
                {"done": 32, "total": 32, "tok_s": 2000.4},
                {"done": 30, "total": 32, "tok_s": 1999.9},
                None,
            ]
        )
        == "62/64 samples, 4000 tok/s"
    )
    assert job_summary([{"done": 5, "total": 10}]) == "5/10 samples"  # a pattern without tok/s
