"""One lab node: where its files are (venv, state directory, sshd config, keys) and whether its sshd
runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..agent.core.procfs import pid_alive, read
from .common import site_packages


class HostFiles:
    """Where a lab host's venv, its interpreter and its state directory are, under its own `dir`
    (shared by a lab node and a scale-lab host)."""

    dir: Path

    @property
    def venv(self) -> Path:
        return self.dir / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def state_dir(self) -> Path:
        return self.dir / "state"


@dataclass
class Node(HostFiles):
    name: str
    port: int
    dir: Path
    # The interpreter its venv was made from, and that interpreter's X.Y; "" for the base venv's
    # (the client's Python), whose vLLM and other packages the node then reads through a .pth. A
    # node of another Python has no vLLM: only its own packages (speculators).
    interpreter: str = ""
    python_version: str = ""

    @property
    def faults_dir(self) -> Path:
        """Where tests arm failpoints: the node's sshd hands the agent this path
        (FLEETOPS_FAILPOINTS_DIR), and it is outside the state dir, so nothing an attacker plants
        there can arm one."""
        return self.dir / "faults"

    @property
    def config(self) -> Path:
        return self.dir / "sshd_config"

    @property
    def pid_file(self) -> Path:
        return self.dir / "sshd.pid"

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"

    def pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def ours(self, pid: int) -> bool:
        """Only stop an sshd we started: its command line names this node's config."""
        cmdline = read(pid, "cmdline")
        # sshd rewrites its title ("sshd: /usr/sbin/sshd -f CONFIG ... [listener]"), so match the
        # bytes.
        return cmdline is not None and str(self.config).encode() in cmdline

    def running(self) -> bool:
        pid = self.pid()
        return pid is not None and pid_alive(pid) and self.ours(pid)

    def module_file(self, module: str) -> Path:
        return site_packages(self.venv).joinpath(*module.split(".")).with_suffix(".py")
