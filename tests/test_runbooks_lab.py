"""The operator runbooks in docs/runbooks/ cannot rot. Every `console lab` command in them runs here
against a lab set up as the runbook's front matter says; its exit status and the output lines it
shows must hold. A runbook whose command fails, or whose output no longer matches, fails CI with its
file and line."""

from __future__ import annotations

import pytest
from conftest import copy_playbooks
from runbooks import RUNBOOKS, RunbookLab, check

from fleetops.plans.runbooks import load_all, parse

BOOKS = load_all(RUNBOOKS)


@pytest.fixture(scope="module")
def rlab(lab_factory, newer_base):
    """The runbooks' lab: its playbooks/ a real copy (a runbook authors a playbook there), the lab's
    second base built (a runbook moves a node to the newer vLLM)."""
    size = max(b.nodes for b in BOOKS)
    return RunbookLab(lab_factory.shared(size, __name__, layout=copy_playbooks).root, size)


def test_there_are_runbooks_and_each_runs_something():
    assert len(BOOKS) >= 8, [b.name for b in BOOKS]
    for book in BOOKS:
        assert book.steps, f"{book.path}: no `console lab` block: nothing of it would be tested"


@pytest.mark.parametrize("name", [b.name for b in BOOKS])
def test_runbook_holds_on_the_lab(rlab, name):
    book = next(b for b in BOOKS if b.name == name)
    problems = check(book, rlab)
    assert not problems, "\n\n".join(problems)


def test_a_broken_runbook_fails_with_its_file_and_line(rlab, tmp_path):
    """The check itself can fail: a renamed flag, and a shown line the tool does not print."""
    path = tmp_path / "broken.md"
    path.write_text(
        "---\ntitle: Broken on purpose\nsymptom: none\n---\n\n```console lab\n"
        "$ fab -H lab01 verify --kindz grep\n```\n\n```console lab\n$ fab -H lab01 ping\n"
        "lab01 | ping | ok | the agent sang a song\n```\n"
    )
    book = parse(path.read_text(), path)
    problems = check(book, rlab)
    assert len(problems) == 1 and problems[0].startswith(
        f"{path}:7: `fab -H lab01 verify --kindz grep` exited 1"
    ), problems
    book.steps = book.steps[1:]
    problems = check(book, rlab)
    assert len(problems) == 1 and problems[0].startswith(
        f"{path}:11: `fab -H lab01 ping`: the runbook shows "
        "'lab01 | ping | ok | the agent sang a song'"
    ), problems


def test_fab_runbooks_lists_each_with_its_symptom(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from conftest import REPO

    proc = subprocess.run(
        [sys.executable, "-m", "fabric", "runbooks", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    listed = {b["name"]: b for b in json.loads(proc.stdout)}
    assert set(listed) == {b.name for b in BOOKS}
    assert all(b["symptom"] and (REPO / b["file"]).is_file() for b in listed.values()), listed
    human = subprocess.run(
        [sys.executable, "-m", "fabric", "runbooks"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
        timeout=120,
    )
    # folder, file
    assert "(docs/runbooks/)" in human.stdout and "node-drifted.md" in human.stdout, human.stdout
    assert "Host key changed" in human.stdout, human.stdout
