"""The `fab lab.*` tasks (fabfile.py adds collection() as `lab`): bring the lab up and down, show
it, reset a node's packages, switch its simulated GPUs, install another package version on one
node."""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

from invoke import Collection, task
from invoke.exceptions import Exit

from ..report.fold import COMMAND
from ..report.richload import print_line, stream_console
from . import kernel_log
from .common import NODE_PACKAGES, LabError, base_pins, ensure_base_for, parse_pins, say
from .gpu import GPU_STATES, SIMULATED_GPUS
from .lab import Lab
from .login import add_login_user, remove_login_user
from .pythons import NODE_PYTHONS
from .slurm import SlurmLab, login_inventory


def tell(prose: str, command: str | None = None) -> None:
    """A line for the operator, wrapped between words at the terminal's width (a path is never split
    by the terminal), and the command to run next whole, on a line of its own when the line does not
    fit, in the program the operator ran (written here as `fab ...`)."""
    line = [(prose, "")] + ([(" ", ""), (command, COMMAND)] if command else [])
    print_line(stream_console(sys.stdout), line, "")


def _lab(c) -> Lab:
    # set by fleetops.fab.executor: the fabfile's folder
    root = (c.config.get("fleetops") or {}).get("root")
    return Lab(Path(root) if root else Path.cwd())


@task(
    help={
        "nodes": "number of lab nodes, exactly: nodes beyond it are removed (default: as many as "
        "the lab has, at least 1; with several --python, one per Python)",
        "python": "the nodes' Python, for all or one per node: e.g. 3.9 or "
        f"{','.join(NODE_PYTHONS)} (pyenv's, "
        "or pythonX.Y on PATH, or a path); such nodes have speculators but no vLLM",
        "login_user": "also a non-root login user NAME for `become: sudo` (root only): the user, "
        "a sudoers entry for each node's python and "
        "hosts/lab-become.yaml (lab01-become, ...)",
    }
)
def up(c, nodes=None, python=None, login_user=None):
    """Start the local lab: N real sshd nodes on 127.0.0.1 with real vllm 0.16.0 + speculators
    0.3.0."""
    lab = _lab(c)
    pythons = [p.strip() for p in python.split(",") if p.strip()] if python else None
    try:
        count = int(nodes) if nodes is not None else None
    except ValueError:
        raise Exit(f"lab.up --nodes {nodes!r}: not a number of nodes", code=2) from None
    if count is not None and count < 1:
        raise Exit(f"lab.up --nodes {count}: at least 1", code=2)
    try:
        started = lab.up(count, pythons=pythons)
    except (LabError, subprocess.CalledProcessError) as exc:
        raise SystemExit(f"lab.up failed: {exc}") from None
    for n in started:
        which = (
            f" (Python {n.python_version} from {n.interpreter}; no vLLM)" if n.interpreter else ""
        )
        tell(f"{n.name}: sshd on 127.0.0.1:{n.port} (pid {n.pid()}), python {n.python}{which}")
    tell(f"inventory: {lab.hosts_file}")
    tell("try:", "fab -H lab01 patch verify")
    if login_user:
        try:
            become = add_login_user(lab, login_user)
        except (LabError, subprocess.CalledProcessError) as exc:
            raise SystemExit(f"lab.up --login-user: {exc}") from None
        tell(f"login user {login_user}: sudo NOPASSWD for each node's python; inventory: {become}")
        tell("try:", f"fab -H {(started or lab.nodes())[0].name}-become ping")


@task
def status(c):
    """Show lab nodes: port, sshd pid, whether it listens."""
    lab = _lab(c)
    rows = lab.status()
    if not rows:
        say("no lab nodes (fab lab.up)")
    for r in rows:
        state = f"sshd pid {r['sshd_pid']}" if r["sshd_pid"] else "sshd stopped"
        listening = "listening" if r["listening"] else "not listening"
        which = f" (Python {r['python_version']}, no vLLM)" if r["interpreter"] else ""
        tell(
            f"{r['name']}: 127.0.0.1:{r['port']} {state}, {listening}; python "
            f"{r['python']}{which}; GPUs: simulated {SIMULATED_GPUS}x H200 (replayed nvidia-smi "
            f"recordings), state {r['gpus']}"
        )


@task(help={"purge": "also delete the lab's files (keys, node venvs, state, the Slurm cluster)"})
def down(c, purge=False):
    """Stop the lab's sshd processes and its Slurm cluster (only the processes it started), and
    close the ssh master connections to its nodes."""
    lab = _lab(c)
    cluster = _slurm(lab)
    try:
        slurm_stopped = cluster.down() if cluster.conf.exists() else []
    except LabError as exc:
        raise SystemExit(f"lab.down: {exc}") from None
    for line in lab.close_masters():
        say(line)
    stopped = lab.down(purge=purge)
    login = remove_login_user(lab)
    if login:
        say(
            f"login user {login}: sudoers entry and hosts/lab-become.yaml removed (the user "
            f"stays: userdel {login})"
        )
    if purge:
        (lab.root / "hosts" / SLURM_HOSTS).unlink(missing_ok=True)
    say(
        "stopped: "
        f"{', '.join(stopped + [f'Slurm {d}' for d in slurm_stopped]) or 'nothing running'}"
    )


SLURM_HOSTS = "lab-slurm.yaml"


def _slurm(lab: Lab) -> SlurmLab:
    return SlurmLab(lab.dir / "slurm")


@task(
    help={
        "action": "up (start the cluster, write hosts/lab-slurm.yaml), down (stop it), or status",
        "node": "the lab node whose sshd is the login host (default: the first)",
        "login": "the login host's inventory name (default login01)",
    }
)
def slurm(c, action, node=None, login="login01"):
    """A one-node Slurm for the lab (Debian's munged, slurmctld, slurmd; two fake GPUs, no
    accounting) and a login host for it in the inventory: `fab lab.slurm up`, then `fab -H login01
    extract --shards 2`. The cluster keeps its queue across `down`/`up`; `fab lab.down` stops it
    too."""
    lab = _lab(c)
    cluster = _slurm(lab)
    try:
        if action == "up":
            nodes = lab.nodes()
            if not nodes:
                raise Exit("lab.slurm up: no lab nodes; start them first (fab lab.up)", code=2)
            target = _one(lab, node) if node else nodes[0]
            cluster.up()
            hosts = lab.root / "hosts" / SLURM_HOSTS
            hosts.write_text(
                login_inventory(
                    cluster,
                    name=login,
                    port=target.port,
                    python=target.python,
                    state_dir=target.state_dir,
                    user=lab.user,
                    client_key=lab.client_key,
                    known_hosts=lab.known_hosts,
                )
            )
            say(
                f"Slurm: slurmctld pid {cluster.running('slurmctld')}, slurmd pid "
                f"{cluster.running('slurmd')}, node {cluster.node} {cluster.node_state()}; "
                f"SLURM_CONF={cluster.conf}"
            )
            tell(f"inventory: {hosts} ({login} on {target.name}'s sshd)")
            tell("try:", f"fab -H {login} extract --shards 2")
        elif action == "down":
            stopped = cluster.down() if cluster.conf.exists() else []
            say(
                f"Slurm stopped: {', '.join(stopped) or 'nothing running'} (its queue is "
                "kept for the next up)"
            )
        elif action == "status" and not cluster.conf.exists():
            say(f"no lab Slurm in {cluster.root} (fab lab.slurm up)")
        elif action == "status":
            st = cluster.status()
            daemons = ", ".join(
                f"{d} {f'pid {p}' if p else 'stopped'}" for d, p in st["daemons"].items()
            )
            say(
                f"Slurm in {st['root']}: {daemons}"
                + (
                    f"; node {cluster.node} {st['node']}, {len(st['jobs'])} jobs in the queue"
                    if st["node"]
                    else ""
                )
            )
        else:
            raise Exit(f"lab.slurm {action!r}: give up, down or status", code=2)
    except LabError as exc:
        raise SystemExit(f"lab.slurm {action}: {exc}") from None


@task(help={"node": "lab node name, or 'all'"})
def reset(c, node="all"):
    """Give lab nodes pristine speculators files again (as installed from PyPI, from the node's own
    base venv: `lab.install --vllm` moves a node to another)."""
    lab = _lab(c)
    for n in _chosen(lab, node, "lab.reset"):
        lab.reset_packages(n, lab.node_base(n))
        say(f"{n.name}: packages reset")


@task(help={"state": f"one of {', '.join(GPU_STATES)}", "node": "lab node name, or 'all'"})
def gpu(c, state="idle", node="all"):
    """Switch a lab node's simulated GPUs: idle, busy (a real held process), missing GPU, driver
    error, absent."""
    if state not in GPU_STATES:  # before the lab is touched: a usage error, named
        raise Exit(
            f"usage error: lab.gpu --state {state!r} is not a GPU "
            f"state{did_you_mean(state, GPU_STATES)}; one of {', '.join(GPU_STATES)}",
            code=2,
        )
    lab = _lab(c)
    for n in _chosen(lab, node, "lab.gpu"):
        try:
            config = lab.set_gpu_state(n, state)
        except LabError as exc:
            raise SystemExit(str(exc)) from None
        held = (
            f" (held by pids {', '.join(map(str, config['holder_pids']))})"
            if config["holder_pids"]
            else ""
        )
        say(f"{n.name}: simulated GPUs now {state}{held}")


@task(
    help={
        "node": "lab node name, or 'all'",
        "xid": "append an NVIDIA Xid of this code (e.g. 79)",
        "gpu": "the simulated GPU the Xid is on (0 or 1; default 0)",
        "oom": (
            "the OOM killer takes the node's running job: "
            "SIGKILL its process, log the kernel's lines"
        ),
        "readable": f"who may read the kernel log: {', '.join(kernel_log.READABLE)}",
        "clear": "empty the simulated kernel log first",
    }
)
def kernel(c, node="all", xid=None, gpu=0, oom=False, readable=None, clear=False):
    """Switch a lab node's simulated kernel log: inject an Xid on a GPU or an OOM kill of the
    running job, make dmesg / journalctl -k unreadable, or clear it."""
    # before the lab is touched: a usage error, named
    if xid is not None and not str(xid).isdigit():
        raise Exit(
            f"usage error: lab.kernel --xid {xid!r} is not an Xid code (a whole number, e.g. 79)",
            code=2,
        )
    lab = _lab(c)
    for n in _chosen(lab, node, "lab.kernel"):
        try:
            if clear:
                kernel_log.clear(n)
                say(f"{n.name}: simulated kernel log cleared")
            if readable:
                kernel_log.install(n)
                kernel_log.set_readable(n, readable)
                say(f"{n.name}: simulated kernel log readable by: {readable}")
            if xid is not None:
                for line in kernel_log.inject_xid(n, int(xid), int(gpu)):
                    say(f"{n.name}: kernel log + {line}")
            if oom:
                killed = kernel_log.inject_oom(n)
                say(
                    f"{n.name}: OOM-killed job {killed['job']}'s process {killed['pid']} "
                    f"({killed['process']})"
                )
                for line in killed["lines"]:
                    say(f"{n.name}: kernel log + {line}")
            if not (clear or readable or xid is not None or oom):
                kernel_log.install(n)
                say(
                    f"{n.name}: {(n.dir / 'kernel.log').read_text().count(chr(10))} lines in "
                    "the simulated kernel log"
                )
        except LabError as exc:
            raise SystemExit(str(exc)) from None


@task(
    help={
        "node": "lab node name",
        "package": "a pinned requirement installed WITHOUT its dependencies, e.g. vllm==0.11.0 "
        "(a quick refused-patch demo; not a faithful node)",
        "vllm": (
            "put the node on the faithful base venv with this vLLM release (built first if absent)"
        ),
        "speculators": (
            f"with --vllm: the speculators release (default {NODE_PACKAGES['speculators']})"
        ),
    }
)
def install(c, node, package=None, vllm=None, speculators=None):
    """Give one lab node other real package versions: --vllm X (a faithful base venv with X's real
    dependencies, as `lab.build-base` makes it) or --package NAME==X (that one package, no deps)."""
    lab = _lab(c)
    target = _one(lab, node)
    if bool(package) == bool(vllm or speculators):
        raise Exit(
            "lab.install: give --vllm X [--speculators Y] (a faithful node) or --package NAME==X",
            code=2,
        )
    if package:
        lab.install_package(target, package)
        say(
            f"{node}: installed {package} without its dependencies (shadows the base venv's "
            f"copy; not a faithful node: `fab -H {node} facts` lists what it leaves unmet; `fab "
            f"lab.install --node {node} --vllm X` gives one)"
        )
        return
    base = _base(vllm=vllm, speculators=speculators)
    lab.use_base(target, base)
    say(
        f"{node}: now on {base} ({_pins(base)}; `fab lab.reset` keeps this base, "
        f"`fab lab.install --node {node} --vllm {NODE_PACKAGES['vllm']}` puts it back)"
    )


@task(
    name="build-base",
    help={
        "vllm": f"the vLLM release (default {NODE_PACKAGES['vllm']})",
        "speculators": f"the speculators release (default {NODE_PACKAGES['speculators']})",
    },
)
def build_base(c, vllm=None, speculators=None):
    """Build (once; cached under ~/.cache/fleetops/lab/) a faithful node venv: these releases with
    their real dependencies, checked with `pip check`. ~11 GB and ~8 minutes the first time."""
    base = _base(vllm=vllm, speculators=speculators)
    say(
        f"base venv: {base} ({_pins(base)}); put a node on it with fab lab.install --node lab02 "
        f"--vllm {_pins_of(base).get('vllm', '?')}"
    )


def _base(**versions: str | None) -> Path:
    try:
        return ensure_base_for(parse_pins(**versions))
    except (LabError, OSError, subprocess.CalledProcessError) as exc:
        raise Exit(f"lab base venv: {exc}", code=1) from None


def _pins_of(base: Path) -> dict[str, str]:
    return base_pins(base) or dict(NODE_PACKAGES)


def _pins(base: Path) -> str:
    return ", ".join(f"{k} {v}" for k, v in _pins_of(base).items())


@task(help={"node": "lab node name"})
def stop(c, node):
    """Stop one lab node's sshd (the node is unreachable until `lab.start`)."""
    lab = _lab(c)
    stopped = lab.stop_node(_one(lab, node))
    print(f"{node}: sshd {'stopped' if stopped else 'was not running'}")


@task(help={"node": "lab node name, or 'all'"})
def start(c, node="all"):
    """Start lab nodes' sshd again (after `lab.stop`)."""
    lab = _lab(c)
    for n in lab.nodes() if node == "all" else [_one(lab, node)]:
        lab.start_node(n)
        print(f"{n.name}: sshd listening on 127.0.0.1:{n.port}")


@task(help={"node": "lab node name"})
def rekey(c, node):
    """Reimage a lab node's SSH identity: a new host key, known_hosts keeps the old one (fab refuses
    it)."""
    lab = _lab(c)
    fingerprint = lab.rekey(_one(lab, node))
    tell(f"{node}: new host key {fingerprint} (what `ssh-keygen -lf` prints on the node's console)")


def _one(lab: Lab, name: str):
    nodes = lab.nodes()
    for n in nodes:
        if n.name == name:
            return n
    raise Exit(_no_such_node(name, [n.name for n in nodes]), code=2)


def _chosen(lab: Lab, name: str, task: str) -> list:
    """The lab nodes `--node` names (`all`: every one); a name that is no lab node's is a usage
    error, never a task that does nothing and exits 0."""
    nodes = lab.nodes()
    if name == "all":
        if not nodes:
            raise Exit(f"{task}: no lab nodes in {lab.dir}; start them first (fab lab.up)", code=2)
        return nodes
    chosen = [n for n in nodes if n.name == name]
    if not chosen:
        raise Exit(
            f"{task} --node {name!r}: " + _no_such_node(name, [n.name for n in nodes]), code=2
        )
    return chosen


def _no_such_node(name: str, known: list[str]) -> str:
    if not known:
        return f"no lab node {name!r}: the lab has no nodes; start them with fab lab.up"
    return (
        f"no lab node {name!r}{did_you_mean(name, known)} (lab nodes: {', '.join(known)}; or all)"
    )


def did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def collection() -> Collection:
    return Collection(
        up, status, down, reset, gpu, install, build_base, kernel, stop, start, rekey, slurm
    )
