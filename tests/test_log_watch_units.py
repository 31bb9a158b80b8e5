"""How tail and logs read a job's lines, for SSH and Slurm jobs alike (plans/jobspec.py LogWatch):
the playbook job's own patterns, or the defaults when the playbook names no such job; failure lines
kept in order. No lab."""

from __future__ import annotations

import re

from fleetops.plans.jobspec import DEFAULT_PROGRESS, LogWatch, resolve
from fleetops.plans.playbook import load_playbook


def test_without_a_job_the_default_patterns_read_progress_and_failures():
    watch = LogWatch.of(None)
    assert watch.progress.pattern == DEFAULT_PROGRESS
    assert watch.read("samples=3/10 tok/s=41.5 eta=12.0s") == (
        False,
        {"done": 3, "total": 10, "tok_s": 41.5, "eta": 12.0},
    )
    assert watch.read("Traceback (most recent call last):") == (True, None)
    assert watch.read("RuntimeError: CUDA out of memory") == (True, None)
    assert watch.read("loading weights") == (False, None)
    assert watch.failures == [
        "Traceback (most recent call last):",
        "RuntimeError: CUDA out of memory",
    ]


def test_a_playbook_job_brings_its_own_patterns(tmp_path):
    path = tmp_path / "pb.yaml"
    path.write_text(
        "name: x\njobs:\n  train:\n    kind: command\n    command: [echo, hi]\n"
        "    progress: 'step (?P<done>\\d+) of (?P<total>\\d+)'\n    failures: ['^FATAL']\n"
    )
    book = load_playbook(path)
    spec = resolve("train", book.jobs["train"], [])
    watch = LogWatch.of(spec)
    assert watch.progress is spec.progress and watch.failure == spec.failures
    assert watch.read("step 4 of 9")[1] == {"done": 4, "total": 9}
    # not this job's failure
    assert watch.read("Traceback (most recent call last):") == (False, None)
    assert watch.read("FATAL: disk") == (True, None)
    assert watch.failures == ["FATAL: disk"]
    assert isinstance(watch.progress, re.Pattern)
