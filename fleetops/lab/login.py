"""`fab lab.up --login-user NAME`: the lab with a non-root login user for `become: sudo` — the user
(made with useradd when missing), let into every node's sshd with the lab's key, a sudoers entry
that lets it run each node's python as root (NOPASSWD, that exact path: docs/become.md), and
hosts/lab-become.yaml with a host per node (`lab01-become`: that user, `become: sudo`, a state dir
of root's). `fab lab.down` removes the sudoers entry and that file; the user stays (userdel NAME
removes it)."""

from __future__ import annotations

import os
import pwd
import re
import subprocess
from pathlib import Path

from . import gpu
from .common import LabError
from .lab import Lab

HOSTS = "lab-become.yaml"
SUDOERS_DIR = Path("/etc/sudoers.d")
_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


def sudoers_file(name: str) -> Path:
    return SUDOERS_DIR / f"fleetops-lab-{name}"


def add_login_user(lab: Lab, name: str) -> Path:
    """Set it all up for the lab's nodes (lab.up ran); returns the inventory file written. Raises
    LabError."""
    if not _NAME.fullmatch(name) or name == lab.user:
        raise LabError(
            f"--login-user {name!r}: a login name (lowercase letters, digits, _ and -), not the "
            f"lab's own user {lab.user}"
        )
    if os.geteuid() != 0:
        raise LabError("--login-user needs root: it adds a user (useradd) and a sudoers entry")
    nodes = lab.nodes()
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--create-home", "--shell", "/bin/sh", name],
            check=True,
            capture_output=True,
        )
        # useradd leaves the password "!" (locked), and sshd lets no locked account in, even with a
        # key; "*": no password can log in, and the account is not locked
        subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
    for node in nodes:  # sshd reads authorized_keys as the user logging in
        keys = node.dir / "authorized_keys"
        if (
            subprocess.run(
                [
                    "setpriv",
                    "--reuid",
                    name,
                    "--regid",
                    name,
                    "--init-groups",
                    "test",
                    "-r",
                    str(keys),
                ],
                capture_output=True,
            ).returncode
            != 0
        ):
            raise LabError(
                f"--login-user {name}: {name} may not read "
                f"{keys} (a folder above it is closed to other "
                "users, e.g. /root): sshd reads it as the "
                "user logging in; make the lab's project in a "
                "folder every user may enter (e.g. under /srv)"
            )
    for node in nodes:
        _interpreter_in_reach(node.python, name)
    _write_sudoers(name, [str(node.python) for node in nodes])
    for node in nodes:
        lab.configure_sshd(node, users=(name,))
    (lab.dir / "login-user").write_text(name + "\n")
    path = lab.root / "hosts" / HOSTS
    lines = [
        (
            "# Written by `fab lab.up --login-user`: the lab's "
            "nodes as a non-root login user with become: sudo."
        ),
        "defaults:",
        "  address: 127.0.0.1",
        f"  user: {name}",
        f"  identity_file: {lab.client_key}",
        f"  known_hosts: {lab.known_hosts}",
        "  become: sudo",
        "  lab: true",
        "  connect_timeout: 5",
        "hosts:",
    ]
    for node in nodes:
        lines += [
            f"  {node.name}-become:",
            f"    port: {node.port}",
            f"    python: {node.python}",
            f"    state_dir: {node.dir / 'rootstate'}",
            f"    gpus: {gpu.SIMULATED_GPUS}",
            "    groups: [lab-become]",
        ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _interpreter_in_reach(python: Path, name: str) -> None:
    """The client checks a become host's `python:` over SFTP as the login user, link by link, before
    sudo runs it: a lab venv's python links to the base venv's, under /root, which no other user may
    enter. The node's link then goes to the system's interpreter of the same version
    (/usr/bin/pythonX.Y: the venv still finds its pyvenv.cfg and its packages beside the link),
    which every user may reach."""
    real = Path(os.path.realpath(python))
    if not _reaches(name, real):
        version = subprocess.run(
            [str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        system = Path(f"/usr/bin/python{version}")
        if not version or not system.is_file() or not _reaches(name, system):
            raise LabError(
                f"--login-user {name}: {name} may not reach the node's interpreter {real} (a "
                "folder above it is closed to other users, e.g. /root), and there is no "
                f"{system} to use instead"
            )
        fresh = python.with_name(f".{python.name}.new")
        fresh.unlink(missing_ok=True)
        fresh.symlink_to(system)
        os.replace(fresh, python)


def _reaches(name: str, path: Path) -> bool:
    return (
        subprocess.run(
            ["setpriv", "--reuid", name, "--regid", name, "--init-groups", "test", "-x", str(path)],
            capture_output=True,
        ).returncode
        == 0
    )


def _write_sudoers(name: str, pythons: list[str]) -> None:
    """Checked by visudo before it is put in place: a broken sudoers file would lock sudo for
    everyone."""
    target = sudoers_file(name)
    draft = target.with_name(f".{target.name}.new")
    draft.write_text("".join(f"{name} ALL=(root) NOPASSWD: {python}\n" for python in pythons))
    draft.chmod(0o440)
    checked = subprocess.run(["visudo", "-c", "-f", str(draft)], capture_output=True, text=True)
    if checked.returncode != 0:
        draft.unlink(missing_ok=True)
        raise LabError(
            f"--login-user {name}: visudo refused the sudoers entry: "
            f"{checked.stdout + checked.stderr}"
        )
    os.replace(draft, target)


def remove_login_user(lab: Lab) -> str | None:
    """lab.down: the sudoers entry and hosts/lab-become.yaml go; the user's name, if there was
    one."""
    marker = lab.dir / "login-user"
    if not marker.exists():
        return None
    name = marker.read_text().strip()
    if _NAME.fullmatch(name):
        sudoers_file(name).unlink(missing_ok=True)
    (lab.root / "hosts" / HOSTS).unlink(missing_ok=True)
    marker.unlink()
    return name
