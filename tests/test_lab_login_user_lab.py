"""`fab lab.up --login-user NAME`: a lab whose nodes a non-root user logs in to, with the sudoers
entry docs/become.md recommends, and an inventory of `become: sudo` hosts that work as written;
`lab.down` takes the sudoers entry and that inventory away. A real user (useradd), real sudo, the
lab's real sshd."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import run_fab

from fleetops.lab.login import HOSTS, sudoers_file

pytestmark = pytest.mark.lab

NAME = "fleetops-lablogin"


@pytest.fixture(scope="module")
def lab_with_login(lab_factory, root_user):
    with lab_factory.own("loginuser", 1, reachable=True) as lab:
        try:
            yield lab
        finally:
            sudoers_file(NAME).unlink(missing_ok=True)
            for node in lab.nodes():
                lab.configure_sshd(node)
            subprocess.run(["userdel", "-r", NAME], capture_output=True)


def test_lab_up_with_a_login_user_makes_become_hosts_that_run_as_root(lab_with_login):
    lab = lab_with_login
    proc = run_fab(lab.root, "lab.up", "--login-user", NAME, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lab01-become ping" in proc.stdout, proc.stdout
    hosts = lab.root / "hosts" / HOSTS
    assert f"user: {NAME}" in hosts.read_text() and "become: sudo" in hosts.read_text()
    assert (
        f"{NAME} ALL=(root) NOPASSWD: {lab.node('lab01').python}" in sudoers_file(NAME).read_text()
    )
    proc = run_fab(lab.root, "-H", "lab01-become", "facts", "--json", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)["results"][0]
    assert result["status"] == "ok" and result["data"]["facts"]["driver"], result
    state = Path(result["data"]["facts"]["python_path"])
    assert state.exists()
    rootstate = lab.node("lab01").dir / "rootstate"
    # the agent ran as root
    assert rootstate.stat().st_uid == 0 and rootstate.stat().st_mode & 0o777 == 0o700
    proc = run_fab(lab.root, "lab.down", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not sudoers_file(NAME).exists() and not hosts.exists()


def test_a_login_user_that_is_not_a_login_name_is_refused(lab_with_login):
    proc = run_fab(lab_with_login.root, "lab.up", "--login-user", "Bad Name", timeout=600)
    assert proc.returncode != 0 and "--login-user 'Bad Name'" in proc.stderr, (
        proc.stdout + proc.stderr
    )
    assert "Traceback" not in proc.stderr
