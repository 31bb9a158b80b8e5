"""The node agent under every node Python the README states (3.9-3.13, pyenv's real interpreters),
answering a battery of real requests exactly as it does under the client's Python: ping, facts,
patch --check, patch (twice), verify (the file checks, and the shipped playbook on a node without
vLLM), rollback, run, and a job through its keeper (a process the agent starts through the bootstrap
again) with its records.

Each Python gets a venv of its own with speculators 0.3.0's files as pip installed them in the lab
base venv (pure Python; the real wheel's RECORD), and a state dir; the agent runs as the client
starts it, without SSH (tests/agentrun.py). The answers are compared with those under the client's
own interpreter, field by field, after what must differ (paths, the Python's version, pids, times)
is named. Under CI=true a missing interpreter fails (conftest: no silent skip); elsewhere it is
skipped with the way to install it."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agentrun import answers
from conftest import GENERATOR, REPO, WORKER, record_sha256

from fleetops.lab.pythons import NODE_PYTHONS, find_python
from fleetops.plans.playbook import load_playbook
from fleetops.plans.versions import judged_checks, parse_pin

PLAYBOOK = REPO / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml"
CLIENT = "client"  # the reference: the client's own interpreter
FILE_KINDS = {"grep", "compile"}  # what needs no vLLM
# a possessive quantifier: `re` reads it from Python 3.11 on
POSSESSIVE = r"^\s*+enable_prefix_caching=False,"


def _version(python: Path) -> str:
    return subprocess.run(
        [str(python), "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _node(python: Path, top: Path, base_site: Path) -> tuple[Path, Path, Path]:
    """(venv python, its site-packages, state dir): a venv of `python` with speculators' files from
    the base."""
    venv = top / "venv"
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    for entry in [base_site / "speculators", *base_site.glob("speculators-*.dist-info")]:
        shutil.copytree(entry, site / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
    return venv / "bin" / "python", site, top / "state"


def _battery(python: Path, site: Path, state: Path) -> dict:
    """Every answer, and the files' bytes between the steps, for one interpreter."""
    book = load_playbook(PLAYBOOK)
    # this node has no vLLM
    files_only = {"requires": [parse_pin("speculators==0.3.0").to_request()]}
    check = {"op": "patch", **book.patch_request(check=True), **files_only}
    patch = {"op": "patch", **book.patch_request(), **files_only}
    verify_files = {"op": "verify", **book.verify_request(FILE_KINDS), **files_only}
    verify_all = {"op": "verify", **book.verify_request()}
    possessive = {
        "op": "verify",
        "requires": [],
        "checks": [
            {
                "kind": "grep",
                "name": "possessive",
                "module": GENERATOR,
                "pattern": POSSESSIVE,
                "expect": "match",
                "search": "code",
            }
        ],
    }
    job = {
        "name": "hello",
        "kind": "command",
        "argv": [str(python), "-c", "import sys; print(sys.version_info[:2])"],
        "env": {},
        "shown_env": {},
    }
    out: dict = {"files": {}}
    first = answers(python, state, [{"op": "ping"}, {"op": "facts"}, check, patch])
    out.update(zip(("ping", "facts", "check", "patch"), first))
    out["files"]["patched"] = {m: _sha(site, m) for m in (GENERATOR, WORKER)}
    second = answers(
        python,
        state,
        [
            patch,
            verify_files,
            verify_all,
            possessive,
            {**patch, "op": "rollback"},
            {"op": "run", "command": "echo from $0; exit 3"},
            {"op": "job_start", "job": job},
        ],
    )
    out.update(
        zip(
            (
                "patch_again",
                "verify_files",
                "verify_all",
                "possessive",
                "rollback",
                "run",
                "job_start",
            ),
            second,
        )
    )
    out["files"]["rolled_back"] = {m: _sha(site, m) for m in (GENERATOR, WORKER)}
    job_dir = state / "jobs" / out["job_start"]["job"]["id"]
    deadline = time.monotonic() + 60
    while not (job_dir / "exit.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    ask = {"job_id": out["job_start"]["job"]["id"]}
    third = answers(
        python, state, [{"op": "job_status", **ask}, {"op": "jobs_list"}, {"op": "job_logs", **ask}]
    )
    out.update(zip(("job_status", "jobs_list", "job_logs"), third))
    return out


def _sha(site: Path, module: str) -> str:
    return hashlib.sha256((site / (module.replace(".", "/") + ".py")).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def runs(lab_base, tmp_path_factory) -> dict:
    """{CLIENT or X.Y: (version, site, battery's answers)}, built on first use per interpreter."""
    base_site = next(Path(lab_base).glob("lib/python3*/site-packages"))
    done: dict = {}

    def run(which: str):
        if which not in done:
            python = Path(sys.executable) if which == CLIENT else find_python(which)
            if python is None:
                pytest.skip(f"no Python {which} on this machine (pyenv install {which})")
            top = tmp_path_factory.mktemp(f"py{which}")
            venv_python, site, state = _node(python, top, base_site)
            done[which] = (_version(venv_python), site, _battery(venv_python, site, state), top)
        return done[which]

    return run


def _items(answer: dict, *keys: str) -> list[tuple]:
    return [tuple(i.get(k) for k in keys) for i in answer["items"]]


def _shown(answer: dict, top: Path, version: str) -> list[tuple]:
    """verify's items as the operator reads them, with this node's paths and Python's version named
    alike."""

    def same(text: str) -> str:
        return (
            text.replace(str(top), "<node>")
            .replace(version, "<python>")
            .replace(f"python{'.'.join(version.split('.')[:2])}", "python3.X")
        )

    return [
        (
            i["name"],
            i["kind"],
            i["ok"],
            same(i["msg"]),
            [same(json.dumps(e)) for e in i["evidence"]],
        )
        for i in answer["items"]
    ]


@pytest.mark.parametrize("which", NODE_PYTHONS)
def test_the_agent_answers_under_each_node_python_as_under_the_clients(runs, which):
    version, site, got, top = runs(which)
    ref_version, ref_site, ref, ref_top = runs(CLIENT)
    assert version.startswith(which + ".")

    assert got["ping"]["ok"] and got["ping"]["version"] == version
    assert (got["facts"]["python"], got["facts"]["packages"]) == (
        version,
        {"vllm": None, "speculators": "0.3.0", "torch": None, "transformers": None},
    )

    # the patch: the same statuses, the same bytes written, the same bytes put back (pip's RECORD)
    for step in ("check", "patch", "patch_again", "rollback"):
        assert _items(got[step], "module", "status", "changed", "ok") == _items(
            ref[step], "module", "status", "changed", "ok"
        ), step
    assert {i["status"] for i in got["patch"]["items"]} == {"applied"}
    assert {i["status"] for i in got["rollback"]["items"]} == {"restored"}
    assert got["files"]["patched"] == ref["files"]["patched"]
    assert got["files"]["rolled_back"] == {m: record_sha256(site, m) for m in (GENERATOR, WORKER)}

    # the file checks pass; the shipped playbook says vLLM is missing and runs nothing that needs it
    # (the pins judged on the client, as fleetops does)
    for answers_of in (got, ref):
        for step in ("verify_files", "verify_all"):
            answers_of[step] = judged_checks(answers_of[step], False)
    assert got["verify_files"]["ok"] and len(got["verify_files"]["items"]) == 1 + 11 + 2
    for step in ("verify_files", "verify_all"):
        assert _shown(got[step], top, version) == _shown(ref[step], ref_top, ref_version), step
    by_kind = {i["kind"]: i for i in got["verify_all"]["items"]}
    assert not got["verify_all"]["ok"] and not by_kind["requires"]["ok"]
    for kind in ("import", "callsites", "probe"):
        assert by_kind[kind]["not_run"] and "vllm is not installed" in by_kind[kind]["msg"], (
            by_kind[kind]
        )

    (item,) = got["possessive"]["items"]
    if tuple(map(int, which.split("."))) >= (3, 11):
        assert item["ok"], item  # asked while the file was patched
    else:
        assert not item["ok"] and item["msg"].startswith(
            f"/{POSSESSIVE}/ is not a regular expression this node's Python {version} reads"
        ), item

    assert (
        (got["run"]["exit_code"], got["run"]["stdout"])
        == (3, "from /bin/sh\n")
        == (ref["run"]["exit_code"], ref["run"]["stdout"])
    )

    # a job: started through the bootstrap again (its keeper), recorded, ended, its log read back
    assert (
        got["job_start"]["ok"]
        and got["job_status"]["state"] == ref["job_status"]["state"] == "succeeded"
    )
    assert got["job_status"]["exit"]["exit_code"] == 0
    assert [(j["name"], j["state"]) for j in got["jobs_list"]["jobs"]] == [("hello", "succeeded")]
    assert got["job_logs"]["lines"] == [str(tuple(map(int, which.split("."))))]
