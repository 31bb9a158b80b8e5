"""The bench's lab and the hosts every tool is pointed at: the throwaway project, the peers' own
venv, the work spec the peers run, known_hosts, and each tool's inventory (fleetops
hosts/bench.yaml, Ansible, pyinfra, Fabric).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchpaths import BENCH, PEER_PACKAGES, PLAYBOOK, PROFILER_PACKAGES, REPO, SNAPSHOT, WORK, say

from fleetops.lab import Lab, site_packages
from fleetops.plans.playbook import load_playbook


@dataclass
class BenchHost:
    name: str
    node_name: str
    real_port: int
    port: int  # what the tools connect to (the proxy's port when RTT > 0)
    python: str
    site: str
    state_dir: str
    diffs: str
    log: Path
    listener_pid: int


@dataclass
class Env:
    project: Path
    lab: Lab
    client_key: str
    known_hosts: Path
    spec_file: Path
    nodes: list = field(default_factory=list)
    proxy: subprocess.Popen | None = None
    proxy_ports: dict = field(default_factory=dict)

    def hosts(self, n: int, rtt: float) -> list[BenchHost]:
        out = []
        for i, node in enumerate(self.nodes[:n]):
            site = str(site_packages(node.venv))
            port = self.proxy_ports[node.port] if rtt else node.port
            out.append(
                BenchHost(
                    f"bench{i + 1:02d}",
                    node.name,
                    node.port,
                    port,
                    str(node.python),
                    site,
                    str(node.state_dir),
                    f"{node.state_dir}/bench-diffs",
                    node.dir / "sshd.log",
                    node.pid(),
                )
            )
        return out


def make_project(root: Path) -> Path:
    if root.exists():
        old = Lab(root)
        if any(n.running() for n in old.nodes()):
            old.down()
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for name in ("fabfile.py", "fabric.yaml", "playbooks", "tests"):
        (root / name).symlink_to(SNAPSHOT / name)
    (root / "hosts").mkdir()
    # the lab's tiny model (unused here); reuse the repo's if made already
    tiny = REPO / ".lab" / "tiny"
    if (tiny / "lab-data" / "prompts.jsonl").exists():
        shutil.copytree(tiny, root / ".lab" / "tiny")
    return root


def ensure_peers(need_peers: bool = True) -> Path:
    """The peers' own venv from bench/requirements.txt (benchmark-only; py-spy is optional). Without
    `need_peers` (no Ansible or pyinfra row asked for) only what is there already is used."""
    venv = WORK / "peers"
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    if need_peers and (
        not (venv / "bin" / "ansible-playbook").exists() or not (venv / "bin" / "pyinfra").exists()
    ):
        say(f"bench: installing {', '.join(PEER_PACKAGES)} into {venv} (benchmark-only, own venv)")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(pip + [pin(p) for p in PEER_PACKAGES], check=True)
    if (venv / "bin" / "pip").exists() and not (venv / "bin" / "py-spy").exists():
        subprocess.run(pip + [pin(p) for p in PROFILER_PACKAGES])
    return venv


def pin(package: str) -> str:
    for line in (BENCH / "requirements.txt").read_text().splitlines():
        if line.split("==")[0].strip() == package:
            return line.strip()
    return package


def write_spec(path: Path) -> dict:
    book = load_playbook(PLAYBOOK)
    rel = {c["module"]: c["module"].replace(".", "/") + ".py" for c in book.checks if "module" in c}
    spec = {
        "diffs": [p.diff_path.name for p in book.patches],
        "greps": [
            {
                "name": c["name"],
                "file": rel[c["module"]],
                "pattern": c["pattern"],
                "expect": c["expect"],
            }
            for c in book.checks
            if c["kind"] == "grep"
        ],
        "compile": [rel[c["module"]] for c in book.checks if c["kind"] == "compile"],
        "diff_sources": [str(p.diff_path) for p in book.patches],
    }
    path.write_text(json.dumps(spec, indent=1) + "\n")
    return spec


def write_known_hosts(env: Env, rtt: float, size: int | None = None) -> None:
    """known_hosts for the first `size` nodes (all by default; the proxy may front only those)."""
    lines = []
    for node in env.nodes[:size]:
        keytype, key = node.host_key.with_suffix(".pub").read_text().split()[:2]
        port = env.proxy_ports[node.port] if rtt else node.port
        lines.append(f"[127.0.0.1]:{port} {keytype} {key}")
    env.known_hosts.write_text("\n".join(lines) + "\n")


def write_inventories(env: Env, hosts: list[BenchHost], work: Path) -> dict:
    """fleetops hosts/bench.yaml, Ansible inventory + playbook + cfg, pyinfra inventory, Fabric
    hosts.json."""
    from peer_work import commands, load_spec

    n = len(hosts)
    fo = [
        "# written by bench/run.py",
        "defaults:",
        "  address: 127.0.0.1",
        "  user: root",
        f"  identity_file: {env.client_key}",
        f"  known_hosts: {env.known_hosts}",
        "  connect_timeout: 10",
        "hosts:",
    ]
    for h in hosts:
        fo += [
            f"  {h.name}:",
            f"    port: {h.port}",
            f"    python: {h.python}",
            f"    state_dir: {h.state_dir}",
            "    groups: [bench]",
        ]
    (env.project / "hosts" / "bench.yaml").write_text("\n".join(fo) + "\n")

    work.mkdir(parents=True, exist_ok=True)
    common = (
        f"-o UserKnownHostsFile={env.known_hosts} -o StrictHostKeyChecking=yes -o BatchMode=yes "
        "-o ConnectTimeout=10"
    )
    inventory = {
        "bench": {
            "hosts": {
                h.name: {
                    "ansible_host": "127.0.0.1",
                    "ansible_port": h.port,
                    "ansible_python_interpreter": h.python,
                    "node_python": h.python,
                    "node_site": h.site,
                    "node_diffs": h.diffs,
                }
                for h in hosts
            },
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": env.client_key,
                "ansible_ssh_common_args": common,
            },
        }
    }
    (work / "ansible_inventory.json").write_text(json.dumps(inventory, indent=1) + "\n")
    spec = load_spec(env.spec_file)
    tasks = [
        {"name": name, "ansible.builtin.shell": cmd, "changed_when": False}
        for name, cmd in commands(spec, "{{ node_python }}", "{{ node_site }}", "{{ node_diffs }}")
    ]
    play = [
        {
            "name": "bench: same checks as fleetops patch verify",
            "hosts": "bench",
            "gather_facts": False,
            "tasks": tasks,
        }
    ]
    (work / "ansible_playbook.yml").write_text(json.dumps(play, indent=1) + "\n")
    (work / "ansible.cfg").write_text(
        "\n".join(
            [
                "[defaults]",
                "host_key_checking = True",
                "retry_files_enabled = False",
                "gathering = explicit",
                "deprecation_warnings = False",
                "interpreter_python = auto_silent",
                f"forks = {n}",
                f"local_tmp = {WORK / 'ansible-home' / 'tmp'}",
                "[ssh_connection]",
                "pipelining = True",
                "",
            ]
        )
    )

    lines = ["# written by bench/run.py", "bench = ["]
    for h in hosts:
        data = {
            "ssh_hostname": "127.0.0.1",
            "ssh_port": h.port,
            "ssh_user": "root",
            "ssh_key": env.client_key,
            "ssh_known_hosts_file": str(env.known_hosts),
            "ssh_strict_host_key_checking": "yes",
            "node_python": h.python,
            "node_site": h.site,
            "node_diffs": h.diffs,
        }
        lines.append(f"    ({h.name!r}, {data!r}),")
    lines.append("]")
    (work / "pyinfra_inventory.py").write_text("\n".join(lines) + "\n")

    fab_hosts = [
        {
            "name": h.name,
            "address": "127.0.0.1",
            "port": h.port,
            "user": "root",
            "identity_file": env.client_key,
            "known_hosts": str(env.known_hosts),
            "python": h.python,
            "site": h.site,
            "diffs": h.diffs,
        }
        for h in hosts
    ]
    (work / "fabric_hosts.json").write_text(json.dumps(fab_hosts, indent=1) + "\n")
    return {"work": work}
