"""Host syntax, ssh_config aliases and network faults against the lab's real sshd.

Every fault is made on loopback only: a local TCP server that resets, a port nobody listens on, sshd
itself refusing a user or a key. The DNS failure runs `fab` in a network namespace of its own
(`unshare -n`: only a loopback that is down), because a `.invalid` name is still sent to the
machine's resolver otherwise.

Each error must reach the operator as one result line (no traceback on stdout or stderr), name the
host, the cause and the next step, and end the run with exit status 4 (unreachable)."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import paramiko
import pytest
from conftest import REPO, fab_json_output, run_fab
from logintap import login_order
from sshhome import home_with

from fleetops.plans.inventory import load_inventory

pytestmark = pytest.mark.lab

EXIT_UNREACHABLE = 4


def fab_run(project: Path, *args: str, env: dict | None = None) -> tuple[int, dict, str]:
    """`fab ... --json`: (exit status, the JSON document, stdout+stderr) with no traceback
    anywhere."""
    return fab_json_output(project, *args, env=env, timeout=300)


def only_result(doc: dict) -> dict:
    assert len(doc["results"]) == 1, doc
    return doc["results"][0]


def assert_unreachable(rc: int, doc: dict, *parts: str) -> str:
    result = only_result(doc)
    msg = result["msg"]
    assert rc == EXIT_UNREACHABLE and result["status"] == "unreachable", (rc, doc)
    assert "\n" not in msg, msg
    for part in parts:
        assert part in msg, (part, msg)
    return msg


# ---------------------------------------------------------------- local fault servers (loopback
# only)
@contextmanager
def tcp_server(behaviour: str) -> Iterator[int]:
    """A listener on 127.0.0.1 that misbehaves: `reset` sends a TCP RST as soon as it accepts;
    `banner-reset` sends an SSH banner, reads the client's first packet, then resets
    (mid-handshake)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(30)
                try:
                    if behaviour == "banner-reset":
                        conn.sendall(b"SSH-2.0-OpenSSH_9.2p1 fault\r\n")
                        conn.recv(4096)
                except OSError:
                    pass
                # SO_LINGER 0: close() sends RST, not FIN, so the client sees "connection reset by
                # peer".
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=30)
        srv.close()


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- item 2: host syntax
def test_user_at_address_port_is_honoured_and_the_unknown_key_names_trust(lab, tmp_path):
    """`fab -H root@127.0.0.1:PORT ping` used to go to port 22. Now: the port is used (the lab's
    host key is offered, unknown to this HOME), the refusal shows it and names `trust
    --fingerprint`, trust adds it, ping works."""
    node = lab.node("lab01")
    home = home_with(
        tmp_path, lab, f"Host 127.0.0.1\n  IdentityFile {lab.client_key}\n", known_hosts=False
    )
    target = f"{lab.user}@127.0.0.1:{node.port}"
    env = {"HOME": str(home)}
    rc, doc, _ = fab_run(lab.root, "-H", target, "ping", env=env)
    msg = assert_unreachable(
        rc, doc, target, "unknown host key", f"fab -H {target} trust --fingerprint SHA256:"
    )
    fingerprint = msg.split("unknown host key ")[1].split()[0]
    expected = subprocess.run(
        ["ssh-keygen", "-lf", f"{node.host_key}.pub"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    assert fingerprint == expected  # the key of the sshd on PORT, i.e. the port was honoured

    rc, doc, _ = fab_run(lab.root, "-H", target, "trust", "--fingerprint", fingerprint, env=env)
    assert rc == 0 and only_result(doc)["status"] == "changed", doc
    assert f"[127.0.0.1]:{node.port} " in (home / ".ssh" / "known_hosts").read_text()
    rc, doc, _ = fab_run(lab.root, "-H", target, "ping", env=env)
    assert rc == 0 and only_result(doc)["status"] == "ok", doc


def test_user_and_port_override_inventory_names(lab):
    # An inventory name with another user: sshd refuses it (auth), so the user really travelled.
    rc, doc, _ = fab_run(lab.root, "-H", "nobody@lab01", "ping")
    assert_unreachable(
        rc, doc, "lab01", "authentication failed for user 'nobody'", "authorized_keys"
    )
    port = closed_port()
    rc, doc, _ = fab_run(lab.root, "-H", f"{lab.user}@lab01:{port}", "ping")
    assert_unreachable(
        rc, doc, "lab01", f"connection refused by 127.0.0.1:{port}", "check that sshd runs"
    )
    rc, doc, _ = fab_run(lab.root, "-H", f"{lab.user}@lab01", "ping")
    assert rc == 0 and only_result(doc)["status"] == "ok", doc


def test_glob_and_group_host_words(lab):
    # lab0[12]: the shared lab may also hold lab03/lab04 (other package versions, sshd not always
    # up).
    rc, doc, _ = fab_run(lab.root, "-H", "lab0[12]", "ping")
    assert rc == 0 and sorted(r["host"] for r in doc["results"]) == ["lab01", "lab02"], doc
    proc = run_fab(lab.root, "-H", "lab9*", "ping")
    assert proc.returncode == 2 and "no inventory host matches 'lab9*'" in proc.stderr, proc.stderr
    proc = run_fab(lab.root, "-H", "lab1", "ping")
    assert proc.returncode == 2 and "did you mean 'lab01'?" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


# ---------------------------------------------------------------- item 5: ssh_config aliases
def alias_block(lab, header: str) -> str:
    node = lab.node("lab01")
    return (
        f"{header}\n  HostName 127.0.0.1\n  Port {node.port}\n  User {lab.user}\n"
        f"  IdentityFile {lab.client_key}\n  UserKnownHostsFile {lab.known_hosts}\n"
    )


def test_aliases_from_included_files_in_ssh_config(lab, tmp_path):
    """~/.ssh/config that Includes conf.d/*.conf (relative: from ~/.ssh, as ssh does) defining the
    alias."""
    home = home_with(
        tmp_path,
        lab,
        "Host *\n  ServerAliveInterval 30\nInclude conf.d/*.conf\n",
        known_hosts=False,
    )
    (home / ".ssh" / "conf.d").mkdir()
    (home / ".ssh" / "conf.d" / "lab.conf").write_text(alias_block(lab, "Host labalias"))
    rc, doc, _ = fab_run(lab.root, "-H", "labalias", "ping", env={"HOME": str(home)})
    assert rc == 0 and only_result(doc)["status"] == "ok", doc


def test_aliases_from_a_named_ssh_config_with_include_and_match(lab, tmp_path):
    """A named ssh_config (FLEETOPS_SSH_CONFIG, the -S file) read alone, with an absolute Include
    whose file defines one alias by `Host` and one by `Match host`."""
    included = tmp_path / "ssh" / "inc"
    included.mkdir(parents=True)
    (included / "a.conf").write_text(
        alias_block(lab, "Host labalias") + alias_block(lab, "Match host labmatch")
    )
    main = tmp_path / "ssh" / "main.conf"
    main.write_text(f"Include {included}/*.conf\n")
    # an empty ~/.ssh/config: the aliases come from main
    home = home_with(tmp_path, lab, known_hosts=False)
    env = {"HOME": str(home), "FLEETOPS_SSH_CONFIG": str(main)}
    for alias in ("labalias", "labmatch"):
        rc, doc, _ = fab_run(lab.root, "-H", alias, "ping", env=env)
        assert rc == 0 and only_result(doc)["status"] == "ok", (alias, doc)
    # without the file: unknown
    proc = run_fab(lab.root, "-H", "labalias", "ping", env={"HOME": str(home)})
    assert proc.returncode == 2 and "unknown host 'labalias'" in proc.stderr, proc.stderr
    proc = run_fab(
        lab.root, "-H", "labalias", "ping", env={**env, "FLEETOPS_SSH_CONFIG": str(main) + ".nope"}
    )
    assert proc.returncode == 2 and "ssh_config file not found" in proc.stderr, proc.stderr


def test_fab_dash_s_file_makes_its_aliases_host_words(lab, tmp_path):
    """`fab -S FILE -H alias`: Fabric's own -S flag reaches the inventory (an alias defined by an
    Included file of FILE, which ~/.ssh/config does not know)."""
    included = tmp_path / "ssh" / "inc.conf"
    included.parent.mkdir(parents=True)
    included.write_text(alias_block(lab, "Host labviaS"))
    main = tmp_path / "ssh" / "main.conf"
    main.write_text(f"Include {included}\n")
    home = home_with(tmp_path, lab, known_hosts=False)
    rc, doc, _ = fab_run(
        lab.root, "-S", str(main), "-H", "labviaS", "ping", env={"HOME": str(home)}
    )
    assert rc == 0 and only_result(doc)["status"] == "ok", doc
    # without -S: unknown
    proc = run_fab(lab.root, "-H", "labviaS", "ping", env={"HOME": str(home)})
    assert proc.returncode == 2 and "unknown host 'labviaS'" in proc.stderr, proc.stderr


def test_ssh_config_proxyjump_to_an_unknown_key_is_refused(lab, tmp_path):
    """An alias outside the inventory whose ssh_config ProxyJump names a jump host: the jump's key
    is checked like every other (Fabric builds the gateway Connection itself, with its auto-add
    policy)."""
    jump = lab.node("lab02")
    jump_block = (
        f"Host labjump\n  HostName 127.0.0.1\n  Port {jump.port}\n  User {lab.user}\n"
        f"  IdentityFile {lab.client_key}\n"
    )
    target = alias_block(lab, "Host labbehind") + "  ProxyJump labjump\n"
    # nothing vouches for labjump
    home = home_with(tmp_path, lab, jump_block + target, known_hosts=False)
    rc, doc, _ = fab_run(lab.root, "-H", "labbehind", "ping", env={"HOME": str(home)})
    assert rc == 4 and only_result(doc)["status"] == "unreachable", doc
    assert "its jump host labjump" in json.dumps(doc) and "fab -H labjump trust" in json.dumps(
        doc
    ), doc
    # Once the jump's key is trusted (its known_hosts), the same alias connects through it.
    (home / ".ssh" / "config").write_text(
        jump_block + f"  UserKnownHostsFile {lab.known_hosts}\n" + target
    )
    rc, doc, _ = fab_run(lab.root, "-H", "labbehind", "ping", env={"HOME": str(home)})
    assert rc == 0 and only_result(doc)["status"] == "ok", doc


def test_limit_takes_groups_exclusions_and_globs_from_the_command_line(lab):
    rc, doc, _ = fab_run(lab.root, "-H", "lab01,lab02", "ping", "--limit", "@lab,!lab02")
    assert rc == 0 and [r["host"] for r in doc["results"]] == ["lab01"], doc
    rc, doc, _ = fab_run(
        lab.root, "-H", "lab01,lab02", "ping", env={"FLEETOPS_LIMIT": "lab0*,!lab01"}
    )
    assert rc == 0 and [r["host"] for r in doc["results"]] == ["lab02"], doc
    proc = run_fab(lab.root, "-H", "lab01,lab02", "ping", "--limit", "!lab01,!lab02")
    assert proc.returncode == 2 and "matches none of the selected hosts" in proc.stderr, proc.stderr


def test_use_ssh_config_gives_aliases_and_connects_through_them(lab, tmp_path):
    """The wire's entry point for `fab -S FILE`: aliases (Include spliced in) handed to the
    inventory, and connections made with that file (each host resolved by `ssh -G`)."""
    from fleetops.wire import ssh

    included = tmp_path / "inc.conf"
    included.write_text(alias_block(lab, "Match host labmatch"))
    main = tmp_path / "main.conf"
    # at the top: an Include inside the `Host labalias` block would be read only for labalias, as
    # ssh reads it
    main.write_text(
        f"Include {included}\n"
        + alias_block(lab, "Host labalias")
        + "Host *\n  ServerAliveInterval 9\n"
    )
    try:
        aliases = ssh.use_ssh_config(str(main))
        assert {"labalias", "labmatch"} <= aliases and not any("*" in a for a in aliases)
        inventory = load_inventory(lab.root / "hosts", ssh_aliases=aliases)
        for alias in ("labalias", "labmatch"):
            node = ssh.NodeConnection(inventory.resolve(alias), inventory)
            try:
                answer, _ = node.call("ping", {})
            finally:
                node.close()
            assert answer.get("version", "").startswith("3."), answer
        # Fabric's -i: a key offered to a host outside the inventory (here user@127.0.0.1:PORT,
        # whose known_hosts comes from the file's UserKnownHostsFile and which has no IdentityFile).
        with main.open("a") as f:
            f.write(f"Host 127.0.0.1\n  UserKnownHostsFile {lab.known_hosts}\n")
        target = inventory.resolve(f"{lab.user}@127.0.0.1:{lab.node('lab01').port}")
        ssh.use_ssh_config(str(main), [str(lab.client_key)])
        node = ssh.NodeConnection(target, inventory)
        try:
            assert node.call("ping", {})[0].get("version", "").startswith("3.")
        finally:
            node.close()
        # the same host without the key: no login (no key, or one sshd refuses)
        ssh.use_ssh_config(str(main))
        with pytest.raises(ssh.TransportError) as err:
            ssh.NodeConnection(target, inventory).open()
        assert err.value.kind == "auth", err.value
        assert "no key to log in with" in str(err.value) or "authorized_keys" in str(err.value), (
            err.value
        )
    finally:
        ssh.use_ssh_config(None)


# ---------------------------------------------------------------- item 6: network faults
@pytest.mark.parametrize("behaviour", ["reset", "banner-reset"])
def test_connection_reset_during_handshake(lab, behaviour):
    with tcp_server(behaviour) as port:
        target = f"{lab.user}@127.0.0.1:{port}"
        rc, doc, _ = fab_run(lab.root, "-H", target, "ping")
    assert_unreachable(
        rc, doc, target, "closed during the SSH handshake", "check the port and the node's sshd log"
    )


def test_connection_refused(lab):
    port = closed_port()
    target = f"{lab.user}@127.0.0.1:{port}"
    rc, doc, _ = fab_run(lab.root, "-H", target, "ping")
    assert_unreachable(
        rc, doc, target, f"connection refused by 127.0.0.1:{port}", "check that sshd runs"
    )


def test_auth_refused_names_user_key_and_next_step(lab, tmp_path):
    # A key sshd does not know (made here, never installed on the node).
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    node = lab.node("lab01")
    (lab.root / "hosts" / "stranger.yaml").write_text(
        f"hosts:\n  stranger:\n    address: 127.0.0.1\n    port: {node.port}\n    user: "
        f"{lab.user}\n    identity_file: {key}\n    known_hosts: {lab.known_hosts}\n"
    )
    try:
        rc, doc, _ = fab_run(lab.root, "-H", "stranger", "ping")
    finally:
        (lab.root / "hosts" / "stranger.yaml").unlink()
    assert_unreachable(
        rc,
        doc,
        "stranger",
        f"authentication failed for user '{lab.user}'",
        str(key),
        "authorized_keys",
    )


def test_unknown_host_key_of_an_inventory_host_names_trust(lab, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    node = lab.node("lab01")
    (lab.root / "hosts" / "fresh.yaml").write_text(
        f"hosts:\n  fresh:\n    address: 127.0.0.1\n    port: {node.port}\n    user: {lab.user}\n"
        f"    identity_file: {lab.client_key}\n    known_hosts: {empty}\n"
    )
    try:
        rc, doc, _ = fab_run(lab.root, "-H", "fresh", "ping")
    finally:
        (lab.root / "hosts" / "fresh.yaml").unlink()
    assert_unreachable(
        rc, doc, "fresh", "unknown host key SHA256:", "fab -H fresh trust --fingerprint SHA256:"
    )


def test_dns_failure(lab, tmp_path):
    """A name that cannot resolve, looked up inside a network namespace with no way out: the
    resolver (whatever /etc/resolv.conf names) is unreachable, so nothing leaves the machine."""
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip(
            "unshare -n is not permitted here: the DNS case needs an isolated network namespace"
        )
    import os
    import sys

    home = home_with(tmp_path, lab, known_hosts=False)
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", "HOME": str(home)}
    target = f"{lab.user}@nosuchnode.invalid"
    proc = subprocess.run(
        ["unshare", "-n", sys.executable, "-m", "fabric", "-H", target, "ping", "--json"],
        cwd=lab.root,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert_unreachable(
        proc.returncode, doc, target, "cannot resolve 'nosuchnode.invalid'", "check the name"
    )


def test_a_typo_in_a_jump_host_is_refused_without_a_lookup(lab):
    node = lab.node("lab01")
    extra = lab.root / "hosts" / "jumpy.yaml"
    extra.write_text(
        f"hosts:\n  behind:\n    address: 127.0.0.1\n    port: {node.port}\n    jump: lab2\n    "
        f"user: {lab.user}\n    identity_file: "
        f"{lab.client_key}\n    known_hosts: {lab.known_hosts}\n"
    )
    try:
        rc, doc, _ = fab_run(lab.root, "-H", "behind", "ping")
    finally:
        extra.unlink()
    # Refused before any connection: "lab2" never became a DNS query.
    assert_unreachable(
        rc, doc, "behind: its jump host: unknown host 'lab2'", "did you mean 'lab02'?"
    )


def test_sftp_failure_while_uploading_the_agent_is_one_line(lab):
    node = lab.node("lab01")
    extra = lab.root / "hosts" / "nowrite.yaml"
    # /proc refuses mkdir for anyone, root included: the agent upload fails on the node's side.
    extra.write_text(
        f"hosts:\n  nowrite:\n    address: 127.0.0.1\n    port: {node.port}\n    user: {lab.user}\n"
        f"    identity_file: {lab.client_key}\n    known_hosts: {lab.known_hosts}\n"
        f"    python: {node.python}\n    state_dir: /proc/fleetops-h2\n"
    )
    try:
        rc, doc, _ = fab_run(lab.root, "-H", "nowrite", "ping")
    finally:
        extra.unlink()
    result = only_result(doc)
    assert rc == 1 and result["status"] == "failed", doc
    assert "nowrite: cannot write /proc/fleetops-h2/bin/" in result["msg"], result
    assert (
        "over SFTP" in result["msg"] and "check that the login user may write" in result["msg"]
    ), result


def test_changed_host_key_names_trust_replace_which_replaces_only_the_named_key(lab, tmp_path):
    """A reimaged node: the refusal shows the new key and names `trust --replace --fingerprint` for
    the one checked on the node; --replace with another fingerprint changes nothing; with the right
    one the old line (here a hashed one, as HashKnownHosts writes) is replaced, other lines are
    kept, and the node answers."""
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    node = lab.node("lab01")
    known = tmp_path / "known_hosts"
    name = f"[127.0.0.1]:{node.port}"
    old_key = " ".join(other.with_suffix(".pub").read_text().split()[:2])
    known.write_text(
        f"{paramiko.HostKeys.hash_host(name)} {old_key}\n# a comment kept\nkeep.example {old_key}\n"
    )
    (lab.root / "hosts" / "moved.yaml").write_text(
        f"hosts:\n  moved:\n    address: 127.0.0.1\n    port: {node.port}\n    user: {lab.user}\n"
        f"    identity_file: {lab.client_key}\n    known_hosts: {known}\n"
    )
    try:
        rc, doc, _ = fab_run(lab.root, "-H", "moved", "ping")
        msg = assert_unreachable(
            rc,
            doc,
            "moved",
            "host key does not match known_hosts",
            "fab -H moved trust --replace --fingerprint SHA256:",
        )
        offered = msg.split(", got ", 1)[1].split(";")[0]
        # no --replace
        rc, doc, _ = fab_run(lab.root, "-H", "moved", "trust", "--fingerprint", offered)
        assert rc == 1 and "trust --replace --fingerprint" in only_result(doc)["msg"], doc
        rc, doc, _ = fab_run(
            lab.root, "-H", "moved", "trust", "--replace", "--fingerprint", "SHA256:wrong"
        )
        assert rc == 1 and "nothing replaced" in only_result(doc)["msg"], doc
        assert known.read_text().count(old_key) == 2
        rc, doc, _ = fab_run(
            lab.root, "-H", "moved", "trust", "--replace", "--fingerprint", offered
        )
        assert rc == 0 and only_result(doc)["status"] == "changed", doc
        lines = known.read_text().splitlines()
        assert lines[:2] == ["# a comment kept", f"keep.example {old_key}"] and lines[2].startswith(
            name
        ), lines
        rc, doc, _ = fab_run(lab.root, "-H", "moved", "ping")
        assert rc == 0 and only_result(doc)["status"] == "ok", doc
    finally:
        (lab.root / "hosts" / "moved.yaml").unlink()


def _login_order(monkeypatch) -> list[str]:
    """What each login of this test sent and received, in order: 'sent userauth-request', 'got
    service-accept', 'sent channel-open', 'got userauth-success'."""
    from fleetops.wire import ssh

    return login_order(monkeypatch, ssh._FleetTransport, ssh._PipelinedAuth)


def _ping_with(lab, name: str, key: Path | None = None) -> dict:
    from fleetops.wire.ssh import NodeConnection

    inventory = load_inventory(lab.root / "hosts")
    host = inventory.resolve(name)
    if key is not None:
        from dataclasses import replace

        host = replace(host, identity_file=str(key))
    conn = NodeConnection(host, inventory)
    try:
        answer, _ = conn.call("ping", {})
    finally:
        conn.close()
    return answer


def test_a_login_sends_its_key_right_behind_the_service_request(lab, monkeypatch):
    """Paramiko waited for SERVICE_ACCEPT before it sent the signed USERAUTH_REQUEST, one round trip
    of every connection (50 ms at the bench's RTT). To OpenSSH, with a key whose signature does not
    depend on the server's answer (ed25519 here), both go out together, and the login still
    works."""
    order = _login_order(monkeypatch)
    assert _ping_with(lab, "lab01")["ok"]
    assert (
        order.index("sent service-request")
        < order.index("sent userauth-request")
        < order.index("got service-accept")
    ), order


def test_the_session_channel_opens_right_behind_the_login(lab, monkeypatch):
    """The agent's channel was asked for once the login had succeeded, one more round trip of every
    connection. It now goes out with the login request; sshd reads it once the login is done, and
    the agent runs on that channel: one CHANNEL_OPEN in all, sent before the login's answer came."""
    order = _login_order(monkeypatch)
    assert _ping_with(lab, "lab01")["ok"]
    # (the SERVICE_ACCEPT may come back while the request is being signed: only these orders are the
    # claim)
    assert order.count("sent channel-open") == 1, order
    assert (
        order.index("sent userauth-request")
        < order.index("sent channel-open")
        < order.index("got userauth-success")
    ), order


def test_a_refused_key_then_an_accepted_one_gets_a_fresh_session_channel(
    lab, tmp_path, monkeypatch
):
    """Found in review: the channel opened behind a key sshd refuses is read by sshd's pre-login
    loop and answered UNIMPLEMENTED, never confirmed. When paramiko's next key logs in (RSA here:
    not sent ahead), the first session must not wait on that dead channel (the agent waited out
    connect_timeout and failed as 'lost'; Fabric's SFTP would have waited an hour)."""
    from fleetops.wire import ssh

    refused, accepted = tmp_path / "id_ed25519_refused", tmp_path / "id_rsa"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(refused)], check=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(accepted)], check=True
    )
    keys = lab.node("lab01").dir / "authorized_keys"
    before = keys.read_text()
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host 127.0.0.1\n  UserKnownHostsFile {lab.known_hosts}\n  IdentitiesOnly yes\n"
    )
    keys.write_text(accepted.with_suffix(".pub").read_text())
    try:
        inventory = load_inventory(lab.root / "hosts")
        ssh.use_ssh_config(str(config), [str(refused), str(accepted)])  # Fabric's -i, in this order
        target = inventory.resolve(f"{lab.user}@127.0.0.1:{lab.node('lab01').port}")
        order = _login_order(monkeypatch)
        started = time.monotonic()
        node = ssh.NodeConnection(target, inventory)
        try:
            answer, _ = node.call("ping", {})
        finally:
            node.close()
        elapsed = time.monotonic() - started
    finally:
        ssh.use_ssh_config(None)
        keys.write_text(before)
    assert answer["ok"], answer
    # the dead one behind the refused ed25519 key, then a fresh one once the RSA key had logged in
    assert order.count("sent userauth-request") == 2 and order.count("sent channel-open") == 2, (
        order
    )
    assert (
        order.index("sent channel-open")
        < order.index("got userauth-success")
        < len(order) - 1 - order[::-1].index("sent channel-open")
    ), order
    assert elapsed < 3, f"the session waited {elapsed:.1f}s"


def test_a_node_that_refuses_sessions_fails_at_once_naming_the_host(lab, monkeypatch):
    """The channel opened ahead is refused (sshd's MaxSessions 0): the step fails with the host and
    sshd's reason as soon as the refusal arrives, not after a timeout, and the next connection works
    again."""
    from fleetops.wire.connector import TransportError

    node = lab.node("lab01")
    config = node.config.read_text()
    lab.stop_node(node)
    node.config.write_text(config.replace("MaxSessions 100", "MaxSessions 0"))
    try:
        lab.start_node(node)
        order = _login_order(monkeypatch)
        started = time.monotonic()
        with pytest.raises(TransportError) as refused:
            _ping_with(lab, "lab01")
        elapsed = time.monotonic() - started
    finally:
        lab.stop_node(node)
        node.config.write_text(config)
        lab.start_node(node)
    assert "sent channel-open" in order and order.index("sent channel-open") < order.index(
        "got userauth-success"
    )
    message = str(refused.value)
    assert message.startswith("lab01: its sshd accepted the login but refused a session channel"), (
        message
    )
    assert "MaxSessions" in message and refused.value.kind == "refused", message
    assert elapsed < 3, f"the refusal took {elapsed:.1f}s to surface"
    assert _ping_with(lab, "lab01")["ok"]


def test_an_rsa_key_logs_in_the_usual_way(lab, tmp_path, monkeypatch):
    """RSA's signature algorithm is chosen from the server's server-sig-algs, which may still be in
    flight when the service request goes out: such a login keeps paramiko's order, and works."""
    key = tmp_path / "rsa_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(key)], check=True
    )
    keys = lab.node("lab01").dir / "authorized_keys"
    before = keys.read_text()
    keys.write_text(before + key.with_suffix(".pub").read_text())
    try:
        order = _login_order(monkeypatch)
        assert _ping_with(lab, "lab01", key)["ok"]
    finally:
        keys.write_text(before)
    assert order == [
        "sent service-request",
        "got service-accept",
        "sent userauth-request",
        "got userauth-success",
        "sent channel-open",
    ], order
