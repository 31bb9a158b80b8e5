"""The OpenSSH transport (wire/openssh.py) against real lab sshd: the agent through the system `ssh`
and a persistent master per host, files over sftp on it, errors read from ssh's own words, the
control directory, a run on openssh hosts that never loads paramiko, and (both transports) an
agent command that carries no request data."""

from __future__ import annotations

import base64
import binascii
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from clientprobe import fleet_imports, ssh_code
from conftest import REPO, cmdlines, fab_json_output, ssh_masters, ssh_processes
from faultkit import agents_of, arm, disarm, hit_file, sshd_log, sshd_log_size, wait_for
from prockit import control_dir

from fleetops.plans.inventory import load_inventory
from fleetops.wire import controldir, masters
from fleetops.wire.connector import COUNTERS, TransportError
from fleetops.wire.openssh import OpenSSHConnection
from fleetops.wire.ssh import NodeConnection

pytestmark = pytest.mark.lab

OPENSSH = {"FLEETOPS_TRANSPORT": "openssh"}


@pytest.fixture
def cm(monkeypatch) -> Iterator[str]:
    yield from control_dir(monkeypatch, "fo-t-")


def _env(folder: str, **more: str) -> dict[str, str]:
    return {**OPENSSH, "FLEETOPS_CONTROL_DIR": folder, **more}


def _accepted(text: str) -> int:
    return len(re.findall(r"^Accepted publickey", text, re.M))


def test_ping_through_openssh(lab, cm):
    rc, doc, both = fab_json_output(lab.root, "-H", "lab01,lab02", "ping", env=_env(cm))
    assert rc == 0, both
    assert {r["status"] for r in doc["results"]} == {"ok"}, doc


def test_two_runs_in_the_persist_window_share_one_connection_per_host(lab, cm):
    node = lab.node("lab01")
    since = sshd_log_size(node)
    for _ in range(2):
        rc, doc, both = fab_json_output(lab.root, "-H", "lab01", "ping", env=_env(cm))
        assert rc == 0, both
    log = sshd_log(node, since)
    assert _accepted(log) == 1, log  # one login, one TCP connection, for both invocations
    records = {r.host: r for r in controldir.records(cm)}
    assert records["lab01"].port == node.port and records["lab01"].used >= records["lab01"].opened
    # closed (as `fleet disconnect` does): the next run logs in again
    masters.close_all(cm, masters.masters(cm))
    rc, doc, both = fab_json_output(lab.root, "-H", "lab01", "ping", env=_env(cm))
    assert rc == 0, both
    assert _accepted(sshd_log(node, since)) == 2


def test_persist_zero_leaves_no_master_after_the_run(lab, cm):
    extra = lab.root / "hosts" / "nopersist.yaml"
    n1 = lab.node("lab01")
    extra.write_text(
        f"hosts:\n  once:\n    address: 127.0.0.1\n    port: {n1.port}\n    user: {lab.user}\n"
        f"    identity_file: {lab.client_key}\n    known_hosts: {lab.known_hosts}\n"
        f"    python: {n1.python}\n    state_dir: {n1.state_dir}\n    persist: 0\n"
    )
    try:
        rc, doc, both = fab_json_output(lab.root, "-H", "once", "ping", env=_env(cm))
    finally:
        extra.unlink()
    assert rc == 0, both
    assert not ssh_masters(cm) and not controldir.records(cm)


def test_an_unsafe_control_directory_is_refused_naming_why(lab, tmp_path):
    open_dir = Path(tempfile.mkdtemp(prefix="fo-u-", dir="/tmp"))
    try:
        open_dir.chmod(0o777)
        rc, doc, both = fab_json_output(lab.root, "-H", "lab01", "ping", env=_env(str(open_dir)))
        assert rc != 0
        msg = doc["results"][0]["msg"]
        assert "mode 0777" in msg and "chmod 700" in msg and str(open_dir) in msg, msg
        assert not list(open_dir.iterdir())  # nothing was connected through it
    finally:
        shutil.rmtree(open_dir, ignore_errors=True)


def _connector(lab, name: str = "lab01") -> OpenSSHConnection:
    inventory = load_inventory(lab.root / "hosts")
    return OpenSSHConnection(inventory.resolve(name), inventory)


def test_the_connectors_calls_exec_upload_and_resumable_download(lab, cm, tmp_path):
    node = _connector(lab)
    try:
        answer, evidence = node.call("ping", {})
        assert answer.get("ok", True) and evidence.exit_code == 0, answer
        # pipelined: two read-only requests sent ahead behind one call, answered in order
        before = COUNTERS.ahead.get("lab01", 0)
        first = node.submit("ping", {})
        second = node.submit("ping", {})
        node.call("ping", {})
        assert first.result()[0] and second.result()[0]
        assert COUNTERS.ahead.get("lab01", 0) > before
        # exec: argv quoted word by word (no value becomes shell syntax), stdin, exit status
        result = node.exec(
            ["sh", "-c", 'read x; printf "%s|%s" "$x" "$0"; exit 3', "a b;$(id)"], stdin=b"in\n"
        )
        assert result.exit_code == 3 and result.stdout == b"in|a b;$(id)", result
        # upload: atomic, folders made; download whole and by range, resumed from a partial copy
        data = os.urandom(300_000)
        remote = f"{lab.node('lab01').state_dir}/t-openssh/blob.bin"
        node.upload(remote, data)
        assert node.download(remote) == data
        local = tmp_path / "part.bin"
        local.write_bytes(data[:100_000] + b"garbage")
        seen: list[int] = []
        got = node.download_to(remote, str(local), 100_000, len(data), seen.append)
        assert got == len(data) - 100_000 and local.read_bytes() == data and seen[-1] == got
        with pytest.raises(TransportError, match="cannot read|No such file"):
            node.download_to(f"{remote}.missing", str(tmp_path / "x"), 0, 10)
    finally:
        node.close()


def test_a_run_on_openssh_hosts_never_imports_paramiko_cryptography_or_fabric(lab, cm):
    code = (
        "import sys\nfrom fleetops.api import run\n"
        f"results = run({str(lab.root)!r}, 'lab01,lab02', [('ping', {{}})])\n"
        "assert {r.status.value for r in results} == {'ok'}, results\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] "
        "in ('paramiko', 'cryptography', 'fabric', "
        "'invoke', 'nacl', 'bcrypt')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=lab.root,
        env={**os.environ, "PYTHONPATH": str(REPO), **_env(cm)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_a_warm_fleet_ping_imports_no_paramiko_cryptography_or_fabric(lab, cm):
    """`fleet -H lab01 ping` with its master up (the run before started it): the program, its
    ssh_config reading, the agent over the master and the report, without the paramiko transport's
    code; the same run on paramiko loads it (what the harness would see)."""
    rc, _, both = fab_json_output(lab.root, "-H", "lab01", "ping", env=_env(cm))
    assert rc == 0, both
    proc, names = fleet_imports(["fleet", "-H", "lab01", "ping"], lab.root, _env(cm))
    assert proc.returncode == 0 and "lab01 | ping | ok" in proc.stdout, proc.stdout + proc.stderr
    assert masters.masters(cm), "no master: the run was not a warm one"
    assert ssh_code(names) == [], ssh_code(names)
    proc, names = fleet_imports(
        ["fleet", "-H", "lab01", "ping"], lab.root, _env(cm, FLEETOPS_TRANSPORT="paramiko")
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "paramiko" in ssh_code(names)


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_the_agents_command_carries_no_request_data(lab, cm, transport):
    """A request goes on the agent's stdin, never in its command: every process's argv (the
    client's ssh, the node's shell and agent) is in the process list of the machine it runs on,
    for its other users to read. Looked for while the session is up: the first request's path, as
    text, base64, or zlib inside base64 (the forms a packed argv word takes)."""
    inventory = load_inventory(lab.root / "hosts")
    host = inventory.resolve("lab01")
    kind = OpenSSHConnection if transport == "openssh" else NodeConnection
    node = kind(host, inventory)
    try:  # the agent uploaded first: the session below starts with the request in hand
        node.call("ping", {})
    finally:
        node.close()
    node = kind(host, inventory)
    uploads = COUNTERS.per_host["lab01"].get("uploads", 0)
    token = f"/tmp/fo-not-in-argv-{os.getpid()}-{transport}/secret.log"
    try:
        answer, _ = node.call("fetch_plan", {"paths": [token]})
        assert answer, answer
        assert node.requests == 1 and COUNTERS.per_host["lab01"].get("uploads", 0) == uploads
        assert node.session is not None and node.session.alive()
        pids = agents_of(lab.node("lab01"))
        assert pids, "no agent running: nothing to look at"
        seen = _argv_forms_holding(token.encode())
    finally:
        node.close()
    assert seen == [], seen


def _argv_forms_holding(token: bytes) -> list[str]:
    """Which processes' argv words hold `token`, plainly or packed."""
    packed = base64.b64encode(token)
    found = set()
    for pid, argv in cmdlines():
        words = list(argv)
        for arg in argv:  # a remote command: one shell string of words
            try:
                words += [w.encode() for w in shlex.split(arg.decode(errors="replace"))]
            except ValueError:
                pass
        for word in words:
            forms = [word]
            try:
                forms.append(base64.b64decode(word, validate=True))
                forms.append(zlib.decompress(forms[-1]))
            except (binascii.Error, zlib.error, ValueError):
                pass
            if any(token in form or packed in form for form in forms):
                found.add(f"pid {pid}: {word[:80]!r}")
    return sorted(found)


def _fresh_host(lab, name: str, **keys: str) -> Path:
    n1 = lab.node("lab01")
    values = {
        "address": "127.0.0.1",
        "port": str(n1.port),
        "user": lab.user,
        "identity_file": str(lab.client_key),
        "known_hosts": str(lab.known_hosts),
        "python": n1.python,
        "state_dir": n1.state_dir,
        **keys,
    }
    extra = lab.root / "hosts" / f"{name}.yaml"
    extra.write_text(f"hosts:\n  {name}:\n" + "".join(f"    {k}: {v}\n" for k, v in values.items()))
    return extra


def _unreachable(lab, cm, name: str, **keys: str) -> str:
    extra = _fresh_host(lab, name, **keys)
    try:
        rc, doc, both = fab_json_output(lab.root, "-H", name, "ping", env=_env(cm))
    finally:
        extra.unlink()
    assert rc == 4 and doc["results"][0]["status"] == "unreachable", both
    return doc["results"][0]["msg"]


def test_connection_refused_is_named(lab, cm):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    msg = _unreachable(lab, cm, "closedport", port=str(port))
    assert f"connection refused by 127.0.0.1:{port}" in msg and "check that sshd runs" in msg, msg


def test_auth_refused_names_user_key_and_next_step(lab, cm, tmp_path):
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    msg = _unreachable(lab, cm, "stranger", identity_file=str(key))
    assert (
        f"authentication failed for user '{lab.user}'" in msg
        and str(key) in msg
        and "authorized_keys" in msg
    )


def test_unknown_host_key_names_its_fingerprint_and_trust(lab, cm, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    msg = _unreachable(lab, cm, "fresh", known_hosts=str(empty))
    assert (
        "unknown host key SHA256:" in msg and "fab -H fresh trust --fingerprint SHA256:" in msg
    ), msg
    assert str(empty) in msg


def test_changed_host_key_names_both_fingerprints_and_trust_replace(lab, cm, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    port = lab.node("lab01").port
    known = tmp_path / "known_hosts"
    known.write_text(
        f"[127.0.0.1]:{port} {(tmp_path / 'other.pub').read_text().split(' ', 2)[0]} "
        f"{(tmp_path / 'other.pub').read_text().split()[1]}\n"
    )
    wrong = subprocess.run(
        ["ssh-keygen", "-lf", str(tmp_path / "other.pub")], capture_output=True, text=True
    ).stdout.split()[1]
    msg = _unreachable(lab, cm, "changed", known_hosts=str(known))
    assert f"expected {wrong}" in msg and ", got SHA256:" in msg, msg
    assert "fab -H changed trust --replace --fingerprint" in msg, msg


def test_a_port_that_never_speaks_ssh_times_out_naming_the_banner(lab, cm):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        msg = _unreachable(lab, cm, "silent", port=str(port), connect_timeout="2")
    assert "timed out" in msg, msg


def test_jump_host_through_openssh(lab, cm):
    n1 = lab.node("lab01")
    jump = lab.node("lab02")
    extra = _fresh_host(lab, "behind", jump="lab02")
    since = sshd_log_size(jump)
    try:
        rc, doc, both = fab_json_output(lab.root, "-H", "behind", "ping", env=_env(cm))
        assert rc == 0 and doc["results"][0]["status"] == "ok", both
        assert "Accepted publickey" in sshd_log(jump, since)  # the hop really was used
        assert "Accepted publickey" in sshd_log(n1, 0)
        extra.write_text(extra.read_text().replace("jump: lab02", "jump: 127.0.0.1:1"))
        masters.close_all(cm, masters.masters(cm))
        rc, doc, both = fab_json_output(lab.root, "-H", "behind", "ping", env=_env(cm))
        assert rc == 4 and doc["results"][0]["status"] == "unreachable", both
    finally:
        extra.unlink()


def test_close_from_another_thread_stops_a_login_in_progress(lab, cm):
    """Ctrl-C: the run closes its connectors from the main thread while a host is still logging
    in."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        extra = _fresh_host(lab, "stuck", port=str(port), connect_timeout="30")
        try:
            node = _connector(lab, "stuck")
            errors: list[BaseException] = []
            worker = threading.Thread(target=lambda: _catch(node.open, errors))
            started = time.monotonic()
            worker.start()
            time.sleep(0.5)
            node.close()
            worker.join(10)
        finally:
            extra.unlink()
    assert not worker.is_alive() and time.monotonic() - started < 10
    assert errors and isinstance(errors[0], TransportError) and errors[0].kind == "interrupted", (
        errors
    )
    assert not ssh_processes(cm)  # the login in progress too, which no master socket shows yet


def _catch(fn, errors: list[BaseException]) -> None:
    try:
        fn()
    except BaseException as exc:  # handed to the test
        errors.append(exc)


def test_at_the_cap_the_least_recently_used_master_is_closed_first(lab, cm):
    env = _env(cm, FLEETOPS_MAX_MASTERS="1")
    for name in ("lab01", "lab02"):
        rc, doc, both = fab_json_output(lab.root, "-H", name, "ping", env=env)
        assert rc == 0, both
    assert [r.host for r in controldir.records(cm)] == ["lab02"]
    assert len(ssh_masters(cm)) == 1


def test_at_the_cap_a_killed_masters_socket_is_removed_and_a_live_one_has_exited_when_the_run_ends(
    lab, cm
):
    env = _env(cm, FLEETOPS_MAX_MASTERS="1")
    rc, doc, both = fab_json_output(lab.root, "-H", "lab01", "ping", env=env)
    assert rc == 0, both
    ((pid, first),) = ssh_masters(cm).items()
    os.kill(pid, signal.SIGKILL)  # its socket stays behind, stale
    deadline = time.monotonic() + 5
    while ssh_masters(cm) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(os.path.join(cm, first))
    rc, doc, both = fab_json_output(lab.root, "-H", "lab02", "ping", env=env)
    assert rc == 0, both
    assert not os.path.exists(os.path.join(cm, first)), os.listdir(cm)
    assert [r.host for r in controldir.records(cm)] == ["lab02"]
    # a live master closed for the cap has exited by the time the run that closed it ends: no
    # waiting here
    rc, doc, both = fab_json_output(lab.root, "-H", "lab01", "ping", env=env)
    assert rc == 0, both
    assert len(ssh_masters(cm)) == 1 and [r.host for r in controldir.records(cm)] == ["lab01"]


def test_a_live_master_is_never_used_by_another_key_or_known_hosts(lab, cm, tmp_path):
    """%C keys a master on host, port, user and jump only: the same address logged into with another
    key, or checked against another known_hosts, must make its own login (and be refused), not ride
    the live master."""
    rc, doc, both = fab_json_output(lab.root, "-H", "lab01", "ping", env=_env(cm))
    assert rc == 0, both
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    msg = _unreachable(lab, cm, "stranger", identity_file=str(key))
    assert "authentication failed" in msg, msg
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    msg = _unreachable(lab, cm, "fresh", known_hosts=str(empty))
    assert "unknown host key SHA256:" in msg, msg
    # the inventory's own host still rides its master
    node = lab.node("lab01")
    since = sshd_log_size(node)
    rc, doc, both = fab_json_output(lab.root, "-H", "lab01", "ping", env=_env(cm))
    assert rc == 0 and _accepted(sshd_log(node, since)) == 0, both


def test_a_jump_host_with_an_unknown_key_is_named_with_its_trust_step(lab, cm, tmp_path):
    empty = tmp_path / "known_jump"
    empty.write_text("")
    jump = lab.node("lab02")
    extra = _fresh_host(lab, "behindnew")
    extra.write_text(
        extra.read_text() + f"    jump:\n      address: 127.0.0.1\n      port: {jump.port}\n"
        f"      user: {lab.user}\n      identity_file: {lab.client_key}\n"
        f"      known_hosts: {empty}\n"
    )
    try:
        rc, doc, both = fab_json_output(lab.root, "-H", "behindnew", "ping", env=_env(cm))
    finally:
        extra.unlink()
    assert rc == 4 and doc["results"][0]["status"] == "unreachable", both
    msg = doc["results"][0]["msg"]
    assert (
        f"its jump host {lab.user}@127.0.0.1:{jump.port}" in msg
        and "unknown host key SHA256:" in msg
    ), msg
    assert "trust --fingerprint" in msg and str(empty) in msg, msg


def test_a_client_killed_outright_takes_its_sessions_with_it_while_the_master_lives_on(lab, cm):
    """SIGKILL: no close, no Ctrl-C handling. The master outlives the client, so the session's own
    ssh must go with the client, or the node's agent (which stops when its channel closes) waits for
    no one."""
    node = lab.node("lab01")
    # the master is up
    rc, doc, both = fab_json_output(lab.root, "-H", "lab01", "ping", env=_env(cm))
    assert rc == 0, both
    hit_file(node, "lock.acquired").unlink(missing_ok=True)
    arm(node, {"lock.acquired": {"action": "pause", "seconds": 120}})
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabric", "-H", "lab01", "patch"],
        cwd=lab.root,
        env={**os.environ, "PYTHONPATH": str(REPO), "FLEETOPS_NO_LIVE": "1", **_env(cm)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: hit_file(node, "lock.acquired").exists() or proc.poll() is not None,
            "the agent to pause in patch",
        )
        assert proc.poll() is None and agents_of(node), proc.communicate()
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        wait_for(
            lambda: not agents_of(node), "lab01's agent to exit after its client died", timeout=30
        )
    finally:
        disarm(node)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert len(ssh_processes(cm)) == 1  # the master itself lives on for the next run
    rc, doc, both = fab_json_output(lab.root, "-H", "lab01", "patch", env=_env(cm))
    assert rc == 0, both
