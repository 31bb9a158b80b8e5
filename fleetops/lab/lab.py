"""The lab: real OpenSSH sshd nodes on 127.0.0.1, each with its own host key, state directory and venv
(heavy packages shared from the base venv, speculators files per node), and the inventory that names them."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from remote_scripts.core.nodeio import FAILPOINTS_ENV
from remote_scripts.core.procfs import pid_alive, stat_fields

from . import gpu, kernel_log
from .common import (
    OWN_PACKAGES,
    REFUSE_LAB,
    LabError,
    base_dir,
    ensure_base,
    free_port,
    port_open,
    refuse_if_asked,
    say,
    site_packages,
)
from .node import Node
from .pythons import python_for
from .wheels import PIP_CACHE, give_wheels

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
BASE_PTH = "_fleetops_lab_base.pth"  # a node venv over the base venv: the base's site-packages on its path
Progress = Callable[[str], None]
MODEL_PARTS = ("lab-model", "lab-data")  # what model.py makes, copied into each node's state dir
BASE_PTH = "_fleetops_lab_base.pth"  # in a node's site-packages: the base venv's site-packages it runs on


def _interpreters(pythons: list[str] | None, count: int) -> list[tuple[str, str]]:
    """(interpreter, its X.Y) for each of `count` nodes: one Python for all, or one per node; [] for none."""
    if not pythons:
        return []
    if len(pythons) not in (1, count):
        raise LabError(f"{len(pythons)} Pythons for {count} nodes: give one for every node, or one per node "
                       f"(--nodes {len(pythons)})")
    found: dict[str, tuple[str, str]] = {}
    for spec in dict.fromkeys(pythons):
        python = python_for(spec)
        proc = subprocess.run([str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise LabError(f"{python} (for Python {spec}) did not run: {proc.stderr.strip()[-500:]}")
        found[spec] = (str(python), proc.stdout.strip())
    return [found[pythons[0] if len(pythons) == 1 else pythons[i]] for i in range(count)]


def _exited(pid: int) -> bool:
    """Gone, or a zombie: sshd daemonizes, so its exit is reaped by init, which may take a second or more, while
    the process itself (its port, its files) is already gone."""
    fields = stat_fields(pid)
    return not pid_alive(pid) or fields is None or fields[0] in ("Z", "X")


def _model_cache(base: Path) -> Path:
    script = Path(__file__).with_name("model.py").read_bytes()
    return base / "fleetops-lab-models" / hashlib.sha256(script).hexdigest()[:16]


def _make_model(base: Path, out: Path) -> str | None:
    """model.py run by the base venv's python into `out`; its complaint when that venv has no ML stack."""
    proc = subprocess.run([str(base / "bin" / "python"), str(Path(__file__).with_name("model.py")), str(out)],
                          capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode == 3:  # the node venv has no torch/transformers (a packages-only lab)
        return proc.stderr or "no torch/transformers"
    if proc.returncode != 0:
        raise LabError(f"making the lab's tiny model failed: {proc.stderr[-1500:]}")
    return None


def _made_model(base: Path) -> Path | None:
    """The tiny model beside the base venv, made on first use (several labs at once: each makes its own copy
    and renames it in place, the first rename wins). None where that directory cannot be written."""
    done = _model_cache(base)
    if (done / "lab-data" / "prompts.jsonl").exists():
        return done
    try:
        done.parent.mkdir(exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=done.name + ".tmp-", dir=done.parent))
    except OSError:
        return None
    try:
        if _make_model(base, tmp) is not None:
            return None
        try:
            tmp.rename(done)
        except OSError:  # another lab was quicker: its copy is as good
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return done if (done / "lab-data" / "prompts.jsonl").exists() else None


def _remove(path: Path) -> None:
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


# What the lab and fleetops write into a project (the lab's keys among them): kept out of the project's git.
GIT_IGNORED = (".lab/", "hosts/lab.yaml", ".fleetops/", "fetched/", "fleet.ssh_config")


def _git_ignore(root: Path) -> None:
    """A project that is a git work tree gets the lines of GIT_IGNORED its .gitignore lacks (nothing else is
    touched; a project outside git gets no file)."""
    if not (root / ".git").exists():
        return
    path = root / ".gitignore"
    text = path.read_text() if path.exists() else ""
    missing = [p for p in GIT_IGNORED if p not in text.splitlines()]
    if missing:
        lead = "" if not text or text.endswith("\n") else "\n"
        path.write_text(text + lead + "# written by fab lab.up: the lab's files and what fleetops writes here\n"
                        + "".join(f"{p}\n" for p in missing))


def _remove_settled(path: Path) -> None:
    """rmtree, once a stopped node's last sshd process is done with it: a connection's sshd process outlives
    the listener by a moment and may still create its log (it re-executes sshd, which opens `-E LOG` again)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            shutil.rmtree(path)
            return
        except OSError:
            if not path.exists():
                return
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _emptied(path: Path, mode: int, keep: tuple[str, ...] = ()) -> None:
    """`path` a directory of ours with that mode, holding only `keep`."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, os.getuid(), os.getgid())
    path.chmod(mode)
    for entry in path.iterdir():
        if entry.name not in keep:
            _remove(entry)


def _same_file(src: os.DirEntry, dst: Path) -> bool:
    try:
        have = dst.lstat()
    except FileNotFoundError:
        return False
    want = src.stat(follow_symlinks=False)
    if (not stat.S_ISREG(have.st_mode) or have.st_mode != want.st_mode or have.st_size != want.st_size
            or (have.st_uid, have.st_gid) != (os.getuid(), os.getgid())):
        return False
    return Path(src.path).read_bytes() == dst.read_bytes()


def _mirror(src: Path, dst: Path) -> None:
    """`dst` made a copy of the directory `src` (bytecode left out), rewriting only the files that differ."""
    if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
        dst.unlink()
    dst.mkdir(exist_ok=True)
    wanted = {e.name: e for e in os.scandir(src) if e.name != "__pycache__"}
    for entry in os.scandir(dst):
        if entry.name not in wanted:
            _remove(Path(entry.path))
    for name, entry in wanted.items():
        target = dst / name
        if entry.is_dir(follow_symlinks=False):
            _mirror(Path(entry.path), target)
        elif not _same_file(entry, target):
            _remove(target)
            shutil.copy2(entry.path, target, follow_symlinks=False)
    mode = stat.S_IMODE(src.stat().st_mode)
    info = dst.stat()
    if os.geteuid() == 0 and (info.st_uid, info.st_gid) != (os.getuid(), os.getgid()):
        os.chown(dst, os.getuid(), os.getgid())
    if stat.S_IMODE(info.st_mode) != mode:
        dst.chmod(mode)


class Lab:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.dir = self.root / ".lab"
        self.state_file = self.dir / "lab.json"
        self.client_key = self.dir / "id_ed25519"
        self.known_hosts = self.dir / "known_hosts"
        self.hosts_file = self.root / "hosts" / "lab.yaml"
        self.user = getpass.getuser()

    # -- state
    def nodes(self) -> list[Node]:
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return []
        return [Node(n["name"], n["port"], Path(n["dir"]), n.get("interpreter", ""), n.get("python_version", ""))
                for n in data.get("nodes", [])]

    def node(self, name: str) -> Node:
        for n in self.nodes():
            if n.name == name:
                return n
        raise LabError(f"no lab node {name!r}")

    def _save(self, nodes: list[Node]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        data = {"nodes": [{"name": n.name, "port": n.port, "dir": str(n.dir),
                           **({"interpreter": n.interpreter, "python_version": n.python_version}
                              if n.interpreter else {})} for n in nodes]}
        self.state_file.write_text(json.dumps(data, indent=1) + "\n")

    # -- bring up
    def up(self, count: int | None = None, progress: Progress = say, pythons: list[str] | None = None) -> list[Node]:
        """Exactly `count` nodes running (None: as many as the lab has, at least one; the lab's first ones, built
        where missing); nodes beyond it are stopped and removed, as restore(count) does. `pythons`: the node
        venvs' Python, one for every node or one per node in order (a version such as 3.9, or an interpreter's
        path): such a node's venv is made from that interpreter, without the base venv's packages (no vLLM), and
        a node built with another Python gets its venv made again. Without it, nodes keep the Python they have
        (new ones: the base venv's, with vLLM)."""
        refuse_if_asked(REFUSE_LAB, "a lab", "lab")
        if count is None:  # one node per Python named, else the lab's size
            count = len(pythons) if pythons and len(pythons) > 1 else max(1, len(self.nodes()))
        wanted = _interpreters(pythons, count)
        if not Path(SSHD).exists():
            raise LabError("sshd not found: install Debian's openssh-server (apt-get install openssh-server)")
        base = ensure_base(progress)
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.client_key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fleetops-lab-client",
                            "-f", str(self.client_key)], check=True)
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        nodes = self._exactly(count, progress)
        for i, node in enumerate(nodes):
            if wanted and (node.interpreter, node.python_version) != wanted[i]:
                self._repython(node, wanted[i], progress)
            self._ready(node, base, progress)
        self._save(nodes)
        self._write_known_hosts(nodes)
        self._write_inventory(nodes)
        _git_ignore(self.root)
        return nodes

    def _exactly(self, count: int, progress: Progress) -> list[Node]:
        """The lab's first `count` nodes, those beyond removed, new ones named (not built yet)."""
        nodes = self.nodes()
        for node in nodes[count:]:
            progress(f"lab: removing node {node.name} (the lab has {count} nodes now)")
            self._stop_jobs(node)
            self.stop_node(node)
            _remove_settled(node.dir)
        nodes = nodes[:count]
        for i in range(len(nodes), count):
            name = f"lab{i + 1:02d}"
            nodes.append(Node(name, free_port(), self.dir / "nodes" / name))
        return nodes

    def _repython(self, node: Node, wanted: tuple[str, str], progress: Progress) -> None:
        if node.venv.exists():
            progress(f"lab: node {node.name}: a venv of Python {wanted[1]} instead of "
                     f"{node.python_version or 'the base venv'}'s")
            _remove(node.venv)
        node.interpreter, node.python_version = wanted

    def _ready(self, node: Node, base: Path, progress: Progress) -> None:
        """Built, given its GPU state and model, its sshd running."""
        if not node.python.exists():
            progress(f"lab: building node {node.name}")
            self._build_node(node, base)
        if not (node.dir / "gpu.json").exists():
            self.set_gpu_state(node, "idle")
        if not (node.state_dir / "lab-model").exists():
            self._give_model(node, base, progress)
        if not node.running():
            for attempt in range(3):
                try:
                    self._start_sshd(node)
                    break
                except LabError:
                    if attempt == 2:
                        raise
                    # Its port was taken between picking and binding: pick another, rewrite the config.
                    node.port = free_port()
                    node.config.write_text(self._sshd_config(node))

    def _build_node(self, node: Node, base: Path) -> None:
        node.dir.mkdir(parents=True, exist_ok=True)
        node.state_dir.mkdir(parents=True, exist_ok=True)
        self._make_venv(node, base)
        if (node.host_key.exists() and node.config.exists()
                and (node.dir / "authorized_keys").exists()):  # only its venv was made again
            return
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"fleetops-lab-{node.name}",
                        "-f", str(node.host_key)], check=True)
        (node.dir / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        node.config.write_text(self._sshd_config(node))

    def _make_venv(self, node: Node, base: Path) -> None:
        """The node's venv: over the base venv (its packages after the node's own on sys.path, through a .pth),
        or, for a node of another Python, from that interpreter with only the node's own packages. Those are
        the base venv's files as pip installed them from PyPI (speculators is pure Python), copied: a few
        MB and no index; speculators 0.3.0 declares Requires-Python >= 3.10, which a 3.9 node does not enforce:
        what runs there is the agent, which reads, patches and compiles the files."""
        python = node.interpreter or str(base / "bin" / "python")
        subprocess.run([python, "-m", "venv", "--without-pip", str(node.venv)], check=True)
        if not node.interpreter:
            (site_packages(node.venv) / BASE_PTH).write_text(str(site_packages(base)) + "\n")
        self.reset_packages(node, base)

    def _give_model(self, node: Node, base: Path, progress: Progress = say) -> None:
        """The tiny model and dataset the lab's extract job runs on, copied to each node. Made once per base
        venv and model.py (kept beside the base venv: making it imports torch, seconds of CPU), or once per
        lab where the base venv is not writable."""
        if (self.dir / "no-tiny-model").exists():
            return
        made = _made_model(base)
        if made is None:
            made = self.dir / "tiny"
            if not (made / "lab-data" / "prompts.jsonl").exists():
                err = _make_model(base, made)
                if err is not None:
                    (self.dir / "no-tiny-model").write_text(err)
                    progress("lab: no tiny model for `extract` (the node venv has no torch/transformers)")
                    return
        node.state_dir.mkdir(parents=True, exist_ok=True)
        for part in MODEL_PARTS:
            shutil.copytree(made / part, node.state_dir / part, dirs_exist_ok=True)

    def reset_packages(self, node: Node, base: Path | None = None) -> None:
        """Give the node pristine copies of its own packages (as installed from PyPI), by putting back only what
        differs from the base venv's copy: a file whose bytes, mode or owner changed is copied again, one the
        base lacks (bytecode, a backup, another version's files) is removed, an unchanged one is left alone."""
        base = base or base_dir()
        src, dst = site_packages(base), site_packages(node.venv)
        for package in OWN_PACKAGES:
            wanted = [src / package, *src.glob(f"{package}-*.dist-info")]
            for old in [dst / package, *dst.glob(f"{package}-*.dist-info")]:
                if old.name not in {w.name for w in wanted}:
                    _remove(old)
            for entry in wanted:
                _mirror(entry, dst / entry.name)
        # The wheels a node installed from an index would have in its pip cache: capture proves pristine bytes
        # from them, with no index (wheels.py).
        give_wheels(src, OWN_PACKAGES, self.dir / "wheels" / base.name, node.dir / PIP_CACHE)

    def restore(self, count: int | None = None) -> list[Node]:
        """Every node as `up` left it, by putting files back (nothing is reinstalled or rebuilt): no job or GPU
        holder left, sshd running, its own packages pristine and nothing else in its site-packages, a state dir
        holding only the extract model, no failpoint armed, idle GPUs, an empty readable kernel log; known_hosts
        and the inventory as `up` writes them. Nodes beyond `count` are stopped and removed. For a lab shared by
        one user after another (the test suite's): what a user did to a node's files, the next does not see."""
        nodes = self.nodes()
        extra, nodes = (nodes[count:], nodes[:count]) if count is not None else ([], nodes)
        for node in [*nodes, *extra]:
            self._stop_jobs(node)
        for node in extra:
            self.stop_node(node)
            _remove_settled(node.dir)
        self._save(nodes)
        base = base_dir()
        base_site = site_packages(base)
        pth = BASE_PTH
        own = {pth} | {e.name for p in OWN_PACKAGES for e in [base_site / p, *base_site.glob(f"{p}-*.dist-info")]}
        for node in nodes:
            site = site_packages(node.venv)
            for entry in site.iterdir():
                if entry.name not in own:  # another version installed beside them, a lock, bytecode
                    _remove(entry)
            if node.interpreter:  # a node of another Python: the base venv's packages are not for it
                _remove(site / pth)
            elif not (site / pth).is_file() or (site / pth).read_text() != f"{base_site}\n":
                _remove(site / pth)
                (site / pth).write_text(f"{base_site}\n")
            self.reset_packages(node, base)
            _emptied(node.state_dir, 0o755, keep=MODEL_PARTS)
            _emptied(node.faults_dir, 0o700)
            self.set_gpu_state(node, "idle")
            kernel_log.set_readable(node, "dmesg")
            kernel_log.clear(node)
            if not node.running():
                self._start_sshd(node)
        self._write_known_hosts(nodes)
        self._write_inventory(nodes)
        return nodes

    def install_package(self, node: Node, requirement: str) -> None:
        """Give one node a different real package version (e.g. vllm==0.11.0), shadowing the shared one.

        Installed without its dependencies: enough for version checks and file-level patching, which is
        what such nodes are for (showing how fleetops refuses a node it must not patch)."""
        base = base_dir()
        site = site_packages(node.venv)
        name = requirement.split("==")[0].strip().replace("-", "_")
        for old in [site / name, *site.glob(f"{name}-*.dist-info")]:
            if old.exists():  # pip --target leaves an older dist-info behind, and metadata would read it
                shutil.rmtree(old)
        # A node of another Python gets the wheels for its own version (pip --python-version, wheels only)
        other = ["--python-version", node.python_version, "--only-binary=:all:"] if node.interpreter else []
        subprocess.run([str(base / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-deps", "--upgrade", *other, "--target", str(site_packages(node.venv)), requirement],
                       check=True)

    def node_base(self, node: Node) -> Path:
        """The base venv whose packages the node runs on (its .pth file names that base's site-packages)."""
        try:
            site = Path((site_packages(node.venv) / BASE_PTH).read_text().strip())
        except OSError:
            return base_dir()
        return site.parents[2]  # <base>/lib/pythonX.Y/site-packages

    def use_base(self, node: Node, base: Path) -> None:
        """Put a node on another base venv (lab.install --vllm): its .pth names that base's site-packages, and
        its own packages become that base's pristine copies. Nothing is installed into the node: the base holds
        the packages with their real dependencies."""
        site = site_packages(node.venv)
        for entry in site.iterdir():  # what lab.install --package left beside its own packages shadows the base
            if entry.name != BASE_PTH and not any(entry.name == p or entry.name.startswith(f"{p}-")
                                                  for p in OWN_PACKAGES):
                _remove(entry)
        tmp = site / f".{BASE_PTH}.tmp"
        tmp.write_text(f"{site_packages(base)}\n")
        os.replace(tmp, site / BASE_PTH)
        self.reset_packages(node, base)

    def configure_sshd(self, node: Node, users: tuple[str, ...] = (), sftp: str | None = None) -> None:
        """Restart the node's sshd letting these users log in too (a test's non-root login user) and with this
        sftp Subsystem command (a broken one, for a test); no arguments: the config lab.up writes."""
        text = self._sshd_config(node)
        if users and sftp is None:  # sftp-server's log redirection is a file of the lab user's: internal-sftp
            sftp = "internal-sftp"
        if users:
            text = text.replace(f"AllowUsers {self.user}\n", f"AllowUsers {' '.join((self.user, *users))}\n")
        if sftp is not None:
            text = "\n".join(f"Subsystem sftp {sftp}" if line.startswith("Subsystem sftp ") else line
                              for line in text.split("\n"))
        node.config.write_text(text)
        self.stop_node(node)
        self.start_node(node)

    def _sshd_config(self, node: Node) -> str:
        # sftp (how the agent is uploaded) through OpenSSH's external sftp-server at log level INFO: it records
        # every file operation (open, close with bytes written, rename) in <node>/sftp.log, so tests count
        # uploads from the node's own record. internal-sftp logs only to syslog, which the lab has not. The
        # subsystem command runs through the user's shell, hence the redirection; a path that would need
        # quoting, or no sftp-server binary, keeps internal-sftp (uploads work, they are just not logged).
        sftp_log = node.dir / "sftp.log"
        server = next((p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server",
                                   "/usr/libexec/sftp-server") if os.access(p, os.X_OK)), None)
        plain = all(ch.isalnum() or ch in "/._-+" for ch in str(sftp_log))
        sftp = f"{server} -e -l INFO 2>>{sftp_log}" if server and plain else "internal-sftp"
        # One complete config per node: -o overrides were not reliable here.
        return "\n".join([
            f"Port {node.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {node.host_key}",
            f"PidFile {node.pid_file}",
            f"AuthorizedKeysFile {node.dir / 'authorized_keys'}",
            f"AllowUsers {self.user}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",
            "MaxStartups 1000:30:2000",
            "MaxSessions 100",
            "PrintMotd no",
            "ClientAliveInterval 15",
            f"Subsystem sftp {sftp}",
            # SHLVL=1 keeps bash from sourcing ~/.bashrc for every exec (bash does for sshd-started shells at
            # level 1); a developer's rc file (pyenv init, ...) would otherwise cost ~90 ms of CPU per exec.
            # FLEETOPS_FAILPOINTS_DIR: the only way failpoints are armed (tests write failpoints.json there).
            # PIP_CACHE_DIR: the node's own pip cache, holding the wheels of its packages (wheels.py).
            f"SetEnv PATH={node.dir / 'bin'}:/usr/local/bin:/usr/bin:/bin SHLVL=1 {FAILPOINTS_ENV}={node.faults_dir} "
            f"PIP_CACHE_DIR={node.dir / PIP_CACHE}",
            "LogLevel VERBOSE",
            "",
        ])

    def _start_sshd(self, node: Node) -> None:
        (node.dir / "bin").mkdir(exist_ok=True)
        node.faults_dir.mkdir(mode=0o700, exist_ok=True)
        if node.pid_file.exists():
            node.pid_file.unlink()
        proc = subprocess.run([SSHD, "-f", str(node.config), "-E", str(node.dir / "sshd.log")],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise LabError(f"sshd for {node.name} failed to start: {proc.stderr.strip()} "
                           f"(log: {node.dir / 'sshd.log'})")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if node.pid() and port_open(node.port):
                return
            time.sleep(0.05)
        raise LabError(f"sshd for {node.name} did not come up on port {node.port}; see {node.dir / 'sshd.log'}")

    def _write_known_hosts(self, nodes: list[Node]) -> None:
        lines = []
        for node in nodes:
            keytype, key = node.host_key.with_suffix(".pub").read_text().split()[:2]
            lines.append(f"[127.0.0.1]:{node.port} {keytype} {key}")
        self.known_hosts.write_text("\n".join(lines) + "\n")

    def _write_inventory(self, nodes: list[Node]) -> None:
        self.hosts_file.parent.mkdir(parents=True, exist_ok=True)
        out = ["# Written by `fab lab.up`: the local lab (real sshd on 127.0.0.1). Regenerated on every lab.up.",
               "defaults:", "  address: 127.0.0.1", f"  user: {self.user}",
               f"  identity_file: {self.client_key}", f"  known_hosts: {self.known_hosts}",
               "  lab: true", "  connect_timeout: 5", "hosts:"]
        for node in nodes:
            out += [f"  {node.name}:", f"    port: {node.port}", f"    python: {node.python}",
                    f"    state_dir: {node.state_dir}", f"    gpus: {gpu.SIMULATED_GPUS}", "    groups: [lab]"]
        self.hosts_file.write_text("\n".join(out) + "\n")

    # -- simulated GPUs (gpu.py)
    def gpu_state(self, node: Node) -> dict:
        return gpu.gpu_state(node)

    def set_gpu_state(self, node: Node, state: str) -> dict:
        return gpu.set_gpu_state(node, state)

    def _stop_holders(self, node: Node) -> None:
        gpu.stop_holders(node)

    def _stop_jobs(self, node: Node) -> None:
        """Every live job of the node (each tagged process, as `fab stop` does), then its GPU holders."""
        from remote_scripts.jobs import jobs

        for job_id in jobs.live_job_ids(str(node.state_dir)):
            try:
                jobs.job_stop({"state_dir": str(node.state_dir), "job_id": job_id, "grace_s": 5})
            except (jobs.NodeError, OSError) as exc:
                say(f"{node.name}: could not stop job {job_id}: {exc}")
        self._stop_holders(node)

    # -- stop
    def stop_node(self, node: Node, sig: int = signal.SIGTERM) -> bool:
        pid = node.pid()
        if pid is None or not pid_alive(pid) or not node.ours(pid):
            return False
        os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not _exited(pid):
            time.sleep(0.02)
        return True

    def start_node(self, node: Node) -> None:
        if not node.running():
            self._start_sshd(node)

    def rekey(self, node: Node) -> str:
        """A reimaged node: a new host key (sshd restarted with it), known_hosts left with the old one.
        Returns the new key's SHA256 fingerprint, which an operator would read on the node's console."""
        for old in (node.host_key, node.host_key.with_suffix(".pub")):
            old.unlink(missing_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"fleetops-lab-{node.name}",
                        "-f", str(node.host_key)], check=True)
        self.stop_node(node)
        self._start_sshd(node)
        out = subprocess.run(["ssh-keygen", "-lf", str(node.host_key.with_suffix(".pub"))], capture_output=True,
                             text=True, check=True).stdout
        return out.split()[1]

    def retrust(self) -> None:
        """known_hosts as `lab.up` writes it: every node's current host key (undoes a `rekey`'s refusal)."""
        self._write_known_hosts(self.nodes())

    def down(self, purge: bool = False) -> list[str]:
        for n in self.nodes():  # the nodes' jobs first (every tagged process, as `fab stop` does), then sshd
            self._stop_jobs(n)
        stopped = [n.name for n in self.nodes() if self.stop_node(n)]
        if purge and self.dir.exists():
            _remove_settled(self.dir)
            if self.hosts_file.exists():
                self.hosts_file.unlink()
        return stopped

    def status(self) -> list[dict]:
        rows = []
        for node in self.nodes():
            pid = node.pid()
            rows.append({"name": node.name, "port": node.port, "sshd_pid": pid if node.running() else None,
                         "listening": port_open(node.port), "python": str(node.python),
                         "python_version": node.python_version, "interpreter": node.interpreter,
                         "state_dir": str(node.state_dir), "gpus": self.gpu_state(node)["state"]})
        return rows
