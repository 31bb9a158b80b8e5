"""`fleet init [DIR]`: a new project. The tasks come from the installed package; a project holds
only what is the team's: its inventory (hosts/), its playbooks (playbooks/, starting from the
shipped one as a worked example), fabric.yaml (which playbook and inventory, and the executor that
Fabric's `fab` needs) and a one-line fabfile.py for those who type `fab`. No file that exists is
replaced unless asked (`force`)."""

from __future__ import annotations

import getpass
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from .locks import CLIENT_LOCK, client_lock

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

SHIPPED_PLAYBOOK = "speculators-0.3.0-vllm-0.16"

FABFILE = '''"""fleetops' tasks, for Fabric's `fab` (`fleet` needs no fabfile: it brings them \
along)."""

from fleetops.fab.tasks import ns  # noqa: F401
'''

FABRIC_YAML = """# Read by `fab` and `fleet` in this folder and the folders below it.
tasks:
  # Each host runs its chain of tasks on one connection, hosts in parallel, one recap (Fabric's \
`fab` needs this
  # line; `fleet` has it built in).
  executor_class: fleetops.fab.executor.FleetExecutor
fleetops:
  playbook: playbooks/    # the default for -p: the set, each host gets the playbook its versions \
fit
  inventory: hosts        # every *.yaml in it; --inventory PATH for another
"""

# Documentation names only (RFC 2606's .example): a project starts with no address anyone could
# reach.
EXAMPLE_INVENTORY = """\
# An example of a real fleet's inventory, as documentation: `example: true` makes fleetops refuse to
# connect to these hosts. For your fleet, copy it to hosts/fleet.yaml, drop that line and put in \
your nodes.
# The local lab needs none of this: `fleet lab.up` writes hosts/lab.yaml (sshd nodes on loopback).
example: true
defaults:
  user: root
  identity_file: ~/.ssh/id_ed25519
  known_hosts: ~/.ssh/known_hosts       # checked strictly: `fab -H gpu01 trust --fingerprint \
SHA256:...` adds a key
  python: /root/ml-env/bin/python       # the target venv's interpreter: patches and checks run \
under it
  state_dir: /root/.fleetops            # on the node: backups, locks, the agent, job directories
hosts:
  gpu01:
    address: gpu01.fleet.example
    port: 22
    gpus: 8                             # expected GPU count, checked by `gpu`
    groups: [gpus, h200]
  # gpu02:
  #   address: gpu02.fleet.example
  #   port: 22
  #   jump: bastion                     # optional jump host (an inventory name or user@host:port)
  #   gpus: 8
  #   groups: [gpus, h200]
  # bastion:
  #   address: bastion.fleet.example
"""

GITIGNORE = """# What fleetops and its lab write into a project; the team's files are everything \
else.
.lab/
hosts/lab.yaml
.fleetops/
fetched/
fleet.ssh_config
__pycache__/
"""


# node_exporter's textfile collector folder on Debian and Ubuntu (prometheus-node-exporter's
# default).
TEXTFILE = "/var/lib/prometheus/node-exporter/fleetops.prom"

VERIFY_SERVICE = """\
# Verification on a schedule, for Prometheus (docs/monitoring.md): `patch --check` (each file's \
state) then
# `verify` (every check) on the hosts of @gpus, results written whole to node_exporter's textfile \
collector.
# Install: sudo cp monitoring/fleetops-verify.* /etc/systemd/system/ && sudo systemctl enable --now
# fleetops-verify.timer. {user} must be able to write the .prom file's folder and reach the hosts \
(its SSH keys).
[Unit]
Description=fleetops: verify the fleet's patches and checks, for Prometheus
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
User={user}
WorkingDirectory={project}
ExecStart={fleet} -H @gpus patch --check verify --metrics {textfile}
"""

VERIFY_TIMER = """\
# Runs fleetops-verify.service every 15 minutes (the shipped alert rules assume it: \
monitoring/fleetops.rules.yml).
[Unit]
Description=fleetops: verify the fleet every 15 minutes

[Timer]
OnBootSec=5min
OnUnitActiveSec=15min
RandomizedDelaySec=60

[Install]
WantedBy=timers.target
"""


def _fleet_program() -> str:
    """The `fleet` to run from a unit file: the one on PATH, else the one beside this
    interpreter."""
    found = shutil.which("fleet")
    return str(Path(found).absolute()) if found else str(Path(sys.executable).parent / "fleet")


class InitRefused(Exception):
    """Files that exist and would be replaced; nothing was written."""

    def __init__(self, directory: Path, existing: list[str]) -> None:
        super().__init__(f"{directory}: {', '.join(existing)} already exist")
        self.directory = directory
        self.existing = existing


@dataclass
class Made:
    directory: Path
    written: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)


def shipped_playbooks() -> Traversable:
    """The playbooks the package ships (package data): the checkout's playbooks/ is a link to
    them."""
    return files("fleetops").joinpath("playbooks")


def project_files(directory: Path | None = None) -> dict[str, bytes]:
    """Every file a new project gets, by its path in the project (`directory`: where it will be,
    named in the verification timer's unit)."""
    out = {
        "fabfile.py": FABFILE.encode(),
        "fabric.yaml": FABRIC_YAML.encode(),
        "hosts/example.yaml": EXAMPLE_INVENTORY.encode(),
        ".gitignore": GITIGNORE.encode(),
    }
    for rel, item in _walk(shipped_playbooks(), "playbooks"):
        out[rel] = item.read_bytes()
    out["monitoring/fleetops.rules.yml"] = (
        files("fleetops").joinpath("monitoring", "fleetops.rules.yml").read_bytes()
    )
    out["monitoring/fleetops.dashboard.json"] = (
        files("fleetops").joinpath("monitoring", "fleetops.dashboard.json").read_bytes()
    )
    where = (directory or Path.cwd()).absolute()
    out["monitoring/fleetops-verify.service"] = VERIFY_SERVICE.format(
        project=where, fleet=_fleet_program(), user=getpass.getuser(), textfile=TEXTFILE
    ).encode()
    out["monitoring/fleetops-verify.timer"] = VERIFY_TIMER.encode()
    # the versions fleetops was tested with, for `pip install --require-hashes -r requirements.lock`
    out[CLIENT_LOCK] = client_lock().encode()
    return out


def _walk(folder: Traversable, prefix: str) -> Iterator[tuple[str, Traversable]]:
    for item in sorted(folder.iterdir(), key=lambda i: i.name):
        if item.name == "__pycache__":  # pip compiles the probe script when it installs the wheel
            continue
        if item.is_dir():
            yield from _walk(item, f"{prefix}/{item.name}")
        else:
            yield f"{prefix}/{item.name}", item


def make_project(directory: Path, force: bool = False) -> Made:
    """Write a new project into `directory` (made if missing). Refuses, writing nothing, when any of
    its files exists, unless `force` (then those are replaced, and the rest of the folder is left
    alone)."""
    directory = directory.expanduser()
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"{directory} is a file, not a folder")
    content = project_files(directory)
    existing = [rel for rel in content if os.path.lexists(directory / rel)]
    if existing and not force:
        raise InitRefused(directory, existing)
    made = Made(directory.resolve() if directory.exists() else directory.absolute())
    for rel, data in content.items():
        target = directory / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        _write(target, data)
        (made.replaced if rel in existing else made.written).append(rel)
    return made


def _write(target: Path, data: bytes) -> None:
    """Whole or not at all: a temporary file beside the target, then renamed over it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)
        if target.is_symlink():  # --force replaces a link itself, never the file it points to
            target.unlink()
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
