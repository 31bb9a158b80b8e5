"""What the ssh_config tests against the lab share: a HOME of the test's own (the operator's ~/.ssh
is never read or written), and what a node's sshd logged after a mark, the node's own evidence that
a connection went where ssh_config said."""

from __future__ import annotations

import shutil
from pathlib import Path

from fleetops.lab import Lab


def home_with(tmp_path: Path, lab: Lab, config: str = "", known_hosts: bool = True) -> Path:
    """tmp_path/home with `config` as its ~/.ssh/config and, with `known_hosts`, the lab's host
    keys as its ~/.ssh/known_hosts."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    (home / ".ssh" / "config").write_text(config)
    if known_hosts:
        shutil.copy(lab.known_hosts, home / ".ssh" / "known_hosts")
    return home


def logged_since(log: Path, before: int) -> str:
    """What sshd wrote to `log` after its first `before` bytes (its size before the run)."""
    with log.open("rb") as f:
        f.seek(before)
        return f.read().decode(errors="replace")
