"""A host task is one declaration in its family's module (fleetops/tasks/declare.py): a task added
there, and nowhere else, is in `fleet --list`, `fleet --help TASK`, the API and --json, and runs on
a real lab node. The launcher below adds it to the node family's TASKS before anything reads the
table: what one more entry in fleetops/tasks/node.py does, with no other file touched."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO

DECLARED = """
import sys

from fleetops.results import Result, Status
from fleetops.tasks import node
from fleetops.tasks.declare import JSON, HostTask, Option
from fleetops.tasks.plan import Plan


def _plan(run, kwargs):
    return Plan("ping", {"modules": []}, 60, None, options={"short": bool(kwargs.get("short"))})


def _interpret(host, plan, answer):
    version = answer["version"]
    if plan.options["short"]:
        version = ".".join(version.split(".")[:2])
    return Result(host, "pyversion", Status.OK, f"python {version}", data={"version": version})


node.TASKS.append(HostTask("pyversion", _plan, _interpret, op="ping",
                           help="The python version the node agent runs under.",
                           options=(Option("short", "major.minor only", False), JSON)))
"""

FRONT_END = (
    DECLARED
    + """
from fleetops.entry import main

sys.argv = ["fleet", *sys.argv[1:]]
main()
"""
)

API = (
    DECLARED
    + """
import json

from fleetops import api

results = api.run(".", "lab01", [("pyversion", {"short": True})])
print(json.dumps([sorted(api.TASK_OPTIONS["pyversion"]), [(r.host, r.task, r.status.value, r.data) \
for r in results]]))
try:
    api.run(".", "lab01", [("pyversion", {"shrot": True})])
except api.UnknownOption as exc:
    print(exc)
"""
)


def _python(project: Path, script: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
    )


def test_a_task_declared_in_one_module_is_everywhere(lab, tmp_path):
    fleet = tmp_path / "fleet_with_pyversion.py"
    fleet.write_text(FRONT_END)
    listed = _python(lab.root, fleet, "--list")
    assert listed.returncode == 0, listed.stderr
    assert re.search(
        r"^ +pyversion +The python version the node agent runs under\.$", listed.stdout, re.M
    )

    helped = _python(lab.root, fleet, "--help", "pyversion")
    assert helped.returncode == 0, helped.stderr
    assert "The python version the node agent runs under." in helped.stdout
    assert "--short" in helped.stdout and "major.minor only" in helped.stdout
    # the house flags and run options too
    assert "-j, --json" in helped.stdout and "--limit" in helped.stdout

    ran = _python(lab.root, fleet, "-H", "lab01", "pyversion", "--short", "--json")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    document = json.loads(ran.stdout)
    [result] = [r for r in document["results"] if r["task"] == "pyversion"]
    pinged = _python(lab.root, fleet, "-H", "lab01", "ping", "--json")
    [ping] = json.loads(pinged.stdout)["results"]
    assert result["host"] == "lab01" and result["status"] == "ok"
    assert result["data"]["version"] == ".".join(ping["data"]["version"].split(".")[:2])

    typo = _python(lab.root, fleet, "-H", "lab01", "pyversion", "--shrot")
    assert typo.returncode == 2 and "Traceback" not in typo.stdout + typo.stderr

    library = tmp_path / "api_with_pyversion.py"
    library.write_text(API)
    called = _python(lab.root, library)
    assert called.returncode == 0, called.stderr
    first, refusal = called.stdout.strip().splitlines()
    options, results = json.loads(first)
    assert options == ["short"]
    assert [[h, t, s] for h, t, s, _ in results] == [["lab01", "pyversion", "ok"]]
    assert results[0][3] == result["data"]
    assert "pyversion takes no option 'shrot'" in refusal and "did you mean" in refusal
