"""What an agent start loads and writes for the requests every run sends (patch, verify): patch's
guard looks for a running job without loading the job launcher (subprocess, ctypes, the keeper), a
job id needs no `secrets`, and the node lock's holder note is written without fsync (the flock is
the lock; the note only names the holder). Each is node CPU on every run (docs/perf.md has the
figures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO

from remote_scripts.core import atomicio, nodelock


def _modules_after(statement: str) -> set[str]:
    """sys.modules after `statement`, in a Python started as the agent's is (-I -S), this checkout
    first."""
    code = (
        f"import sys, json\nsys.path.insert(0, {str(REPO)!r})\n{statement}\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(out))


def test_patch_guard_leaves_the_launcher_unloaded():
    loaded = _modules_after("import remote_scripts.health.guard")
    assert "remote_scripts.jobs.launchlock" in loaded  # the guard does take the launch lock
    assert (
        not {
            "remote_scripts.jobs.start",
            "remote_scripts.jobs.keeper",
            "subprocess",
            "ctypes",
            "secrets",
        }
        & loaded
    )


def test_a_request_loads_no_writer_lock_or_module_lookup_it_does_not_use(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    loaded = _modules_after(
        "from remote_scripts.core import agent\n"
        f"agent._run(agent.PING.handler, {{'op': 'ping', 'state_dir': {str(state)!r}}})"
    )
    # the state dir was checked
    assert {"remote_scripts.core.statetrust", "remote_scripts.core.failpoints"} <= loaded
    assert (
        not {
            "remote_scripts.core.atomicio",
            "remote_scripts.core.nodelock",
            "remote_scripts.core.sitemodules",
            "remote_scripts.core.dists",
            "fcntl",
        }
        & loaded
    )


def test_the_manifest_loads_an_op_module_only_when_a_request_needs_it():
    loaded = _modules_after("from remote_scripts import ops\nops.find_op('gpu')")
    ours = {m for m in loaded if m.startswith("remote_scripts.")}
    assert "remote_scripts.health.gpu" in ours
    assert not {m for m in ours if m.split(".")[1] in ("jobs", "checks", "patch")} | (
        ours
        & {
            "remote_scripts.health.guard",
            "remote_scripts.health.diagnose",
            "remote_scripts.health.drain",
        }
    )


def test_the_launcher_still_takes_the_same_lock():
    from remote_scripts.jobs import launchlock, start

    assert start.LaunchLock is launchlock.LaunchLock


def test_a_new_job_id_is_random_without_secrets(tmp_path):
    from remote_scripts.jobs.records import new_job_dir

    ids = {os.path.basename(new_job_dir(str(tmp_path), "extract")[0]) for _ in range(20)}
    assert len(ids) > 10 and all(
        i.startswith("extract-") and len(i.rsplit("-", 1)[1]) == 4 for i in ids
    )


def test_the_lock_note_skips_fsync_and_state_writes_keep_it(tmp_path, monkeypatch):
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    with nodelock.NodeLock(str(state), "op@laptop", "patch"):
        assert json.loads((state / "lock.json").read_text())["operator"] == "op@laptop"
    assert calls == []
    atomicio.write_json_atomic(str(state / "record.json"), {"a": 1})
    assert len(calls) == 2  # the file, then its directory


def test_the_modules_every_run_loads_leave_typing_unloaded():
    # typing (with contextlib) is ~3.5 ms of every agent start: annotations are strings here, the
    # types are the checker's alone
    loaded = _modules_after(
        "from remote_scripts import ops\nimport remote_scripts.core.launch\n"
        "ops.find_op('patch'); ops.find_op('verify')\n"
        "import remote_scripts.jobs.records, remote_scripts.patch.writeset"
    )
    assert {
        "remote_scripts.core.launch",
        "remote_scripts.health.guard",
        "remote_scripts.patch.hunks",
        "remote_scripts.checks.checks",
    } <= loaded
    assert "typing" not in loaded


def test_a_job_spec_expands_as_it_did():
    from remote_scripts.jobs.records import expand

    spec = {
        "cmd": ["{python}", "-m", "x", "--out={job_dir}/o"],
        "env": {"S": "{state_dir}"},
        "n": 3,
    }
    assert expand(
        spec, {"python": "/v/bin/python", "job_dir": "/s/jobs/j1", "state_dir": "/s"}
    ) == {"cmd": ["/v/bin/python", "-m", "x", "--out=/s/jobs/j1/o"], "env": {"S": "/s"}, "n": 3}


def test_the_versions_a_run_asks_first_load_no_gpu_reader(tmp_path):
    # every patch and verify run starts with a packages_only `facts`: nvidia-smi's readers are ~10
    # ms of node CPU it does not use
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    req = {
        "op": "facts",
        "state_dir": str(state),
        "packages_only": True,
        "requires": [
            {"requirement": "pytest", "package": "pytest"},
            {"requirement": "nosuch", "package": "nosuch"},
        ],
    }
    loaded = _modules_after(
        "from remote_scripts import ops\n"
        f"answer = ops.find_op('facts').handler({req!r})\n"
        "assert answer['ok'] and answer['requirements'][1]['found'] is None, answer\n"
        "assert answer['requirements'][0]['package'] == 'pytest', answer"
    )
    assert "remote_scripts.health.gpu" in loaded
    assert (
        not {
            "subprocess",
            "shutil",
            "platform",
            "glob",
            "pwd",
            "xml.etree.ElementTree",
            "remote_scripts.health.nvsmi",
            "remote_scripts.core.drainmark",
        }
        & loaded
    )
