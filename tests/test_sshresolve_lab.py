"""ssh_config as OpenSSH reads it, against the lab's sshd nodes (loopback): a host behind
`ProxyCommand ssh -W %h:%p jump` is reached through the jump host's sshd, the command run with the
port the -H word types; a `Match exec` block decides the port, and sees the -H word's port as %p.
Each test has a HOME of its own: the operator's ~/.ssh is never read or written."""

from __future__ import annotations

import json

import pytest
from conftest import run_fab
from sshhome import home_with, logged_since

pytestmark = pytest.mark.lab


def test_a_host_behind_a_proxycommand_is_reached_through_it(lab, tmp_path):
    target, jump = lab.node("lab01"), lab.node("lab02")
    keys = (
        f"  IdentityFile {lab.client_key}\n  UserKnownHostsFile "
        f"{lab.known_hosts}\n  User {lab.user}\n"
    )
    home = tmp_path / "home"
    config = (
        f"Host labjump\n  HostName 127.0.0.1\n  Port {jump.port}\n{keys}"
        "  BatchMode yes\n  StrictHostKeyChecking yes\n  ProxyCommand none\n"
        f"Host labbehind\n  HostName 127.0.0.1\n  Port 1\n{keys}"
        f"  ProxyCommand ssh -F {home}/.ssh/config -W %h:%p labjump\n"
    )
    home_with(tmp_path, lab, config)
    jump_log, target_log = jump.dir / "sshd.log", target.dir / "sshd.log"
    jump_before, target_before = jump_log.stat().st_size, target_log.stat().st_size
    # the port typed in the -H word wins over ssh_config's Port 1, in %p too, as with `ssh -p`
    proc = run_fab(
        lab.root,
        "-H",
        f"labbehind:{target.port}",
        "ping",
        "--json",
        env={"HOME": str(home)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    through = logged_since(jump_log, jump_before)
    # the jump's own sshd
    assert f"Accepted publickey for {lab.user} from 127.0.0.1" in through, through
    landed = logged_since(target_log, target_before)
    # and the target's, at %p
    assert f"Accepted publickey for {lab.user} from 127.0.0.1" in landed, landed


def test_a_match_exec_block_decides_the_port(lab, tmp_path):
    target = lab.node("lab01")
    flag = tmp_path / "on-site"
    config = (
        f'Match originalhost labexec exec "test -e {flag}"\n  Port {target.port}\n'
        "Host labexec\n  HostName 127.0.0.1\n  Port 1\n  "
        f"User {lab.user}\n  IdentityFile {lab.client_key}\n"
        f"  UserKnownHostsFile {lab.known_hosts}\n"
    )
    home = home_with(tmp_path, lab, config)
    proc = run_fab(
        lab.root, "-H", "labexec", "ping", "--json", env={"HOME": str(home)}, timeout=300
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stdout + proc.stderr, (
        proc.stdout + proc.stderr
    )
    # port 1: nothing listens
    assert "127.0.0.1" in json.loads(proc.stdout)["results"][0]["msg"], proc.stdout
    flag.touch()
    log = target.dir / "sshd.log"
    before = log.stat().st_size
    proc = run_fab(
        lab.root, "-H", "labexec", "ping", "--json", env={"HOME": str(home)}, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"Accepted publickey for {lab.user} from 127.0.0.1" in logged_since(log, before)


def test_a_match_exec_sees_the_port_typed_in_the_host_word(lab, tmp_path):
    """%p in `Match exec` is the port the -H word names (ssh's -p): the block gives the HostName
    sshd is on."""
    target = lab.node("lab01")
    config = (
        f'Match originalhost labport exec "test %p = {target.port}"\n  HostName 127.0.0.1\n'
        f"Host labport\n  HostName 127.0.0.3\n  User {lab.user}\n  IdentityFile {lab.client_key}\n"
        f"  UserKnownHostsFile {lab.known_hosts}\n"
    )
    home = home_with(tmp_path, lab, config)
    log = target.dir / "sshd.log"
    before = log.stat().st_size
    proc = run_fab(
        lab.root,
        "-H",
        f"labport:{target.port}",
        "ping",
        "--json",
        env={"HOME": str(home)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"Accepted publickey for {lab.user} from 127.0.0.1" in logged_since(log, before)
