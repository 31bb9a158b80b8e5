"""The lab: real OpenSSH sshd nodes on 127.0.0.1, each with its own host key, state directory and
venv (heavy packages shared from the base venv, speculators files per node), and the inventory that
names them.

`Lab` holds the lab's state (.lab/lab.json) and brings nodes up, restores, stops and removes them;
the parts it puts together: sshd.py (a node's sshd config, start, stop), keys.py (ssh keys,
known_hosts), inventory.py (hosts/lab.yaml, .gitignore), packages.py (a node's venv and packages),
tiny_model.py (the extract model), files.py (removing, emptying, mirroring the lab's directories),
pythons.py (a node's interpreter)."""

from __future__ import annotations

import getpass
import json
import os
import signal
from pathlib import Path

from . import gpu, kernel_log, keys, packages, sshd
from .common import (
    REFUSE_LAB,
    LabError,
    Progress,
    base_dir,
    ensure_base,
    free_port,
    port_open,
    refuse_if_asked,
    say,
    site_packages,
)
from .files import emptied, remove, remove_settled
from .inventory import GIT_IGNORED, git_ignore, write_inventory
from .node import Node
from .packages import BASE_PTH
from .pythons import interpreters
from .sshd import SSHD
from .tiny_model import MODEL_PARTS, give_model

# Callers import these from here (tasks.py, scale.py, fleetops.lab); the parts' own modules define
# them.
__all__ = ["BASE_PTH", "GIT_IGNORED", "MODEL_PARTS", "SSHD", "Lab", "Progress"]


class Lab:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.dir = self.root / ".lab"
        self.state_file = self.dir / "lab.json"
        self.client_key = self.dir / "id_ed25519"
        # the CA whose user certificates every node's sshd trusts
        self.user_ca = self.dir / "user_ca"
        self.known_hosts = self.dir / "known_hosts"
        self.hosts_file = self.root / "hosts" / "lab.yaml"
        self.user = getpass.getuser()

    @property
    def _wheels(self) -> Path:
        """The wheels packed from each base venv's files, for the nodes' pip caches (wheels.py)."""
        return self.dir / "wheels"

    # -- state
    def nodes(self) -> list[Node]:
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return []
        return [
            Node(
                n["name"],
                n["port"],
                Path(n["dir"]),
                n.get("interpreter", ""),
                n.get("python_version", ""),
            )
            for n in data.get("nodes", [])
        ]

    def node(self, name: str) -> Node:
        for n in self.nodes():
            if n.name == name:
                return n
        raise LabError(f"no lab node {name!r}")

    def _save(self, nodes: list[Node]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        data = {
            "nodes": [
                {
                    "name": n.name,
                    "port": n.port,
                    "dir": str(n.dir),
                    **(
                        {"interpreter": n.interpreter, "python_version": n.python_version}
                        if n.interpreter
                        else {}
                    ),
                }
                for n in nodes
            ]
        }
        self.state_file.write_text(json.dumps(data, indent=1) + "\n")

    # -- bring up
    def up(
        self, count: int | None = None, progress: Progress = say, pythons: list[str] | None = None
    ) -> list[Node]:
        """Exactly `count` nodes running (None: as many as the lab has, at least one; the lab's
        first ones, built where missing); nodes beyond it are stopped and removed, as restore(count)
        does. `pythons`: the node venvs' Python, one for every node or one per node in order (a
        version such as 3.9, or an interpreter's path): such a node's venv is made from that
        interpreter, without the base venv's packages (no vLLM), and a node built with another
        Python gets its venv made again. Without it, nodes keep the Python they have (new ones: the
        base venv's, with vLLM)."""
        refuse_if_asked(REFUSE_LAB, "a lab", "lab")
        if count is None:  # one node per Python named, else the lab's size
            count = len(pythons) if pythons and len(pythons) > 1 else max(1, len(self.nodes()))
        wanted = interpreters(pythons, count)
        if not Path(SSHD).exists():
            raise LabError(
                "sshd not found: install Debian's openssh-server (apt-get install openssh-server)"
            )
        base = ensure_base(progress)
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.client_key.exists():
            keys.keygen(self.client_key, "fleetops-lab-client")
        if not self.user_ca.exists():
            keys.keygen(self.user_ca, "fleetops-lab-user-ca")
        if os.geteuid() == 0:
            # sshd's privilege-separation directory
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        nodes = self._exactly(count, progress)
        for i, node in enumerate(nodes):
            if wanted and (node.interpreter, node.python_version) != wanted[i]:
                self._repython(node, wanted[i], progress)
            self._ready(node, base, progress)
        self._save(nodes)
        self._write_known_hosts(nodes)
        self._write_inventory(nodes)
        git_ignore(self.root)
        return nodes

    def _exactly(self, count: int, progress: Progress) -> list[Node]:
        """The lab's first `count` nodes, those beyond removed, new ones named (not built yet)."""
        nodes = self.nodes()
        for node in nodes[count:]:
            progress(f"lab: removing node {node.name} (the lab has {count} nodes now)")
            self._stop_jobs(node)
            self.stop_node(node)
            remove_settled(node.dir)
        nodes = nodes[:count]
        for i in range(len(nodes), count):
            name = f"lab{i + 1:02d}"
            nodes.append(Node(name, free_port(), self.dir / "nodes" / name))
        return nodes

    def _repython(self, node: Node, wanted: tuple[str, str], progress: Progress) -> None:
        if node.venv.exists():
            progress(
                f"lab: node {node.name}: a venv of Python {wanted[1]} instead of "
                f"{node.python_version or 'the base venv'}'s"
            )
            remove(node.venv)
        node.interpreter, node.python_version = wanted

    def _ready(self, node: Node, base: Path, progress: Progress) -> None:
        """Built, given its GPU state and model, its sshd running."""
        if not node.python.exists():
            progress(f"lab: building node {node.name}")
            self._build_node(node, base)
        if not (node.dir / "gpu.json").exists():
            self.set_gpu_state(node, "idle")
        if not (node.state_dir / "lab-model").exists():
            give_model(node, base, self.dir, progress)
        if not node.running():
            for attempt in range(3):
                try:
                    self._start_sshd(node)
                    break
                except LabError:
                    if attempt == 2:
                        raise
                    # Its port was taken between picking and binding: pick another, rewrite the
                    # config.
                    node.port = free_port()
                    node.config.write_text(self._sshd_config(node))

    def _build_node(self, node: Node, base: Path) -> None:
        node.dir.mkdir(parents=True, exist_ok=True)
        node.state_dir.mkdir(parents=True, exist_ok=True)
        packages.make_venv(node, base, self._wheels)
        if (
            node.host_key.exists()
            and node.config.exists()
            and (node.dir / "authorized_keys").exists()
        ):  # only its venv was made again
            return
        keys.keygen(node.host_key, f"fleetops-lab-{node.name}")
        (node.dir / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        node.config.write_text(self._sshd_config(node))

    def reset_packages(self, node: Node, base: Path | None = None) -> None:
        """Give the node pristine copies of its own packages (as installed from PyPI), by putting
        back only what differs from the base venv's copy (packages.reset_packages), and their wheels
        in its pip cache."""
        packages.reset_packages(node, base or base_dir(), self._wheels)

    def restore(self, count: int | None = None) -> list[Node]:
        """Every node as `up` left it, by putting files back (nothing is reinstalled or rebuilt): no
        job or GPU holder left, sshd running, its own packages pristine and nothing else in its
        site-packages, a state dir holding only the extract model, no failpoint armed, idle GPUs, an
        empty readable kernel log; known_hosts and the inventory as `up` writes them. Nodes beyond
        `count` are stopped and removed. For a lab shared by one user after another (the test
        suite's): what a user did to a node's files, the next does not see."""
        nodes = self.nodes()
        extra, nodes = (nodes[count:], nodes[:count]) if count is not None else ([], nodes)
        for node in [*nodes, *extra]:
            self._stop_jobs(node)
        for node in extra:
            self.stop_node(node)
            remove_settled(node.dir)
        self._save(nodes)
        base = base_dir()
        base_site = site_packages(base)
        own = packages.own_entries(base_site)
        for node in nodes:
            packages.prune_site(node, base_site, own)
            self.reset_packages(node, base)
            emptied(node.state_dir, 0o755, keep=MODEL_PARTS)
            emptied(node.faults_dir, 0o700)
            self.set_gpu_state(node, "idle")
            kernel_log.set_readable(node, "dmesg")
            kernel_log.clear(node)
            if not node.running():
                self._start_sshd(node)
        self._write_known_hosts(nodes)
        self._write_inventory(nodes)
        return nodes

    def install_package(self, node: Node, requirement: str) -> None:
        """Give one node a different real package version (e.g. vllm==0.11.0), shadowing the shared
        one.

        Installed without its dependencies: enough for version checks and file-level patching, which
        is what such nodes are for (showing how fleetops refuses a node it must not patch)."""
        packages.install_package(node, requirement)

    def node_base(self, node: Node) -> Path:
        """The base venv whose packages the node runs on (its .pth file names that base's
        site-packages)."""
        return packages.node_base(node)

    def use_base(self, node: Node, base: Path) -> None:
        """Put a node on another base venv (lab.install --vllm): its .pth names that base's
        site-packages, and its own packages become that base's pristine copies. Nothing is installed
        into the node: the base holds the packages with their real dependencies."""
        packages.use_base(node, base, self._wheels)

    # -- sshd (sshd.py) and what clients trust and read (keys.py, inventory.py)
    def configure_sshd(
        self, node: Node, users: tuple[str, ...] = (), sftp: str | None = None
    ) -> None:
        """Restart the node's sshd letting these users log in too (a test's non-root login user) and
        with this sftp Subsystem command (a broken one, for a test); no arguments: the config lab.up
        writes."""
        node.config.write_text(sshd.allowing(self._sshd_config(node), self.user, users, sftp))
        self.stop_node(node)
        self.start_node(node)

    def _sshd_config(self, node: Node) -> str:
        ca = self.user_ca.with_suffix(".pub")
        return sshd.config(node, self.user, ca if ca.exists() else None)

    def certify(
        self,
        public_key: Path,
        out: Path,
        identity: str,
        principals: list[str] | None = None,
        validity: str = "-5m:+1h",
    ) -> Path:
        """An OpenSSH user certificate for `public_key`, signed by the lab's CA (which every node
        trusts), for `principals` (default: the lab's user) over `validity` (ssh-keygen -V), written
        to `out`."""
        if not self.user_ca.exists():
            keys.keygen(self.user_ca, "fleetops-lab-user-ca")
        return keys.certify(
            self.user_ca, public_key, out, identity, principals or [self.user], validity
        )

    def _start_sshd(self, node: Node) -> None:
        sshd.start(node)

    def _write_known_hosts(self, nodes: list[Node]) -> None:
        keys.write_known_hosts(self.known_hosts, nodes)

    def _write_inventory(self, nodes: list[Node]) -> None:
        write_inventory(self.hosts_file, self.user, self.client_key, self.known_hosts, nodes)

    # -- simulated GPUs (gpu.py)
    def gpu_state(self, node: Node) -> dict:
        return gpu.gpu_state(node)

    def set_gpu_state(self, node: Node, state: str) -> dict:
        return gpu.set_gpu_state(node, state)

    def _stop_holders(self, node: Node) -> None:
        gpu.stop_holders(node)

    def _stop_jobs(self, node: Node) -> None:
        """Every live job of the node (each tagged process, as `fab stop` does), then its GPU
        holders."""
        from ..agent.jobs import jobs

        for job_id in jobs.live_job_ids(str(node.state_dir)):
            try:
                jobs.job_stop({"state_dir": str(node.state_dir), "job_id": job_id, "grace_s": 5})
            except (jobs.NodeError, OSError) as exc:
                say(f"{node.name}: could not stop job {job_id}: {exc}")
        self._stop_holders(node)

    # -- stop
    def stop_node(self, node: Node, sig: int = signal.SIGTERM, *, masters: bool = True) -> bool:
        """The node gone, as a powered-off one is: its sshd stopped and its ssh master closed (a
        master outlives the listener, and a later run would still reach the node through it).
        masters=False leaves the masters up, for a caller that cuts the node's sessions first (a
        master closed before would end them cleanly: no cut)."""
        stopped = sshd.stop(node, sig)
        if masters:
            self.close_masters(node)
        return stopped

    def start_node(self, node: Node) -> None:
        if not node.running():
            self._start_sshd(node)

    def rekey(self, node: Node) -> str:
        """A reimaged node: a new host key (sshd restarted with it), known_hosts left with the old
        one. Returns the new key's SHA256 fingerprint, which an operator would read on the node's
        console."""
        for old in (node.host_key, node.host_key.with_suffix(".pub")):
            old.unlink(missing_ok=True)
        keys.keygen(node.host_key, f"fleetops-lab-{node.name}")
        self.stop_node(node)
        self._start_sshd(node)
        return keys.fingerprint(node.host_key.with_suffix(".pub"))

    def retrust(self) -> None:
        """known_hosts as `lab.up` writes it: every node's current host key (undoes a `rekey`'s
        refusal)."""
        self._write_known_hosts(self.nodes())

    def close_masters(self, node: Node | None = None) -> list[str]:
        """Close the ssh master connections to the lab's nodes, or to `node` alone (those whose
        record names 127.0.0.1 or localhost and a node's port): a master outlives its node's sshd,
        whose stop ends only the listener. Returns one line per master closed (or stale socket
        removed, or master that would not close)."""
        from ..wire import controldir, masters

        try:
            directory = controldir.control_dir(create=False)
        except controldir.ControlDirError:
            return []  # none made (no master ever ran) or unsafe: the lab started none there
        ports = {node.port} if node is not None else {n.port for n in self.nodes()}
        ours = [
            m
            for m in masters.masters(directory)
            if m.record is not None
            and m.record.port in ports
            and m.record.hostname in ("127.0.0.1", "localhost", "::1")
        ]
        return [
            f"{c.host}: "
            + {
                "closed": f"ssh master closed ({c.detail})",
                "stale": "stale ssh master socket removed",
            }.get(c.outcome, f"not closed: {c.detail}")
            for c in masters.close_all(directory, ours)
        ]

    def down(self, purge: bool = False) -> list[str]:
        # `fab lab.down` has closed (and said) them already; a caller in code has not
        self.close_masters()
        # the nodes' jobs first (every tagged process, as `fab stop` does), then sshd
        for n in self.nodes():
            self._stop_jobs(n)
        stopped = [n.name for n in self.nodes() if self.stop_node(n)]
        # and an sshd of a node the state does not hold yet (lab.up interrupted as it started it)
        sshd.stop_strays(self.dir)
        if purge and self.dir.exists():
            remove_settled(self.dir)
            if self.hosts_file.exists():
                self.hosts_file.unlink()
        return stopped

    def status(self) -> list[dict]:
        rows = []
        for node in self.nodes():
            pid = node.pid()
            rows.append(
                {
                    "name": node.name,
                    "port": node.port,
                    "sshd_pid": pid if node.running() else None,
                    "listening": port_open(node.port),
                    "python": str(node.python),
                    "python_version": node.python_version,
                    "interpreter": node.interpreter,
                    "state_dir": str(node.state_dir),
                    "gpus": self.gpu_state(node)["state"],
                }
            )
        return rows
