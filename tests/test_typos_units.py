"""Typos and wrong values on the command line: each a usage error (exit 2) with the nearest right
word, said before anything is contacted or changed; never exit 0 for a lab node that does not exist.
A word the parser does not know is `fleet`'s usage error with the nearest right word; Fabric's own
`fab` answers it as Invoke does ("No idea what 'x' is!", exit 1), still before anything runs. No
lab: the lab tasks are asked about nodes of a project that has none."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from fleetops.init import make_project
from fleetops.plans.inventory import UnknownHost, load_inventory

BIN = Path(sys.executable).parent


def run(program: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run(
        [str(BIN / program), *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120
    )


def usage_error(proc: subprocess.CompletedProcess, *words: str) -> str:
    both = proc.stdout + proc.stderr
    assert proc.returncode == 2, both
    assert "Traceback" not in both and "No idea what" not in both, both
    for word in words:
        assert word in proc.stderr, proc.stderr
    return proc.stderr


@pytest.fixture
def project(tmp_path) -> Path:
    make_project(tmp_path)
    return tmp_path


def test_a_misspelt_second_task_gets_did_you_mean(project):
    usage_error(
        run("fleet", project, "-H", "lab01", "patch", "verfy"),
        "'verfy' is not a task (did you mean `verify`?)",
        "`fleet --list`",
    )


def test_a_misspelt_task_is_a_clean_line(project):
    err = usage_error(
        run("fleet", project, "-H", "lab01", "pacth"),
        "'pacth' is not a task (did you mean `patch`?)",
    )
    assert len(err.strip().splitlines()) == 1, err


def test_a_misspelt_option_of_a_task_gets_the_tasks_option(project):
    usage_error(
        run("fleet", project, "lab.up", "--node", "2"),
        "'--node' is not an option of lab.up (did you mean `--nodes`?)",
        "`fleet --help lab.up`",
    )


def test_fabs_own_parser_answers_a_word_it_does_not_know_before_anything_runs(project):
    for args in (["-H", "lab01", "patch", "verfy"], ["lab.up", "--node", "2"]):
        proc = run("fab", project, *args)
        assert proc.returncode == 1 and "No idea what" in proc.stderr, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr and not (project / ".lab").exists(), proc.stderr


def test_a_misspelt_core_flag_of_fleet_gets_the_core_flag(project):
    usage_error(
        run("fleet", project, "--seral", "1", "-H", "lab01", "ping"), "(did you mean `--serial`?)"
    )


@pytest.mark.parametrize("task", ["lab.gpu", "lab.kernel", "lab.reset"])
def test_a_lab_node_that_does_not_exist_is_an_error_not_a_silent_0(project, task):
    usage_error(
        run("fab", project, task, "--node", "lab09"),
        f"{task} --node 'lab09': no lab node 'lab09'",
        "fab lab.up",
    )


def test_a_gpu_state_that_does_not_exist_names_the_states(project):
    usage_error(
        run("fab", project, "lab.gpu", "--state", "bussy"),
        "'bussy' is not a GPU state (did you mean 'busy'?)",
        "idle, busy, missing, driver_error, absent",
    )


def test_a_job_id_the_node_would_refuse_is_refused_before_connecting(project):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    (project / "hosts" / "mine.yaml").write_text(
        f"hosts:\n  mine:\n    address: 127.0.0.1\n    port: {listener.getsockname()[1]}\n"
    )
    try:
        usage_error(
            run("fab", project, "-H", "mine", "status", "--job-id", "extract 1"),
            "--job-id 'extract 1' is not a job id",
        )
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
    finally:
        listener.close()


def test_errors_list_this_projects_hosts_and_groups_not_the_examples(project):
    (project / "hosts" / "mine.yaml").write_text(
        "hosts:\n  node01: {address: 127.0.0.1, groups: [gpu]}\n  node02: {address: "
        "127.0.0.2, groups: [gpu]}\n"
    )
    inv = load_inventory(project / "hosts")
    assert inv.hosts["gpu01"].example  # the example inventory is there, beside this project's own
    with pytest.raises(UnknownHost) as host:
        inv.expand(["gpu1"])
    assert "known hosts: node01, node02 " in str(host.value) and "gpu01" not in str(host.value), (
        host.value
    )
    with pytest.raises(UnknownHost) as group:
        inv.expand(["@gpus_"])
    assert "(known groups: gpu)" in str(group.value), group.value
    assert "h200" not in str(group.value) and "'@gpus'" not in str(group.value), group.value
    proc = run("fab", project, "-H", "@h20", "ping")
    assert "known groups: gpu)" in usage_error(proc), proc.stderr
    assert "h200" not in proc.stderr, proc.stderr


def test_the_example_alone_is_still_listed(project):
    """A fresh project has only the example: its hosts are what there is to name (refused as
    targets)."""
    with pytest.raises(UnknownHost, match="known hosts: gpu01"):
        load_inventory(project / "hosts").expand(["gpu1"])
