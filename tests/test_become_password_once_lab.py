"""--ask-become-pass on the lab's real `become: sudo` login (`fab lab.up --login-user`), with a
sudoers entry that asks for the password: the node receives it once per host per run, also on the
first visit of an agent version (when the agent is installed into root's state dir and then
started). What the node got is counted by sudo's own PAM stack: a PAM service of the test's (sudoers
`pam_service`) whose first module hands every password it gets to a counter installed as root in a
root-only directory."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import fab_json_output, run_fab

from fleetops.lab.login import sudoers_file

pytestmark = pytest.mark.lab

NAME = "fleetops-pwonce"
PASSWORD = "once-Only-pa55word"
PAM_SERVICE = "fleetops-pwonce-test"
PAM_FILE = Path("/etc/pam.d") / PAM_SERVICE


@pytest.fixture(scope="module")
def world(lab_factory, root_user):
    with lab_factory.own("pwonce", 1, reachable=True) as lab:
        counter = Path(tempfile.mkdtemp(prefix="fleetops-pwcount-", dir="/root"))
        try:
            proc = run_fab(lab.root, "lab.up", "--login-user", NAME, timeout=600)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            subprocess.run(["chpasswd"], input=f"{NAME}:{PASSWORD}\n", text=True, check=True)
            counter.chmod(0o700)
            script = counter / "count"
            # pam_exec hands the password on stdin; one line per password received, never the
            # password itself
            script.write_text(
                '#!/bin/sh\npw=$(cat)\n[ -n "$pw" ] && echo '
                '"$PAM_SERVICE" >> "$(dirname "$0")/got"\n'
                "exit 0\n"
            )
            script.chmod(0o700)
            PAM_FILE.write_text(
                f"auth optional pam_exec.so expose_authtok seteuid quiet {script}\n"
                "auth required pam_unix.so try_first_pass\n"
                "account required pam_unix.so\n"
                "session required pam_permit.so\n"
            )
            node = lab.node("lab01")
            entry = sudoers_file(NAME)
            entry.write_text(
                f"Defaults:{NAME} pam_service={PAM_SERVICE}\n"
                f"{NAME} ALL=(root) PASSWD: {node.python}\n"
            )
            entry.chmod(0o440)
            subprocess.run(["visudo", "-c", "-f", str(entry)], check=True, capture_output=True)
            yield lab, node, counter / "got"
        finally:
            run_fab(lab.root, "lab.down", timeout=300)
            sudoers_file(NAME).unlink(missing_ok=True)
            PAM_FILE.unlink(missing_ok=True)
            shutil.rmtree(counter, ignore_errors=True)
            for node in lab.nodes():
                lab.configure_sshd(node)
            subprocess.run(["userdel", "-r", NAME], capture_output=True)


def _received(got: Path) -> int:
    return len(got.read_text().splitlines()) if got.exists() else 0


def test_the_password_reaches_a_host_once_even_when_the_agent_is_installed_first(world):
    lab, node, got = world
    # a new agent version: installed, then started
    shutil.rmtree(node.dir / "rootstate", ignore_errors=True)
    got.unlink(missing_ok=True)
    rc, doc, both = fab_json_output(
        lab.root,
        "-H",
        "lab01-become",
        "facts",
        "--ask-become-pass",
        input=PASSWORD + "\n",
        timeout=300,
    )
    assert rc == 0 and doc["results"][0]["status"] == "ok", both
    assert (node.dir / "rootstate").stat().st_uid == 0  # installed by root, in root's state dir
    assert _received(got) == 1, f"the node received the password {_received(got)} times in one run"
    got.unlink()
    rc, doc, both = fab_json_output(
        lab.root,
        "-H",
        "lab01-become",
        "verify",
        "--ask-become-pass",
        input=PASSWORD + "\n",
        timeout=300,
    )
    # the agent ran as root, whatever it found
    assert doc["results"][0]["status"] in ("ok", "failed"), both
    assert _received(got) == 1, f"the node received the password {_received(got)} times in one run"
    assert PASSWORD not in both
