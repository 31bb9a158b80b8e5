"""The large lab: hundreds to a thousand lab hosts on one small machine, for measuring fleetops at
fleet size.

    lab = ScaleLab(project)
    hosts = lab.up(1000)        # seconds, not minutes; hosts/scale.yaml names them (group @scale)
    ...
    lab.down()

A host here is what fleetops can tell apart: its own loopback address (127.77.x.y, all of
127.0.0.0/8 is local on Linux), its own venv and its own state directory. What is shared is what a
host never sees: the sshd processes (one per LISTEN_PER_SSHD addresses, OpenSSH's limit of listening
sockets per sshd), one host key and the client key. Each venv is made by hand as `python -m venv`
would make it (pyvenv.cfg and a symlink to the interpreter: no subprocess per host) and holds only
what the playbook's patches and grep checks read: copies of those speculators files (so patching one
host never touches another), the __init__ files on the way to them, and the dist-info of the pinned
packages (their versions are read from the directory names). No vLLM, no torch: `ping`, `run`,
`patch --check` and `verify --kinds grep` work; import checks do not. The heavy base venv
(common.base_dir) is only read.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..agent.core.procfs import pid_alive, read
from .common import REFUSE_LAB, LabError, base_dir, refuse_if_asked, say, settle, site_packages
from .lab import Progress
from .node import HostFiles
from .sshd import SSHD, exited, login_lines

# OpenSSH's MAX_LISTEN_SOCKS: more ListenAddress lines than this and sshd will not start
LISTEN_PER_SSHD = 16
PREFIX = "127.77"  # the hosts' addresses: PREFIX.<i // 250>.<i % 250 + 1>
MAX_HOSTS = 250 * 256
PLAYBOOK = Path(__file__).resolve().parent.parent / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml"


@dataclass
class ScaleHost(HostFiles):
    name: str
    address: str
    port: int
    dir: Path


def address(i: int) -> str:
    return f"{PREFIX}.{i // 250}.{i % 250 + 1}"


def playbook_files(playbook: Path = PLAYBOOK) -> list[str]:
    """The site-packages paths (relative) a host needs for the playbook's patches and grep checks:
    each target module's file and the __init__.py of every package on the way to it."""
    from ..plans.playbook import load_playbook

    book = load_playbook(playbook)
    modules = {p.module for p in book.patches} | {
        c["module"] for c in book.checks if c.get("kind") == "grep"
    }
    out: set[str] = set()
    for module in modules:
        parts = module.split(".")
        out.add("/".join(parts) + ".py")
        out.update("/".join(parts[:i]) + "/__init__.py" for i in range(1, len(parts)))
    return sorted(out)


class ScaleLab:
    def __init__(self, root: Path, name: str = "scale") -> None:
        self.root = Path(root).resolve()
        self.name = name
        self.dir = self.root / f".lab-{name}"
        self.client_key = self.dir / "id_ed25519"
        self.host_key = self.dir / "ssh_host_ed25519_key"
        self.known_hosts = self.dir / "known_hosts"
        self.template = self.dir / "template"
        self.hosts_file = self.root / "hosts" / f"{name}.yaml"
        self.user = getpass.getuser()

    # -- bring up
    def up(
        self, count: int, progress: Progress = say, playbook: Path = PLAYBOOK
    ) -> list[ScaleHost]:
        """`count` hosts answering, each with a fresh venv and an empty state dir (a second `up`
        starts over)."""
        refuse_if_asked(REFUSE_LAB, "a scale lab", "lab")
        if not 1 <= count <= MAX_HOSTS:
            raise LabError(f"a scale lab of {count} hosts: give 1 to {MAX_HOSTS}")
        if not Path(SSHD).exists():
            raise LabError(
                "sshd not found: install Debian's openssh-server (apt-get install openssh-server)"
            )
        started = time.monotonic()
        self.down()
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        for key, comment in ((self.client_key, "client"), (self.host_key, "host")):
            subprocess.run(
                [
                    "ssh-keygen",
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    f"fleetops-{self.name}-{comment}",
                    "-f",
                    str(key),
                ],
                check=True,
            )
        (self.dir / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self._make_template(playbook)
        port = self._port()
        hosts = [
            ScaleHost(
                f"{self.name}{i + 1:04d}",
                address(i),
                port,
                self.dir / "hosts" / f"{self.name}{i + 1:04d}",
            )
            for i in range(count)
        ]
        home, version = self._interpreter()
        for host in hosts:
            self._make_host(host, home, version)
        progress(f"lab: {count} host venvs made in {time.monotonic() - started:.1f} s")
        self._start_sshds(hosts)
        self._write_known_hosts(hosts)
        self._write_inventory(hosts)
        progress(
            f"lab: {count} hosts on {len(self.pids())} sshd processes, up in "
            f"{time.monotonic() - started:.1f} s"
        )
        return hosts

    def _interpreter(self) -> tuple[str, str]:
        """The base venv's interpreter (its `home` and version), which every host venv is made
        from."""
        cfg = dict(
            line.split(" = ", 1)
            for line in (base_dir() / "pyvenv.cfg").read_text().splitlines()
            if " = " in line
        )
        if "home" not in cfg:
            raise LabError(
                f"{base_dir() / 'pyvenv.cfg'} names no home "
                "interpreter: is the lab's base venv built?"
            )
        return cfg["home"], cfg.get("version", "")

    def _make_template(self, playbook: Path) -> None:
        """What each host's site-packages holds, copied once from the base venv (read only)."""
        src = site_packages(base_dir())
        dst = self.template
        for rel in playbook_files(playbook):
            if not (src / rel).is_file():
                raise LabError(
                    f"{src / rel} is missing: the lab's base venv lacks what the playbook reads"
                )
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, dst / rel)
        for info in [*src.glob("speculators-*.dist-info"), *src.glob("vllm-*.dist-info")]:
            (dst / info.name).mkdir()
            for part in ("METADATA", "RECORD"):
                if (info / part).is_file() and not info.name.startswith("vllm-"):
                    shutil.copy2(info / part, dst / info.name / part)
            # its version is all a check reads; RECORD would list 1000s of files
            if info.name.startswith("vllm-"):
                shutil.copy2(info / "METADATA", dst / info.name / "METADATA")

    def _make_host(self, host: ScaleHost, home: str, version: str) -> None:
        bin_dir = host.venv / "bin"
        bin_dir.mkdir(parents=True)
        (host.venv / "pyvenv.cfg").write_text(
            f"home = {home}\ninclude-system-site-packages = false\nversion = {version}\n"
        )
        real = Path(home) / f"python{'.'.join(version.split('.')[:2])}"
        (bin_dir / "python").symlink_to(real if real.exists() else Path(home) / "python3")
        site = host.venv / "lib" / f"python{'.'.join(version.split('.')[:2])}" / "site-packages"
        shutil.copytree(self.template, site)
        host.state_dir.mkdir(parents=True)

    def _port(self) -> int:
        """A port free on the hosts' first address (each sshd start checks the others)."""
        with socket.socket() as s:
            s.bind((address(0), 0))
            return s.getsockname()[1]

    def _config(self, group: int, hosts: list[ScaleHost]) -> str:
        return "\n".join(
            [
                *[f"ListenAddress {h.address}:{h.port}" for h in hosts],
                *login_lines(
                    self.host_key,
                    self.dir / f"sshd-{group}.pid",
                    self.dir / "authorized_keys",
                    self.user,
                ),
                "Subsystem sftp internal-sftp",
                # no rc files per exec (see sshd.py)
                "SetEnv PATH=/usr/local/bin:/usr/bin:/bin SHLVL=1",
                "LogLevel ERROR",
                "",
            ]
        )

    def _start_sshds(self, hosts: list[ScaleHost]) -> None:
        groups = [hosts[i : i + LISTEN_PER_SSHD] for i in range(0, len(hosts), LISTEN_PER_SSHD)]
        for g, members in enumerate(groups):
            config = self.dir / f"sshd_config-{g}"
            config.write_text(self._config(g, members))
            proc = subprocess.run(
                [SSHD, "-f", str(config), "-E", str(self.dir / f"sshd-{g}.log")],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise LabError(
                    f"sshd for {members[0].name}..{members[-1].name} did not start: "
                    f"{proc.stderr.strip()} (log: {self.dir / f'sshd-{g}.log'})"
                )
        deadline = time.monotonic() + 30
        for g, members in enumerate(groups):
            while not (self._pid(g) and _answers(members[0].address, members[0].port)):
                if time.monotonic() > deadline:
                    raise LabError(
                        f"sshd for {members[0].name} did not come up on {members[0].address}:"
                        f"{members[0].port}; see {self.dir / f'sshd-{g}.log'}"
                    )
                time.sleep(0.02)

    def _write_known_hosts(self, hosts: list[ScaleHost]) -> None:
        keytype, key = self.host_key.with_suffix(".pub").read_text().split()[:2]
        self.known_hosts.write_text(
            "".join(f"[{h.address}]:{h.port} {keytype} {key}\n" for h in hosts)
        )

    def _write_inventory(self, hosts: list[ScaleHost]) -> None:
        self.hosts_file.parent.mkdir(parents=True, exist_ok=True)
        out = [
            (
                f"# Written by fleetops.lab.scale: {len(hosts)} lab hosts on loopback addresses "
                f"(group @{self.name})."
            ),
            "defaults:",
            f"  user: {self.user}",
            f"  identity_file: {self.client_key}",
            f"  known_hosts: {self.known_hosts}",
            "  connect_timeout: 20",
            "hosts:",
        ]
        for h in hosts:
            out += [
                f"  {h.name}:",
                f"    address: {h.address}",
                f"    port: {h.port}",
                f"    python: {h.python}",
                f"    state_dir: {h.state_dir}",
                f"    groups: [{self.name}]",
            ]
        self.hosts_file.write_text("\n".join(out) + "\n")

    # -- state and stop
    def _pid(self, group: int) -> int | None:
        try:
            return int((self.dir / f"sshd-{group}.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def pids(self) -> list[int]:
        """The listening sshd processes of this lab (only ours: the command line names our
        config)."""
        out = []
        for pid_file in sorted(self.dir.glob("sshd-*.pid")) if self.dir.exists() else []:
            group = pid_file.stem.split("-", 1)[1]
            try:
                pid = int(pid_file.read_text().strip())
            except (OSError, ValueError):
                continue
            cmdline = read(pid, "cmdline") if pid_alive(pid) else None
            if cmdline is not None and str(self.dir / f"sshd_config-{group}").encode() in cmdline:
                out.append(pid)
        return out

    def down(self, purge: bool = False) -> int:
        """Stop this lab's sshd listeners (their sessions end with their clients); `purge`: its
        files too."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        # A listener still there after the grace (a loaded machine) is killed by pid, not left
        # behind.
        settle(lambda: [p for p in self.pids() if p in pids and not exited(p)], grace=5, timeout=10)
        if purge:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.hosts_file.unlink(missing_ok=True)
        return len(pids)


def _answers(addr: str, port: int) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=0.5):
            return True
    except OSError:
        return False
