"""A lab brought up in a project that is a git work tree keeps its files out of that project's git:
`lab.up` adds to its .gitignore what the lab and fleetops write there (the lab's keys, its
inventory, .fleetops/, fetched/, an exported ssh_config), and git status then shows none of them."""

from __future__ import annotations

import subprocess

import pytest

pytestmark = pytest.mark.lab


def git_project(project) -> None:
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    (project / ".gitignore").write_text("*.pyc")  # the project's own line, no newline at its end


@pytest.fixture(scope="module")
def gitlab(lab_factory):
    with lab_factory.own("git-project", 1, layout=git_project) as lab:
        yield lab


def test_lab_up_in_a_git_project_ignores_what_it_writes(gitlab):
    project = gitlab.root
    for name in (".fleetops/last-failed", "fetched/lab01/job/output.log", "fleet.ssh_config"):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text("x\n")
    status = subprocess.run(
        ["git", "-C", str(project), "status", "--porcelain", "--untracked-files=all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    shown = {line[3:] for line in status.splitlines()}
    assert not any(
        p.startswith((".lab/", ".fleetops/", "fetched/", "hosts/lab.yaml", "fleet.ssh_config"))
        for p in shown
    ), status
    lines = (project / ".gitignore").read_text().splitlines()
    # its own line kept
    assert lines[0] == "*.pyc" and ".lab/" in lines and "hosts/lab.yaml" in lines, lines
    gitlab.up(1)  # again: nothing added twice
    assert (project / ".gitignore").read_text().splitlines() == lines
