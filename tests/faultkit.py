"""Helpers for the fault tests: expected file forms from an independent source (GNU patch applied to
the wheel's file, a committed sha256 file, pip's RECORD), the enumeration of every failpoint an
operation hits, and the node's own evidence that a fault really happened (/proc, the node's
sshd.log, its lock file).

Nothing here imports the node-side patching code: what the tests expect must not come from what they
test."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml
from conftest import REPO, fab_json, record_sha256
from polling import wait_for as wait_for  # the fault tests poll with the suite's one wait

from fleetops.lab import Lab, Node, site_packages

PLAYBOOK = REPO / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml"
SHA_FIXTURE = REPO / "tests" / "fixtures" / "speculators-0.3.0-vllm-0.16.sha256"
TMP_MARK = ".fleetops-tmp-"


# An attacker's swap loop over a directory she may write: argv d, target, seconds. d/sub is the real
# directory, then a symlink to `target` outside, then the real one again, as fast as rename(2) goes.
SUBDIR_SWAPPER = """
import os, sys, time
d, target, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
sub, real, link = os.path.join(d, "sub"), os.path.join(d, ".subreal"), os.path.join(d, ".sublink")
os.symlink(target, link)
end = time.time() + secs
while time.time() < end:
    os.rename(sub, real); os.rename(link, sub)
    os.rename(sub, link); os.rename(real, sub)
"""


# ---------------------------------------------------------------- expected forms, independently
def playbook_patches() -> list[tuple[str, Path]]:
    """(module, diff file) in the playbook's order, read from the YAML itself (not fleetops'
    loader)."""
    doc = yaml.safe_load(PLAYBOOK.read_text(encoding="utf-8"))
    return [(p["module"], PLAYBOOK.parent / p["diff"]) for p in doc["patches"]]


def committed_forms() -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for line in SHA_FIXTURE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            digest, form, module = line.split()
            out.setdefault(module, {})[form] = digest
    return out


def gnu_patched(pristine: bytes, diff: Path) -> bytes:
    """The shipped diff applied by GNU patch (no fuzz) to a copy of the pristine file."""
    patch = shutil.which("patch")
    assert patch, (
        "GNU patch is missing (apt-get install patch): it gives the expected patched files"
    )
    with tempfile.TemporaryDirectory(prefix="fleetops-gnu-patch-") as tmp:
        src, out = Path(tmp) / "file.py", Path(tmp) / "patched.py"
        src.write_bytes(pristine)
        proc = subprocess.run(
            [
                patch,
                "-F0",
                "--no-backup-if-mismatch",
                "--batch",
                "-o",
                str(out),
                str(src),
                str(diff),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, (
            f"GNU patch could not apply {diff.name}: {proc.stdout}{proc.stderr}"
        )
        return out.read_bytes()


def independent_forms(node: Node) -> dict[str, dict[str, str]]:
    """module → {"pristine": sha256, "patched": sha256}; the three independent sources must agree:
    pip's RECORD (pristine), GNU patch on the node's freshly reset pristine copy, the committed
    sha256 file."""
    committed = committed_forms()
    site = site_packages(node.venv)
    out = {}
    for module, diff in playbook_patches():
        pristine = node.module_file(module).read_bytes()
        got = hashlib.sha256(pristine).hexdigest()
        assert got == record_sha256(site, module), (
            f"{module} on {node.name} is not the wheel's file"
        )
        patched = hashlib.sha256(gnu_patched(pristine, diff)).hexdigest()
        forms = {"pristine": got, "patched": patched}
        assert committed.get(module) == forms, (
            f"{module}: the committed {SHA_FIXTURE.name} says {committed.get(module)}, RECORD "
            f"and GNU patch say {forms}; if a shipped diff "
            "changed on purpose, update the committed file"
        )
        out[module] = forms
    return out


def file_sha(node: Node, module: str) -> str:
    return hashlib.sha256(node.module_file(module).read_bytes()).hexdigest()


# ---------------------------------------------------------------- temp files
def temp_files(node: Node) -> list[Path]:
    """Every atomic-write temp file fleetops could leave on the node: beside the targets, the
    backups and the lock info."""
    dirs = {node.module_file(m).parent for m, _ in playbook_patches()}
    dirs |= {node.state_dir, node.state_dir / "backups"}
    return sorted(p for d in dirs if d.is_dir() for p in d.iterdir() if TMP_MARK in p.name)


def temp_writer(path: Path) -> int:
    return int(path.name.rsplit("-", 1)[1])


# ---------------------------------------------------------------- failpoints Armed through the
# environment the lab's sshd gives the agent (FLEETOPS_FAILPOINTS_DIR=<node>/faults, set in its
# sshd_config), never through a file in the state dir: the node obeys no failpoints.json it finds
# there.
def arm(node: Node, spec: dict) -> None:
    node.faults_dir.mkdir(mode=0o700, exist_ok=True)
    tmp = node.faults_dir / "failpoints.json.tmp"
    tmp.write_text(json.dumps(spec))
    tmp.replace(node.faults_dir / "failpoints.json")


def disarm(node: Node) -> None:
    (node.faults_dir / "failpoints.json").unlink(missing_ok=True)


def hit_file(node: Node, point: str) -> Path:
    return node.faults_dir / f"failpoint-{point}.hit"


def trace(node: Node) -> list[tuple[str, int, str]]:
    """The recorded failpoints as (point, n-th hit of that point, file being written or ""), in the
    order the node reached them."""
    seen: dict[str, int] = {}
    out = []
    path = node.faults_dir / "failpoints.trace"
    for line in path.read_text().splitlines() if path.exists() else []:
        name, written = json.loads(line)
        seen[name] = seen.get(name, 0) + 1
        out.append((name, seen[name], written))
    return out


def failpoints_hit(lab: Lab, node: Node, op: str) -> list[tuple[str, int]]:
    """Every (point, n-th hit) that one `fab -H <node> <op>` reaches, in order, as the node recorded
    them; the run itself must succeed."""
    (node.faults_dir / "failpoints.trace").unlink(missing_ok=True)
    arm(node, {"*": {"action": "record"}})
    try:
        rc, doc = fab_json(lab.root, "-H", node.name, op)
    finally:
        disarm(node)
    assert rc == 0, doc
    return [(p, n) for p, n, _ in trace(node)]


def clear_fault_leftovers(node: Node) -> None:
    """What the `lab` fixture leaves in the state dir from an earlier run (a kept lab,
    FLEETOPS_TEST_LAB): hit files, a trace, a killed writer's lock-info temp file. Each test starts
    from none."""
    for entry in [
        *node.state_dir.iterdir(),
        *(node.faults_dir.iterdir() if node.faults_dir.is_dir() else []),
    ]:
        if (
            entry.name.startswith("failpoint")
            and entry.name != "failpoints.json"
            or TMP_MARK in entry.name
        ):
            entry.unlink()


def fresh_nodes(lab: Lab) -> Lab:
    """Every node of the lab started, reset (reset_node) and its failpoints disarmed: a test's clean
    start."""
    for node in lab.nodes():
        lab.start_node(node)
        reset_node(lab, node)
        disarm(node)
    return lab


def reset_node(lab: Lab, node: Node) -> None:
    """What the `lab` fixture does before each test, for a node this module dirtied in the middle of
    one."""
    lab.reset_packages(node)
    for sub in ("backups", "lock.json"):
        target = node.state_dir / sub
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    clear_fault_leftovers(node)


# ---------------------------------------------------------------- processes and sessions, from
# /proc
def agents_of(node: Node) -> list[int]:
    """Pids of the node agent (our zip under this node's state dir) running now, from /proc."""
    mark = f"{node.state_dir}/bin/fleetops-agent".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = children(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


def is_sshd(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("sshd")
    except OSError:
        return False


def sessions(listener: int) -> dict[int, list[int]]:
    """The listener's live sessions, listed while it still runs (OpenSSH leaves them running,
    re-parented, when the listener stops): session pid → its sshd processes (the session and any
    privsep child)."""
    return {
        s: [s, *[d for d in descendants(s) if is_sshd(d)]] for s in children(listener) if is_sshd(s)
    }


def session_of(pid: int, listener: int) -> int:
    """The listener's child (the sshd session) that pid runs under."""
    p = pid
    while p > 1:
        up = parent(p)
        if up == listener:
            return p
        p = up
    raise AssertionError(f"pid {pid} does not run under sshd listener {listener}")


def client_port(session_pids: list[int], node_port: int) -> int:
    """The client's TCP port of the connection an sshd session serves (its socket, via
    /proc/net/tcp)."""
    inodes = set()
    for pid in session_pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                m = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
            except OSError:
                continue
            if m:
                inodes.add(m.group(1))
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        local, remote, inode = f[1], f[2], f[9]
        if inode in inodes and int(local.split(":")[1], 16) == node_port:
            return int(remote.split(":")[1], 16)
    raise AssertionError(f"sshd session {session_pids} holds no TCP connection on port {node_port}")


def sshd_log(node: Node, since: int = 0) -> str:
    """The node's sshd.log from byte `since` on (client ports are reused: look only at this fault's
    part)."""
    with open(node.dir / "sshd.log", "rb") as f:
        f.seek(since)
        return f.read().decode(errors="replace")


def sshd_log_size(node: Node) -> int:
    return (node.dir / "sshd.log").stat().st_size


def log_started_session(node: Node, port: int, since: int) -> bool:
    return (
        re.search(
            rf"^Starting session: command for \S+ from 127\.0\.0\.1 port {port} ",
            sshd_log(node, since),
            re.M,
        )
        is not None
    )


def last_session_id(node: Node, port: int, since: int) -> int | None:
    """The id of the last command session sshd started on the connection from `port` (on an OpenSSH
    master, one connection carries several sessions: the one a fault cuts is the latest)."""
    ids = re.findall(
        rf"^Starting session: command for \S+ from 127\.0\.0\.1 port {port} id (\d+)\b",
        sshd_log(node, since),
        re.M,
    )
    return int(ids[-1]) if ids else None


def log_closed_session(node: Node, port: int, since: int, session: int | None = None) -> bool:
    """The node's sshd wrote that the session from `port` ended normally (it was not cut): the
    connection's end, or, on a connection that lives on (an OpenSSH master shared by several
    sessions), the session's own (`session`: that id alone; an earlier session on the same master
    closing says nothing of this one)."""
    text = sshd_log(node, since)
    sid = ""
    # sshd reuses a closed session's id: only what it wrote after this one started
    if session is not None:
        sid = rf"id {session}\b"
        starts = list(
            re.finditer(
                rf"^Starting session: command for \S+ from 127\.0\.0\.1 port {port} {sid}",
                text,
                re.M,
            )
        )
        text = text[starts[-1].end() :] if starts else text
    return (
        re.search(
            r"^((Disconnected from user \S+|Received disconnect from|Connection closed by) "
            rf"127\.0\.0\.1 port {port}\b|Close session: "
            rf"user \S+ from 127\.0\.0\.1 port {port} {sid})",
            text,
            re.M,
        )
        is not None
    )
