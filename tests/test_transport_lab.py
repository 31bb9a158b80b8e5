"""SSH-level behaviour against real lab sshd: ssh_config hosts, jump hosts, a link dropped mid-step,
and the lab run by an ordinary (non-root) user."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import GENERATOR, REPO, disconnect_all, fab_json, on_openssh, run_fab, sha256
from faultkit import hit_file, sshd_log, sshd_log_size
from pausekit import patch_holding_the_lock

from fleetops.lab import sshd

pytestmark = pytest.mark.lab


def test_plain_ssh_config_alias_works(lab, tmp_path):
    node = lab.node("lab01")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host labalias\n  HostName 127.0.0.1\n  Port {node.port}\n  User {lab.user}\n"
        f"  IdentityFile {lab.client_key}\n"
    )
    shutil.copy(lab.known_hosts, home / ".ssh" / "known_hosts")
    rc, doc = fab_json(lab.root, "-H", "labalias", "ping", env={"HOME": str(home)})
    assert rc == 0, doc
    assert doc["results"][0]["status"] == "ok"
    assert "python 3." in doc["results"][0]["msg"]


def test_jump_host(lab):
    n1 = lab.node("lab01")
    extra = lab.root / "hosts" / "jump.yaml"
    extra.write_text(
        f"hosts:\n  behind:\n    address: 127.0.0.1\n    port: {n1.port}\n    jump: lab02\n    "
        f"user: {lab.user}\n    identity_file: {lab.client_key}\n    known_hosts: "
        f"{lab.known_hosts}\n    python: {n1.python}\n    state_dir: {n1.state_dir}\n"
    )
    jump = lab.node("lab02")
    openssh = on_openssh()
    if openssh:
        disconnect_all()
    since = sshd_log_size(jump)
    try:
        for _ in range(2 if openssh else 1):
            rc, doc = fab_json(lab.root, "-H", "behind", "ping")
            assert rc == 0, doc
            assert doc["results"][0]["status"] == "ok"
        if openssh:
            # The master of the first run carried the second: one login through the jump host for
            # both, and the jump host only forwarded (no session of its own)
            hop = sshd_log(jump, since)
            assert len(re.findall(r"^Accepted publickey", hop, re.M)) == 1, hop
        else:
            # The jump host only forwarded: the session channel a node's connection opens ahead of
            # its login is not opened there. sshd logs each session it closes, once the connection
            # has ended.
            deadline = time.monotonic() + 10
            while (
                "Closing connection" not in (hop := sshd_log(jump, since))
                and time.monotonic() < deadline
            ):
                time.sleep(0.05)
            assert "Accepted publickey" in hop and "Closing connection" in hop, hop
        assert not re.search(r"^(Starting|Close) session", hop, re.M), hop
        # The same target behind a jump host that is down: unreachable, so the hop really is used.
        extra.write_text(extra.read_text().replace("jump: lab02", "jump: 127.0.0.1:1"))
        rc, doc = fab_json(lab.root, "-H", "behind", "ping")
        assert rc == 4 and doc["results"][0]["status"] == "unreachable", doc
    finally:
        extra.unlink()


def _session_sshd_pids(listener: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(listener)], capture_output=True, text=True
    ).stdout
    return [int(x) for x in out.split()]


def _wait_gone(pid: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, (
            f"the orphaned agent (pid {pid}) still runs after {timeout:.0f} s"
        )
        time.sleep(0.1)


def test_connection_dropped_mid_step_is_reported_and_file_is_whole(lab):
    node = lab.node("lab01")
    target = node.module_file(GENERATOR)
    pristine = sha256(target)
    # The agent parks inside the lock, with the file not yet written, until the test deletes the
    # failpoint's .hit file (which names the agent's pid); the test cuts the link while it is
    # parked: no timing guess.
    hit = hit_file(node, "lock.acquired")
    with patch_holding_the_lock(lab.root, node) as (proc, agent):
        sessions = _session_sshd_pids(node.pid())
        assert sessions, "no session sshd to cut"
        try:
            for pid in sessions:
                os.kill(pid, signal.SIGKILL)  # the link dies while the node is mid-patch
            assert Path(f"/proc/{agent}").exists(), (
                "the agent had finished before the cut: the fault injected nothing"
            )
            out, err = proc.communicate(timeout=120)
        finally:
            # let the orphaned agent go on (it finishes the patch or dies writing)
            hit.unlink(missing_ok=True)
    assert proc.returncode == 1, err
    result = json.loads(out)["results"][0]
    assert result["status"] == "failed"
    assert "lost during the step" in result["msg"]
    # the orphaned agent finishes or dies; only then is the file's outcome settled
    _wait_gone(agent)
    patched_or_pristine = sha256(target)
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0, doc
    assert (patched_or_pristine == pristine) == (doc["results"][0]["status"] == "changed")


@pytest.mark.root(
    "creating a second user needs root; as a non-root user the whole suite already runs the "
    "lab unprivileged"
)
def test_lab_runs_as_an_ordinary_user(lab):
    user = "fleetops-lab"
    if subprocess.run(["id", user], capture_output=True).returncode != 0:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", user], check=True
        )
    top = Path(tempfile.mkdtemp(prefix="fleetops-user-", dir="/tmp"))
    try:
        top.chmod(0o755)
        code = top / "code"
        for name in ("fleetops", "remote_scripts", "playbooks"):
            shutil.copytree(REPO / name, code / name, ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("fabfile.py", "fabric.yaml"):
            shutil.copy(REPO / name, code / name)
        # Client and node interpreters the user can run (this machine's default python lives under
        # /root).
        client = top / "client"
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(client)], check=True)
        subprocess.run(
            [
                str(client / "bin" / "pip"),
                "install",
                "-q",
                "--disable-pip-version-check",
                "fabric>=3.2,<4",
                "packaging>=23,<27",
                "paramiko",
                "pyyaml",
                "rich",
            ],
            check=True,
        )
        base = top / "base"
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(base)], check=True)
        from fleetops.lab import site_packages

        src = site_packages(lab.node("lab01").venv)
        for entry in [src / "speculators", *src.glob("speculators-*.dist-info")]:
            shutil.copytree(
                entry,
                site_packages(base) / entry.name,
                ignore=shutil.ignore_patterns("__pycache__"),
            )
        (base / ".fleetops-complete").write_text(
            "speculators only: enough for an unprivileged patch test\n"
        )
        book = code / "playbooks" / "user-test.yaml"
        book.write_text(
            "name: user-test\npatches:\n  - module: "
            + GENERATOR
            + "\n    diff: speculators-0.3.0-vllm-0.16/vllm_hidden_states_generator.diff\n"
        )
        home = top / "home"
        home.mkdir()
        subprocess.run(["chown", "-R", f"{user}:", str(code), str(home)], check=True)
        subprocess.run(["chmod", "-R", "a+rX", str(top)], check=True)

        def as_user(*args: str) -> subprocess.CompletedProcess:
            env = [
                "env",
                "-i",
                f"HOME={home}",
                "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
                f"FLEETOPS_LAB_BASE={base}",
                f"PYTHONPATH={code}",
                "COLUMNS=200",
            ]
            return subprocess.run(
                [
                    "runuser",
                    "-u",
                    user,
                    "--",
                    *env,
                    str(client / "bin" / "python"),
                    "-m",
                    "fabric",
                    *args,
                ],
                cwd=code,
                capture_output=True,
                text=True,
                timeout=300,
            )

        up = as_user("lab.up")
        assert up.returncode == 0, up.stdout + up.stderr
        try:
            lab_yaml = (code / "hosts" / "lab.yaml").read_text()
            assert f"user: {user}" in lab_yaml
            target = code / ".lab" / "nodes" / "lab01" / "venv"
            pkg_dir = next(target.glob("lib/python3*/site-packages/speculators/data_generation"))
            os.chown(pkg_dir, 0, 0)  # a package directory the user may not write: refused cleanly
            pkg_dir.chmod(0o555)
            denied = as_user(
                "-H", "lab01", "patch", "--playbook", "playbooks/user-test.yaml", "--json"
            )
            assert denied.returncode == 1, denied.stdout + denied.stderr
            msg = json.loads(denied.stdout)["results"][0]["items"][0]["msg"]
            # checked before any write
            assert "not writable by this user" in msg and "nothing written" in msg, msg
            subprocess.run(["chown", f"{user}:", str(pkg_dir)], check=True)
            pkg_dir.chmod(0o755)
            done = as_user(
                "-H", "lab01", "patch", "--playbook", "playbooks/user-test.yaml", "--json"
            )
            assert done.returncode == 0, done.stdout + done.stderr
            doc = json.loads(done.stdout)
            assert doc["results"][0]["status"] == "changed"
            patched = next(
                target.glob(
                    "lib/python3*/site-packages/speculators/data_generation/"
                    "vllm_hidden_states_generator.py"
                )
            )
            assert patched.stat().st_uid != 0
            assert "kv_cache_specs=kv_cache_spec" not in patched.read_text()
            status = as_user("lab.status")
            assert "sshd pid" in status.stdout
        finally:
            down = as_user("lab.down")
            assert "lab01" in down.stdout, down.stdout + down.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_lab_down_stops_only_its_own_sshd(lab):
    node = lab.node("lab02")
    own = int(node.pid_file.read_text())
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        # a pid file pointing at someone else's process
        node.pid_file.write_text(f"{stranger.pid}\n")
        # its own sshd, found by the config its command line names
        assert lab.stop_node(node) is True
        assert stranger.poll() is None, "the stranger named by the pid file was signalled"
        assert sshd.exited(own)
    finally:
        stranger.kill()
        stranger.wait()
    lab.start_node(node)
    assert node.running()
    real = node.pid_file.read_text()
    status = run_fab(lab.root, "lab.status")
    assert (
        status.returncode == 0
        and f"lab02: 127.0.0.1:{node.port} sshd pid {int(real)}" in status.stdout
    )
