"""The flags that reach a connection, against the lab's real sshd: -i, -u/--user, --port and
-t/--connect-timeout apply to the hosts of the run, over the inventory (the command line wins, as
with ssh); -T is the ad-hoc command's timeout; --json and the run options go before or after the
task; a bad value is refused before any host is contacted; a closed stdout ends the run quietly
(141); the host-key refusals never hand over a command that trusts the key the node offers. Every
connection is to 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.lab

BIN = Path(sys.executable).parent
PROGRAMS = {"fleet": BIN / "fleet", "fab": BIN / "fab"}


def run(
    program: str,
    project: Path,
    *args: str,
    env: dict | None = None,
    stdout: int | None = None,
    home: Path | None = None,
) -> subprocess.CompletedProcess:
    full_env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "COLUMNS": "200",
        "FLEETOPS_NO_LIVE": "1",
        **(env or {}),
    }
    full_env.pop("SSH_AUTH_SOCK", None)  # no agent: the keys tried are the ones the command names
    if home is not None:
        full_env["HOME"] = str(home)
    return subprocess.run(
        [str(PROGRAMS[program]), *args],
        cwd=project,
        text=True,
        env=full_env,
        timeout=300,
        stdout=subprocess.PIPE if stdout is None else stdout,
        stderr=subprocess.PIPE,
    )


def results(proc: subprocess.CompletedProcess) -> list[dict]:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    try:
        return json.loads(proc.stdout)["results"]
    except ValueError:
        raise AssertionError(
            f"no JSON: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        ) from None


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def silent_port() -> Iterator[int]:
    """A loopback port that accepts TCP (the kernel's backlog) and never says a word: no SSH banner
    comes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    try:
        yield srv.getsockname()[1]
    finally:
        srv.close()


@contextmanager
def extra_inventory(lab, name: str, text: str) -> Iterator[None]:
    path = lab.root / "hosts" / f"{name}.yaml"
    path.write_text(text)
    try:
        yield
    finally:
        path.unlink()


def node_entry(
    lab,
    name: str,
    node,
    *,
    identity: bool = True,
    port: int | None = None,
    known_hosts: Path | None = None,
    timeout: int | None = None,
) -> str:
    lines = [
        f"hosts:\n  {name}:",
        "    address: 127.0.0.1",
        f"    port: {port or node.port}",
        f"    user: {lab.user}",
        f"    known_hosts: {known_hosts or lab.known_hosts}",
        f"    python: {node.python}",
        f"    state_dir: {node.state_dir}",
    ]
    if identity:
        lines.append(f"    identity_file: {lab.client_key}")
    if timeout:
        lines.append(f"    connect_timeout: {timeout}")
    return "\n".join(lines) + "\n"


def new_key(tmp_path: Path, name: str = "other") -> Path:
    key = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


# ---------------------------------------------------------------- -i, -u, --port, -t: the command
# line wins
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_identity_flag_replaces_the_inventory_key_of_an_inventory_host(lab, tmp_path, program):
    other = new_key(tmp_path)  # not in the node's authorized_keys
    (r,) = results(run(program, lab.root, "-i", str(other), "-H", "lab01", "ping", "--json"))
    assert (
        r["status"] == "unreachable"
        and "authentication failed" in r["msg"]
        and str(other) in r["msg"]
    ), r
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)  # no ~/.ssh/id_*: the only key offered is the one -i names
    with extra_inventory(
        lab, "nokey", node_entry(lab, "nokey01", lab.node("lab01"), identity=False)
    ):
        (r,) = results(
            run(
                program,
                lab.root,
                "-i",
                str(lab.client_key),
                "-H",
                "nokey01",
                "ping",
                "--json",
                home=home,
            )
        )
    assert r["status"] == "ok", r


@pytest.mark.parametrize(
    "args",
    [
        ["fleet", "-u", "nosuchuser", "-H", "lab01", "ping"],
        ["fleet", "-H", "lab01", "ping", "--user", "nosuchuser"],
        ["fab", "-H", "lab01", "ping", "-u", "nosuchuser"],
        ["fab", "-H", "lab01", "ping", "--user", "nosuchuser"],
    ],
)
def test_user_flag_overrides_the_inventory_user(lab, args):
    # (before the task with `fleet`; after it with Fabric's own `fab`, which reads what comes first
    # as its own)
    (r,) = results(run(args[0], lab.root, *args[1:], "--json"))
    assert r["status"] == "unreachable" and "user 'nosuchuser'" in r["msg"], r
    (r,) = results(
        run(args[0], lab.root, *[lab.user if a == "nosuchuser" else a for a in args[1:]], "--json")
    )
    assert r["status"] == "ok", r


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_port_flag_overrides_the_inventory_port_and_a_port_in_the_host_word_wins_over_both(
    lab, program
):
    port = closed_port()
    where = (
        (lambda *words: ["--port", str(port), *words])
        if program == "fleet"
        else (lambda *words: [*words, "--port", str(port)])
    )  # Fabric's own `fab`: after the task
    (r,) = results(run(program, lab.root, *where("-H", "lab01", "ping"), "--json"))
    assert r["status"] == "unreachable" and f"127.0.0.1:{port}" in r["msg"], r
    word = f"lab01:{lab.node('lab01').port}"  # the -H word names its own port: that one is used
    (r,) = results(run(program, lab.root, *where("-H", word, "ping"), "--json"))
    assert r["status"] == "ok", r


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_connect_timeout_flag_overrides_the_inventorys(lab, program):
    with (
        silent_port() as port,
        extra_inventory(
            lab, "silent", node_entry(lab, "silent01", lab.node("lab01"), port=port, timeout=20)
        ),
    ):
        started = time.monotonic()
        (r,) = results(run(program, lab.root, "-t", "1", "-H", "silent01", "ping", "--json"))
        took = time.monotonic() - started
    assert r["status"] == "unreachable" and "timed out after 1s" in r["msg"], r
    assert took < 15, took  # not the inventory's 20 s


@pytest.mark.parametrize(
    "args",
    [
        ["fleet", "-T", "1", "-H", "lab01", "--json", "--", "sleep", "5"],
        ["fab", "-T", "1", "-H", "lab01", "run", "sleep 5", "--json"],
    ],
)
def test_command_timeout_flag_is_the_adhoc_commands_timeout(lab, args):
    started = time.monotonic()
    proc = run(args[0], lab.root, *args[1:])
    (r,) = results(proc)
    assert proc.returncode == 1 and r["status"] == "failed" and "timed out after 1s" in r["msg"], r
    assert time.monotonic() - started < 5


# ---------------------------------------------------------------- core flags before or after the
# task (before the task with `fleet`, whose core flags they are; after it with Fabric's own `fab`
# too)
@pytest.mark.parametrize(
    "args",
    [
        ["fleet", "--json", "-H", "lab01", "ping"],
        ["fab", "-H", "lab01", "ping", "--json"],
        ["fleet", "-H", "@lab", "--json", "--limit", "lab02", "ping"],
        ["fab", "-H", "@lab", "ping", "--json", "--limit", "lab02"],
        ["fleet", "-H", "lab01", "ping", "--json"],
    ],
)
def test_json_before_or_after_the_task(lab, args):
    proc = run(args[0], lab.root, *args[1:])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (r,) = results(proc)
    assert r["status"] == "ok" and r["host"] == ("lab02" if "--limit" in args else "lab01"), r


def test_playbook_before_the_task_with_fleet(lab, tmp_path):
    books = tmp_path / "books"
    shutil.copytree(REPO / "playbooks", books)
    shipped = next(books.glob("speculators-*.yaml"))
    other = shipped.with_name("elsewhere.yaml")
    other.write_text(re.sub(r"(?m)^name: .*$", "name: elsewhere", shipped.read_text()))
    for args in (
        ["-p", str(other), "-H", "lab01", "verify"],
        ["-H", "lab01", "--playbook", str(other), "verify"],
    ):
        (r,) = results(run("fleet", lab.root, *args, "--kinds", "compile", "--json"))
        assert r["status"] == "ok" and r["data"]["playbook"] == "elsewhere", r


# ---------------------------------------------------------------- bad values: before any host
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_a_bad_tail_lines_is_a_usage_error_not_a_failed_host(lab, program):
    last_failed = lab.root / ".fleetops" / "last-failed"
    last_failed.unlink(missing_ok=True)
    proc = run(program, lab.root, "-H", "lab01", "tail", "--lines", "abc")
    assert proc.returncode == 2 and "--lines" in proc.stderr, proc.stdout + proc.stderr
    assert "re-run" not in proc.stdout + proc.stderr and "failed" not in proc.stdout, proc.stdout
    assert not last_failed.exists()


def test_lab_kernel_with_a_bad_xid_is_a_usage_error(lab):
    log = lab.node("lab01").dir / "kernel.log"
    before = log.read_text() if log.exists() else None
    proc = run("fab", lab.root, "lab.kernel", "--node", "lab01", "--xid", "abc")
    assert proc.returncode == 2 and "--xid" in proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert (log.read_text() if log.exists() else None) == before


# ---------------------------------------------------------------- a closed stdout (`| head`)
@pytest.mark.parametrize(
    "args",
    [
        ["fab", "-H", "@lab", "facts"],
        ["fleet", "-H", "@lab", "facts"],
        ["fab", "-H", "lab01", "run", "seq 1 100000"],
    ],
)
def test_a_closed_stdout_ends_a_run_quietly_with_141(lab, args):
    read, write = os.pipe()
    os.close(read)
    try:
        proc = run(args[0], lab.root, *args[1:], stdout=write)
    finally:
        os.close(write)
    assert proc.returncode == 141 and proc.stderr == "", (proc.returncode, proc.stderr)


# ---------------------------------------------------------------- host keys: verify first, never
# one paste
def fingerprint(pub: Path) -> str:
    return subprocess.run(
        ["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True
    ).stdout.split()[1]


def assert_verify_first(msg: str, offered: str, name: str) -> None:
    """The message shows the offered key, says how to check it on the node, and gives the trust
    command with the fingerprint left for the operator to fill in from that check: never the offered
    one, ready to paste."""
    assert offered in msg and "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub" in msg, msg
    assert f"fab -H {name} trust" in msg, msg
    commands = re.findall(r"fab -H \S+ trust[^;]*", msg)
    assert commands and all(offered not in c for c in commands), commands


def test_host_key_refusals_say_how_to_verify_and_never_offer_to_trust_the_offered_key(
    lab, tmp_path
):
    node = lab.node("lab01")
    offered = fingerprint(node.dir / "ssh_host_ed25519_key.pub")
    other = new_key(tmp_path)
    changed, unknown = tmp_path / "changed_known_hosts", tmp_path / "empty_known_hosts"
    changed.write_text(
        f"[127.0.0.1]:{node.port} {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n"
    )
    unknown.write_text("")
    before = changed.read_text()
    inventory = node_entry(lab, "moved", node, known_hosts=changed) + node_entry(
        lab, "fresh", node, known_hosts=unknown
    ).replace("hosts:\n", "")
    with extra_inventory(lab, "moved", inventory):
        for (
            host,
            task,
        ) in (("moved", ["ping"]), ("moved", ["trust"]), ("fresh", ["ping"]), ("fresh", ["trust"])):
            (r,) = results(run("fab", lab.root, "-H", host, *task, "--json"))
            assert r["status"] in ("unreachable", "failed"), r
            assert_verify_first(r["msg"], offered, host)
        # The command as printed, pasted: refused, nothing trusted.
        (r,) = results(run("fab", lab.root, "-H", "moved", "ping", "--json"))
        printed = re.findall(r"fab -H moved trust --replace --fingerprint (\S+)", r["msg"])
        assert printed, r["msg"]
        (r,) = results(
            run(
                "fab",
                lab.root,
                "-H",
                "moved",
                "trust",
                "--replace",
                "--fingerprint",
                printed[0],
                "--json",
            )
        )
        assert r["status"] == "failed" and "nothing replaced" in r["msg"], r
    assert changed.read_text() == before and unknown.read_text() == ""
