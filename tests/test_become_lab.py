"""The login-user model against a real lab node: a non-root login user (made here, with sshd letting
it in and a sudoers entry made here, all removed afterwards) and a root-owned venv it may read but
not write.

Without become its `patch --check` says it cannot write (not "would apply"), and `facts` fails
loudly when it cannot read a package; with `become: sudo` the agent runs as root through `sudo -n`
(the zip reaches root's state dir on stdin, checked by sha256) and patches and rolls back the venv;
with --ask-become-pass the password goes only to sudo's prompt. An sftp-server that does not start
is named as such."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import becomekit
import pytest
from conftest import GENERATOR, REPO, disconnect_all, fab_json_output, on_openssh

from fleetops.lab import site_packages
from fleetops.plans.tables import FACT_COLUMNS

pytestmark = pytest.mark.lab

USER = "fleetops-become"
PASSWORD = "become-Pa55-word-for-the-test"
SUDOERS = Path("/etc/sudoers.d/fleetops-become-test")
BOOK = "playbooks/become-test.yaml"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def world(lab_factory, root_user):
    becomekit.require_tools("sudo")
    with lab_factory.own("become", 1, reachable=True) as lab:
        node = lab.node("lab01")
        top = becomekit.world_dir("fleetops-become-")
        home = top / "home"
        try:
            becomekit.remove_users([USER])  # left by a run that was killed
            becomekit.add_login_user(USER, home, PASSWORD)
            # The node's venv: root's, readable by all, writable by root only.
            venv = becomekit.speculators_venv(top / "venv", site_packages(node.venv))
            python = venv / "bin" / "python"
            hostile = _hostile_python(top)
            becomekit.install_sudoers(
                SUDOERS,
                f"{USER} ALL=(root) NOPASSWD: {python}, {hostile}\n"
                f"{USER} ALL=(root) PASSWD: /usr/bin/python3\n",
            )
            lab.configure_sshd(node, users=(USER,))
            hosts = {
                "asuser": [f"    python: {python}", f"    state_dir: {home}/.fleetops"],
                "asroot": [
                    f"    python: {python}",
                    "    become: sudo",
                    f"    state_dir: {top}/rootstate",
                ],
                "nopass": [
                    "    python: /usr/bin/python3",
                    "    become: sudo",
                    f"    state_dir: {top}/rootstate",
                ],
                "hostile": [
                    f"    python: {hostile}",
                    "    become: sudo",
                    f"    state_dir: {top}/rootstate",
                ],
            }
            becomekit.write_login_hosts(lab, node, USER, "become.yaml", hosts)
            becomekit.write_generator_playbook(lab, BOOK, "become-test")
            target = site_packages(venv).joinpath(*GENERATOR.split(".")).with_suffix(".py")
            yield lab, node, top, target
        finally:
            SUDOERS.unlink(missing_ok=True)
            lab.configure_sshd(node)
            becomekit.remove_users([USER])
            shutil.rmtree(top, ignore_errors=True)


def _hostile_python(top: Path) -> Path:
    """A node's python (root's file, sudo NOPASSWD for it) that asks for sudo's password itself: it
    prints every prompt it can know of (fleetops' old fixed one, and any SUDO_PROMPT of the
    processes above it, which it may read as root), waits 3 s for a line on stdin and keeps whatever
    came in `got`."""
    bindir = top / "hostile" / "bin"
    bindir.mkdir(parents=True)
    (top / "hostile").chmod(0o755)
    bindir.chmod(0o755)
    wrapper = bindir / "python"
    wrapper.write_text(f"""#!/bin/sh
printf '[fleetops-become-password]' >&2
pid=$PPID
while [ "$pid" -gt 1 ]; do
    tr '\\000' '\\n' < /proc/$pid/environ | sed -n 's/^SUDO_PROMPT=//p' | tr -d '\\n' >&2
    pid=$(ps -o ppid= -p "$pid" | tr -d ' ')
done
got=$(timeout 3 head -n 1)
printf 'got: %s\\n' "$got" >> {top}/hostile/got
exec /usr/bin/python3 "$@"
""")
    wrapper.chmod(0o755)
    return wrapper


def fab(lab, *args: str, stdin: str | None = None) -> tuple[int, dict, str]:
    return fab_json_output(lab.root, *args, timeout=300, input=stdin)


def run_json(lab, program: str, *args: str, stdin: str | None = None) -> tuple[int, dict, str]:
    """`fab` (python -m fabric) or the installed `fleet`, with --json; no traceback in the
    output."""
    if program == "fab":
        return fab(lab, *args, stdin=stdin)
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "fleet"), *args, "--json"],
        cwd=lab.root,
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both, both
    try:
        return proc.returncode, json.loads(proc.stdout), both
    except ValueError:
        raise AssertionError(f"no JSON from fleet {args}: rc={proc.returncode}\n{both}") from None


def test_check_as_a_user_who_cannot_write_says_so_instead_of_would_apply(world):
    lab, _, _, target = world
    before = _sha(target)
    rc, doc, both = fab(lab, "-H", "asuser", "patch", "--check", "--playbook", BOOK)
    result = doc["results"][0]
    assert rc != 0 and result["status"] == "failed", both
    msg = json.dumps(result)
    assert "would apply" not in msg, msg
    assert f"as {USER}" in msg and "cannot write" in msg and "become: sudo" in msg, msg
    assert str(target.parent) in msg or str(target.parents[2]) in msg, msg
    assert _sha(target) == before


def test_become_sudo_patches_and_rolls_back_a_root_owned_venv(world):
    lab, _, top, target = world
    pristine = _sha(target)
    rc, doc, both = fab(lab, "-H", "asroot", "patch", "--playbook", BOOK)
    assert rc == 0 and doc["results"][0]["status"] == "changed", both
    assert _sha(target) != pristine
    assert os.stat(target).st_uid == 0  # written by root, not by the login user
    agent = next((top / "rootstate" / "bin").glob("fleetops-agent-*.pyz"))
    st = os.stat(agent)
    # root's copy, checked by sha256 when installed
    assert st.st_uid == 0 and not st.st_mode & 0o022
    assert os.stat(top / "rootstate").st_uid == 0
    evidence = json.dumps(doc)
    assert "sudo -n --" in evidence or rc == 0
    rc, doc, both = fab(lab, "-H", "asroot", "rollback", "--playbook", BOOK)
    assert rc == 0 and doc["results"][0]["status"] == "changed", both
    assert _sha(target) == pristine


def test_a_login_user_the_agent_file_of_is_never_run_by_root(world):
    """The zip in root's state dir came on stdin; a copy the login user writes in its own state dir
    is not what root runs (root's state dir is walked and the zip's sha256 checked at every
    start)."""
    lab, _, top, _ = world
    rc, doc, both = fab(lab, "-H", "asroot", "ping")
    assert rc == 0, both
    for pyz in (top / "rootstate" / "bin").glob("fleetops-agent-*.pyz"):
        pyz.write_bytes(b"not the agent")
    try:
        rc, doc, both = fab(lab, "-H", "asroot", "ping")
    finally:
        shutil.rmtree(top / "rootstate" / "bin")
    assert rc != 0 and "is not the agent fleetops sent" in both, both
    rc, doc, both = fab(lab, "-H", "asroot", "ping")  # a fresh copy, on stdin again
    assert rc == 0, both


def test_facts_fail_loudly_when_the_login_user_cannot_read_a_package(world):
    lab, _, _, target = world
    dist = next(target.parents[2].glob("speculators-*.dist-info"))
    dist.chmod(0o700)
    try:
        rc, doc, both = fab(lab, "-H", "asuser", "facts")
    finally:
        dist.chmod(0o755)
    result = doc["results"][0]
    assert rc != 0 and result["status"] == "failed", both
    assert f"cannot read {dist} as {USER}" in result["msg"], result["msg"]
    row = dict(zip(FACT_COLUMNS, result["data"]["fact_row"]))
    assert row["speculators"] == f"ERROR: cannot read {dist} as {USER}", row
    # the readers that could read
    assert row["os"] not in ("None", "-") and row["python"].startswith("3."), row
    # The lab's simulated nvidia-smi lives in the lab user's own files: this login user may not run
    # it either, and that too is an error in its cell, not a GPU count of None.
    assert row["gpus"].startswith("ERROR: cannot run") and f"as {USER}" in row["gpus"], row


def test_sudo_that_wants_a_password_is_named_with_the_next_step(world):
    lab, _, _, _ = world
    rc, doc, both = fab(lab, "-H", "nopass", "facts")
    msg = doc["results"][0]["msg"]
    assert (
        rc != 0 and "sudo would not run the agent as root" in msg and "--ask-become-pass" in msg
    ), msg


def test_ask_become_pass_sends_the_password_only_to_sudo(world):
    lab, _, _, _ = world
    rc, doc, both = fab(lab, "-H", "nopass", "facts", "--ask-become-pass", stdin=PASSWORD + "\n")
    assert rc == 0 and doc["results"][0]["status"] == "ok", both
    assert doc["results"][0]["data"]["facts"]["python_path"].startswith("/usr/bin/python3")
    rc, doc, both = fab(lab, "-H", "nopass", "facts", "--ask-become-pass", stdin="wrong-password\n")
    assert rc != 0 and "did not accept the become password" in doc["results"][0]["msg"], both
    assert PASSWORD not in both
    for path in lab.root.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert PASSWORD.encode() not in path.read_bytes(), path


def test_ask_become_pass_asks_nothing_when_no_host_of_the_run_becomes(world):
    lab, _, _, _ = world
    # stdin holds no password line: asking would read an empty line and refuse (exit 2)
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", "-H", "asuser", "ping", "--ask-become-pass"],
        cwd=lab.root,
        input="",
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    both = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "asuser | ping | ok" in proc.stdout, both
    assert "no host of this run has `become: sudo`; no password asked" in both, both


def test_an_sftp_server_that_does_not_start_is_named(world):
    lab, node, top, _ = world
    # no agent yet: it must be uploaded
    shutil.rmtree(top / "home" / ".fleetops", ignore_errors=True)
    lab.configure_sshd(node, users=(USER,), sftp="/nonexistent/sftp-server")
    if on_openssh():
        disconnect_all()  # a master's connection keeps the sshd config it was made under
    try:
        rc, doc, both = fab(lab, "-H", "asuser", "ping")
    finally:
        lab.configure_sshd(node, users=(USER,))
        if on_openssh():
            disconnect_all()
    msg = doc["results"][0]["msg"]
    assert rc != 0 and "the node's sftp-server did not start" in msg and "Subsystem sftp" in msg, (
        msg
    )
    rc, doc, both = fab(lab, "-H", "asuser", "ping")
    assert rc == 0, both


@pytest.mark.parametrize("program", ["fab", "fleet"])
def test_a_python_that_prints_a_password_prompt_itself_never_gets_the_password(world, program):
    """A NOPASSWD host whose python asks for the password on stderr, as sudo would: the password
    goes only to `sudo -v`'s own random prompt, before the command starts; the python reads nothing,
    and the run goes on."""
    lab, _, top, _ = world
    got = top / "hostile" / "got"
    got.unlink(missing_ok=True)
    args = (
        ["--ask-become-pass", "-H", "hostile", "ping"]
        if program == "fleet"
        else ["-H", "hostile", "ping", "--ask-become-pass"]
    )
    rc, doc, both = run_json(lab, program, *args, stdin=PASSWORD + "\n")
    assert got.read_text() == "got: \n", got.read_text()  # the wrapper ran as root and read no line
    assert rc == 0 and doc["results"][0]["status"] == "ok", both
    assert PASSWORD not in both


def test_nvidia_smi_is_found_under_sudo_on_the_login_users_path_and_said_where(world):
    """sudo's secure_path hides the node's nvidia-smi (the lab's is on the login PATH sshd sets):
    the agent finds it on the login user's PATH (a root-owned file), says where, and facts reads the
    driver; a `facts` that found none under sudo fails instead of saying ok with driver=None."""
    lab, _, _, _ = world
    rc, doc, both = fab(lab, "-H", "asroot", "facts")
    facts = doc["results"][0]["data"]["facts"]
    assert rc == 0 and doc["results"][0]["status"] == "ok", both
    assert facts["driver"] not in (None, "None") and facts["gpu_count"], facts
    assert facts["nvidia_smi"].endswith("(on the login user's PATH)"), facts
    rc, doc, both = fab(lab, "-H", "asroot", "gpu")
    assert rc == 0 and doc["results"][0]["status"] == "ok", both


def test_fetch_under_become_says_plainly_it_cannot_read_a_file_of_roots_and_offers_no_resume(world):
    lab, _, top, _ = world
    rc, doc, both = fab(lab, "-H", "asroot", "ping")  # the agent is in root's state dir (0700)
    assert rc == 0, both
    pyz = next((top / "rootstate" / "bin").glob("fleetops-agent-*.pyz"))
    rc, doc, both = fab(lab, "-H", "asroot", "fetch", "--path", str(pyz), "--any-path")
    msg = doc["results"][0]["msg"]
    assert (
        rc != 0
        and f"cannot read {pyz}" in msg
        and "become: sudo" in msg
        and f"readable by {USER}" in msg
    ), msg
    assert "resume" not in both, both
