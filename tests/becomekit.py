"""The set-up of the `become` lab tests: a real login user and attacker made with useradd, a
sudoers entry checked by visudo, venvs of the system Python holding the lab's speculators, and
the inventory and playbook that point fleetops at them. Made here once so every become test builds
the same world; each module removes what it made."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from conftest import GENERATOR, copy_playbooks

from fleetops.lab import Lab, Node, site_packages

# The shipped diff of the generator module: the one patch the become playbooks apply.
GENERATOR_DIFF = "speculators-0.3.0-vllm-0.16/vllm_hidden_states_generator.diff"
# The Debian package of each tool the tests need, for the message that says how to get it.
PACKAGES = {"sudo": "sudo", "setpriv": "util-linux", "visudo": "sudo"}


def require_tools(*tools: str) -> None:
    """Fail (never skip) where a tool the tests drive is missing: they need the real one."""
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.fail(
                f"{tool} is not installed on this machine (apt-get install "
                f"{PACKAGES.get(tool, tool)}): the become tests need a real one",
                pytrace=False,
            )


def world_dir(prefix: str) -> Path:
    """A fresh directory under /tmp that every user may enter (the login user's home and the venvs
    live there; the lab's own directories are under /root, which no other user may enter)."""
    top = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    top.chmod(0o755)
    return top


def remove_users(users: Sequence[str], group: str | None = None) -> None:
    """The users (and their group) a module made, gone; quietly, since a run killed half-way may
    have left some of them or none."""
    for user in users:
        subprocess.run(["userdel", user], capture_output=True)
    if group is not None:
        subprocess.run(["groupdel", group], capture_output=True)


def add_login_user(name: str, home: Path, password: str | None = None) -> None:
    """A user sshd lets in by key: a home of its own, and a password set (sshd without PAM lets no
    one in whose password is locked, useradd's default); a random one unless the test types it."""
    subprocess.run(
        ["useradd", "--home-dir", str(home), "--create-home", "--shell", "/bin/sh", name],
        check=True,
    )
    secret = os.urandom(12).hex() if password is None else password
    subprocess.run(["chpasswd"], input=f"{name}:{secret}\n", text=True, check=True)


def add_team_member(name: str, team: str) -> None:
    """The attacker: no home, in the team group that may write parts of the venvs."""
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/bin/sh", "-G", team, name], check=True
    )


def speculators_venv(path: Path, src: Path) -> Path:
    """A venv of the system Python (the lab's interpreters live under /root, which no other user
    may enter) holding a copy of the lab's speculators from `src`; root's, readable by all,
    writable by root alone."""
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(path)], check=True)
    for entry in [src / "speculators", *src.glob("speculators-*.dist-info")]:
        shutil.copytree(
            entry, site_packages(path) / entry.name, ignore=shutil.ignore_patterns("__pycache__")
        )
    subprocess.run(["chmod", "-R", "a+rX,go-w", str(path)], check=True)
    return path


def install_sudoers(path: Path, rules: str) -> None:
    """A sudoers.d entry, mode 0440 as sudo requires, refused here if visudo finds it wrong (a bad
    file would break sudo for the whole machine)."""
    path.write_text(rules)
    path.chmod(0o440)
    subprocess.run(["visudo", "-c", "-f", str(path)], check=True, capture_output=True)


def write_login_hosts(
    lab: Lab, node: Node, user: str, name: str, hosts: Mapping[str, Sequence[str]]
) -> None:
    """hosts/NAME: each host logs in to `node` as `user` with the lab's key and known hosts, plus
    its own lines (python, state_dir, become), each already indented as a host's key."""
    base = [
        "    address: 127.0.0.1",
        f"    port: {node.port}",
        f"    user: {user}",
        f"    identity_file: {lab.client_key}",
        f"    known_hosts: {lab.known_hosts}",
    ]
    (lab.root / "hosts" / name).write_text(
        "hosts:\n"
        + "".join(
            f"  {host}:\n" + "\n".join([*base, *extra]) + "\n" for host, extra in hosts.items()
        )
    )


def write_generator_playbook(lab: Lab, book: str, name: str, tail: str = "") -> None:
    """The project's own copy of the playbooks (a real copy: BOOK is the module's, not the
    checkout's) and BOOK, named NAME, patching the generator module; `tail`: more of its YAML."""
    copy_playbooks(lab.root)
    (lab.root / book).write_text(
        f"name: {name}\npatches:\n  - module: {GENERATOR}\n    diff: {GENERATOR_DIFF}\n{tail}"
    )
