"""What an agent start loads and writes for the requests every run sends (patch, verify): patch's guard
looks for a running job without loading the job launcher (subprocess, ctypes, the keeper), a job id needs no
`secrets`, and the node lock's holder note is written without fsync (the flock is the lock; the note only
names the holder). Each is node CPU on every run (docs/perf.md has the figures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO

from remote_scripts.core import atomicio, nodelock


def _modules_after(statement: str) -> set[str]:
    """sys.modules after `statement`, in a Python started as the agent's is (-I -S), this checkout first."""
    code = f"import sys, json\nsys.path.insert(0, {str(REPO)!r})\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return set(json.loads(out))


def test_patch_guard_leaves_the_launcher_unloaded():
    loaded = _modules_after("import remote_scripts.health.guard")
    assert "remote_scripts.jobs.launchlock" in loaded  # the guard does take the launch lock
    assert not {"remote_scripts.jobs.start", "remote_scripts.jobs.keeper", "subprocess", "ctypes",
                "secrets"} & loaded


def test_a_request_loads_no_writer_lock_or_module_lookup_it_does_not_use(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    loaded = _modules_after("from remote_scripts.core import agent\n"
                            f"agent._run(agent.PING.handler, {{'op': 'ping', 'state_dir': {str(state)!r}}})")
    assert {"remote_scripts.core.statetrust", "remote_scripts.core.failpoints"} <= loaded  # the state dir was checked
    assert not {"remote_scripts.core.atomicio", "remote_scripts.core.nodelock", "remote_scripts.core.sitemodules",
                "remote_scripts.core.dists", "fcntl"} & loaded


def test_the_manifest_loads_an_op_module_only_when_a_request_needs_it():
    loaded = _modules_after("from remote_scripts import ops\nops.find_op('gpu')")
    ours = {m for m in loaded if m.startswith("remote_scripts.")}
    assert "remote_scripts.health.gpu" in ours
    assert not {m for m in ours if m.split(".")[1] in ("jobs", "checks", "patch")} | (
        ours & {"remote_scripts.health.guard", "remote_scripts.health.diagnose", "remote_scripts.health.drain"})


def test_the_launcher_still_takes_the_same_lock():
    from remote_scripts.jobs import launchlock, start

    assert start.LaunchLock is launchlock.LaunchLock


def test_a_new_job_id_is_random_without_secrets(tmp_path):
    from remote_scripts.jobs.records import new_job_dir

    ids = {os.path.basename(new_job_dir(str(tmp_path), "extract")[0]) for _ in range(20)}
    assert len(ids) > 10 and all(i.startswith("extract-") and len(i.rsplit("-", 1)[1]) == 4 for i in ids)


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
