"""`./scripts/lab-demo` runs the job this tool exists for, whole: `patch verify extract tail` on the
lab node, and README shows what that prints, from a real run (a sample block:
tests/test_readme_samples_lab.py runs it on a lab and compares), ending with the job's summary
(samples, tok/s)."""

from __future__ import annotations

import re
import shlex

from conftest import REPO
from readmesamples import parse_samples

DEMO = REPO / "scripts" / "lab-demo"
README = (REPO / "README.md").read_text()
WHOLE_JOB = ["-H", "lab01", "patch", "verify", "extract", "tail"]


def demo_commands() -> list[list[str]]:
    lines = [
        line for line in DEMO.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    return [shlex.split(line) for line in lines]


def test_the_demo_runs_the_whole_job_and_ends_with_it():
    commands = demo_commands()
    fab = [words[1:] for words in commands if words[0] == ".venv/bin/fab"]
    assert fab and fab[-1] == WHOLE_JOB, commands
    assert commands[-1][0] == ".venv/bin/fab", (
        "nothing after the job hides its exit status or its summary"
    )
    assert ["lab.up"] in fab
    setup = README.split("## Set up", 1)[1].split("```", 2)[1]
    assert "patch verify extract tail" in next(
        line for line in setup.splitlines() if "lab-demo" in line
    )


def test_readme_shows_the_whole_jobs_output_from_a_run_ending_with_the_jobs_summary():
    samples = [s for s in parse_samples(README) if shlex.split(s.command)[1:] == WHOLE_JOB]
    assert len(samples) == 1, [s.command for s in parse_samples(README)]
    sample = samples[0]
    assert sample.exit == 0
    body = [line for line in sample.body if line.strip()]
    assert any(re.search(r"lab01 \| extract \| ", line) for line in body), body
    # the run's closing line
    assert body[-1].startswith("1 host: 0 ok, 1 changed, 0 failed"), body[-1]
    # tail's own verdict, the run's last task line, says what the job did: its samples and its
    # speed.
    assert re.fullmatch(
        r"lab01 \| tail \| ok \| job extract-\S+ succeeded \(exit status 0\); "
        r"(\d+)/\1 samples, \d+ tok/s",
        body[-2],
    ), body[-2]
    # Above it, the job's own last line, as the job wrote it.
    assert re.fullmatch(
        r"lab01 \| done: (\d+)/\1 samples, .* [0-9.]+ tok/s, output <checkout>/\S+", body[-4]
    ), body[-4]
    assert "/root/" not in "\n".join(body) and "/tmp/" not in "\n".join(body), (
        "no machine-specific path"
    )
