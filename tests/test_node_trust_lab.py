"""Node trust against a real lab node of this module's own.

Every attack from the issue that concerns the state dir is made for real: code planted by another
user (uid 65534, through `setpriv`) in a bin/ it may write, a fake agent zip, a planted
failpoints.json with symlinked .hit/.trace files, symlinks in place of `lock`, `backups/` and
`lock.json`, a group-writable state dir, an upload killed midway. Each must now be refused (naming
host, path, mode, next step; no traceback) or handled, and the planted code must never run: it would
create a marker file, and the marker never appears."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

import paramiko
import pytest
from conftest import fab_json_output
from faultkit import arm, disarm, reset_node, trace
from polling import wait_for

from fleetops.lab import Lab, Node
from fleetops.plans.inventory import load_inventory
from fleetops.wire.bundle import agent_bundle
from fleetops.wire.ssh import NodeConnection

pytestmark = pytest.mark.lab

NOBODY = 65534
EXIT_FAILED = 1


@pytest.fixture(scope="module")
def lab1(lab_factory, root_user):
    # Under 0755 directories (not pytest's 0700 ones), so that another user can reach the node's
    # state dir at all: the attacks below are made by uid 65534 itself, not simulated by root, and
    # the state dir is made root's (chown 0): root only. A lab of its own, as nothing puts those
    # owners back.
    with lab_factory.own("trust", 1, reachable=True) as lab:
        yield lab


@pytest.fixture
def node(lab1) -> Node:
    node = lab1.node("lab01")
    lab1.start_node(node)
    state = node.state_dir
    for name in (
        "bin",
        "backups",
        "jobs",
        "lock",
        "lock.json",
        "failpoints.json",
        "failpoints.trace",
    ):
        path = state / name
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
    for entry in state.iterdir():
        if entry.name.startswith(("lock.json.corrupt-", "failpoint")):
            entry.unlink()
    state.chmod(0o755)
    os.chown(state, 0, 0)
    reset_node(lab1, node)
    disarm(node)
    return node


def fab(lab: Lab, *args: str) -> tuple[int, dict, str]:
    """`fab -H lab01 ... --json`: (exit status, the JSON document, stdout+stderr); never a
    traceback."""
    return fab_json_output(lab.root, "-H", "lab01", *args, timeout=600)


def result_of(doc: dict) -> dict:
    (result,) = doc["results"]
    return result


def assert_ok(lab: Lab, *args: str) -> dict:
    rc, doc, both = fab(lab, *args)
    assert rc == 0, both
    return result_of(doc)


def assert_refused(lab: Lab, *args: str, parts: tuple[str, ...]) -> str:
    rc, doc, both = fab(lab, *args)
    result = result_of(doc)
    assert rc == EXIT_FAILED and result["status"] == "failed", both
    msg = result["msg"]
    assert result["host"] == "lab01" and "\n" not in msg, result  # one line, for that host
    for part in parts:
        assert part in msg, (part, msg)
    return msg


def agent_call(lab: Lab, op: str = "ping") -> dict:
    """One agent call through fleetops' own connector (the library path), for the parts of the
    answer the console does not print: what the node quarantined or cleaned."""
    inv = load_inventory(lab.hosts_file)
    conn = NodeConnection(inv.resolve("lab01"), inv)
    try:
        answer, _ = conn.call(op, {})
    finally:
        conn.close()
    return answer


def as_nobody(*argv: str, text: str = "") -> subprocess.CompletedProcess:
    """Run argv as uid/gid 65534 with no groups (another user on the node), `text` on its stdin."""
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )


def marker_dir() -> Path:
    """A directory the planted code (running as anyone) could create its marker in."""
    d = Path(tempfile.mkdtemp(prefix="fleetops-marker-", dir="/tmp"))
    d.chmod(0o1777)
    return d


def planted_agent(marker: Path) -> dict[str, str]:
    """An agent package that, if it ever ran, would drop `marker` and answer like the real one (the
    issue's fake answered `ping | ok` and `patch | changed ... applied (fake)`)."""
    main = (
        f"import json, os, sys\nopen({str(marker)!r}, "
        "'w').write('planted code ran as uid %d' % os.geteuid())\n"
        "def main():\n    sys.stdin.read()\n"
        "    print(json.dumps({'ok': True, 'python': "
        "sys.executable, 'version': '3', 'pid': os.getpid(), "
        "'applied': ['fake']}))\n    return 0\n"
    )
    return {
        "remote_scripts/__init__.py": "",
        "remote_scripts/core/__init__.py": "",
        "remote_scripts/core/agent.py": main,
        "__main__.py": "from remote_scripts.core.agent import main\nimport sys\nsys.exit(main())\n",
    }


def shipped(node: Node) -> Path:
    """The agent zip the last run uploaded (the newest: other work in this tree may change the
    agent's source while this module runs, and then each `fab` ships its own version)."""
    zips = sorted(
        (node.state_dir / "bin").glob("fleetops-agent-*.pyz"), key=lambda p: p.stat().st_mtime_ns
    )
    assert zips, "no agent zip on the node"
    return zips[-1]


def name_sha(path: Path) -> str:
    return path.name.removeprefix("fleetops-agent-").removesuffix(".pyz")


# ---------------------------------------------------------------- item 1: the agent and its
# directory
def test_code_planted_by_another_user_in_a_writable_bin_never_runs(lab1, node):
    assert_ok(lab1, "ping")  # the agent is uploaded
    bin_dir = node.state_dir / "bin"
    # the cache fleetops used to import from
    unpacked = bin_dir / shipped(node).name.replace(".pyz", ".d")
    marks = marker_dir()
    marker = marks / "planted-ran"
    bin_dir.chmod(0o777)  # the premise: bin/ writable by another user
    try:
        # As uid 65534: build the planted package, then swap it in for any unpacked directory
        # already there.
        staging = marks / "staging"
        for rel, text in planted_agent(marker).items():
            proc = as_nobody(
                "sh",
                "-c",
                'mkdir -p "$(dirname "$1")" && cat > "$1"',
                "sh",
                str(staging / rel),
                text=text,
            )
            assert proc.returncode == 0, proc.stderr
        proc = as_nobody(
            "sh",
            "-c",
            'if [ -e "$2" ]; then mv "$2" "$2.moved"; fi; mv "$1" "$2"',
            "sh",
            str(staging),
            str(unpacked),
        )
        assert proc.returncode == 0, proc.stderr
        # really another user's
        assert (unpacked / "remote_scripts" / "core" / "agent.py").stat().st_uid == NOBODY
        for task in ("ping", "patch"):
            assert_refused(
                lab1,
                task,
                parts=(
                    f"{bin_dir} is writable by group or others",
                    "drwxrwxrwx (0777)",
                    f"chmod go-w {bin_dir}",
                ),
            )
        assert not marker.exists(), marker.read_text()
    finally:
        bin_dir.chmod(0o700)
    # bin/ ours again, the planted directory still there: the agent runs from its verified zip,
    # never from it.
    assert_ok(lab1, "ping")
    result = assert_ok(lab1, "patch")
    assert result["status"] == "changed", result
    assert not marker.exists(), marker.read_text()
    shutil.rmtree(marks)


def test_bin_owned_by_another_user_is_refused(lab1, node):
    assert_ok(lab1, "ping")
    bin_dir = node.state_dir / "bin"
    os.chown(bin_dir, NOBODY, NOBODY)
    try:
        assert_refused(
            lab1,
            "ping",
            parts=(
                f"{bin_dir} is owned by uid {NOBODY}, not by the connecting user (uid 0) or root",
                "(0700)",
                f"chown 0 {bin_dir}",
            ),
        )
    finally:
        os.chown(bin_dir, 0, 0)
    assert_ok(lab1, "ping")


def test_a_fake_agent_zip_under_the_real_name_is_refused(lab1, node):
    assert_ok(lab1, "ping")
    marks = marker_dir()
    marker = marks / "fake-ran"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for rel, text in planted_agent(marker).items():
            zf.writestr(rel, text)
    fake = buf.getvalue()
    target = shipped(node)
    target.write_bytes(fake)
    for task in ("ping", "patch"):
        msg = assert_refused(
            lab1,
            task,
            parts=(
                f"{target} is not the agent fleetops sent",
                f"sha256 {hashlib.sha256(fake).hexdigest()}",
                f"expected {name_sha(target)}",
                f"rm {target}",
            ),
        )
        assert "\n" not in msg
    assert not marker.exists(), marker.read_text()
    # refused, not silently replaced: the operator is told to look
    assert target.read_bytes() == fake
    target.unlink()
    assert_ok(lab1, "ping")  # a fresh copy is uploaded
    assert (
        hashlib.sha256(shipped(node).read_bytes()).hexdigest().startswith(name_sha(shipped(node)))
    )
    shutil.rmtree(marks)


def test_a_symlinked_agent_zip_is_refused(lab1, node):
    assert_ok(lab1, "ping")
    target = shipped(node)
    elsewhere = node.dir / "agent-elsewhere.pyz"
    # even the right bytes: fleetops does not follow links in its state dir
    shutil.copyfile(target, elsewhere)
    target.unlink()
    target.symlink_to(elsewhere)
    assert_refused(lab1, "ping", parts=(f"{target} is a symlink (to {elsewhere})", f"rm {target}"))
    target.unlink()
    elsewhere.unlink()


@pytest.mark.parametrize("mode", [0o775, 0o757])
def test_a_group_or_other_writable_state_dir_is_refused(lab1, node, mode):
    assert_ok(lab1, "ping")
    node.state_dir.chmod(mode)
    try:
        assert_refused(
            lab1,
            "ping",
            parts=(
                f"{node.state_dir} is writable by group or others",
                f"({mode:04o})",
                f"chmod go-w {node.state_dir}",
            ),
        )
    finally:
        node.state_dir.chmod(0o755)
    assert_ok(lab1, "ping")


def test_a_state_file_another_user_may_write_is_refused_before_the_op(lab1, node):
    assert_ok(lab1, "patch")
    backups = node.state_dir / "backups"
    record = next(backups.glob("*.json"))
    record.chmod(0o666)
    try:
        assert_refused(
            lab1, "rollback", parts=(f"{record} is writable by group or others", "(0666)")
        )
    finally:
        record.chmod(0o600)
    assert_ok(lab1, "rollback")


# ---------------------------------------------------------------- item 2: failpoints only from the
# harness
def test_a_planted_failpoints_file_is_inert(lab1, node):
    victims = {name: node.dir / f"victim-{name}" for name in ("hit", "hit-tmp", "trace")}
    for path in victims.values():
        path.write_text("precious\n")
    state = node.state_dir
    (state / "failpoints.json").write_text(
        json.dumps(
            {
                "*": {"action": "record"},
                "lock.acquired": {"action": "sleep", "seconds": 0},
                "patch.target.before_rename": {"action": "kill"},
            }
        )
    )
    (state / "failpoint-lock.acquired.hit").symlink_to(victims["hit"])
    (state / "failpoint-lock.acquired.hit.tmp").symlink_to(victims["hit-tmp"])
    (state / "failpoints.trace").symlink_to(victims["trace"])
    result = assert_ok(lab1, "patch")  # not killed at the planted point: patched
    assert result["status"] == "changed", result
    for path in victims.values():
        assert path.read_text() == "precious\n", path
    assert trace(node) == []  # and nothing recorded in the harness's place either
    # The harness's own way still arms them (so the check above is not vacuous): the lab's sshd
    # names the faults dir in the agent's environment.
    arm(node, {"*": {"action": "record"}})
    try:
        assert_ok(lab1, "rollback")
        assert ("lock.acquired", 1, "") in trace(node)
    finally:
        disarm(node)
        (node.faults_dir / "failpoints.trace").unlink(missing_ok=True)
    for path in victims.values():
        assert path.read_text() == "precious\n", path
        path.unlink()


# ---------------------------------------------------------------- item 6: symlink-safe node I/O
def test_lock_symlinked_to_a_missing_path_creates_nothing(lab1, node):
    assert_ok(lab1, "ping")
    where = Path(tempfile.mkdtemp(prefix="fleetops-lock-target-", dir="/tmp"))
    missing = where / "created-by-fleetops"
    lock = node.state_dir / "lock"
    lock.symlink_to(missing)
    for task in ("patch", "ping"):
        assert_refused(lab1, task, parts=(f"{lock} is a symlink (to {missing})", f"rm {lock}"))
    assert not missing.exists() and list(where.iterdir()) == []
    lock.unlink()
    assert assert_ok(lab1, "patch")["status"] == "changed"
    shutil.rmtree(where)


def test_backups_symlinked_elsewhere_are_refused(lab1, node):
    elsewhere = Path(tempfile.mkdtemp(prefix="fleetops-backups-elsewhere-", dir="/tmp"))
    backups = node.state_dir / "backups"
    backups.symlink_to(elsewhere)
    target = node.module_file("speculators.data_generation.vllm_hidden_states_generator")
    before = hashlib.sha256(target.read_bytes()).hexdigest()
    assert_refused(
        lab1, "patch", parts=(f"{backups} is a symlink (to {elsewhere})", f"rm {backups}")
    )
    assert list(elsewhere.iterdir()) == []  # no backup written there
    assert hashlib.sha256(target.read_bytes()).hexdigest() == before  # and nothing patched
    backups.unlink()
    assert assert_ok(lab1, "patch")["status"] == "changed"
    shutil.rmtree(elsewhere)


@pytest.mark.parametrize("how", ["symlink", "garbage"])
def test_a_corrupt_lock_json_is_quarantined_and_the_next_run_works(lab1, node, how):
    info = node.state_dir / "lock.json"
    other = node.dir / "not-json.txt"
    other.write_text("this is not JSON\n")

    def plant() -> None:
        if how == "symlink":
            info.symlink_to(other)
        else:
            info.write_text("{not json")
            info.chmod(0o600)

    plant()  # the issue: this broke every later run for good
    answer = agent_call(lab1)
    assert answer["ok"], answer
    (moved,) = answer["quarantined"]  # reported in the answer
    aside = Path(moved["moved_to"])
    assert (
        moved["path"] == str(info)
        and aside.parent == node.state_dir
        and aside.name.startswith("lock.json.corrupt-")
    )
    assert ("symlink" if how == "symlink" else "not JSON") in moved["why"]
    if how == "symlink":
        # the link moved aside, not its target
        assert aside.is_symlink() and os.readlink(aside) == str(other)
    assert other.read_text() == "this is not JSON\n"
    aside.unlink()
    plant()  # and the same in the middle of a real patch run: it works, and so does every later run
    assert assert_ok(lab1, "patch")["status"] == "changed"
    assert len(list(node.state_dir.glob("lock.json.corrupt-*"))) == 1
    assert not info.exists()  # the lock was released normally
    assert assert_ok(lab1, "rollback")["status"] == "changed"
    assert other.read_text() == "this is not JSON\n"
    for path in node.state_dir.glob("lock.json.corrupt-*"):
        path.unlink()
    other.unlink()


def test_a_dead_uploads_temp_file_is_removed(lab1, node):
    assert_ok(lab1, "ping")
    bundle = agent_bundle()
    # A real upload killed midway: half the zip written over SFTP, then the connection dropped.
    client = paramiko.SSHClient()
    client.load_host_keys(str(lab1.known_hosts))
    client.connect(
        "127.0.0.1",
        port=node.port,
        username=lab1.user,
        key_filename=str(lab1.client_key),
        look_for_keys=False,
        allow_agent=False,
        timeout=30,
    )
    names = [f"{bundle.filename}.{i:08x}.tmp" for i in (0xDEAD, 0xBEEF)]
    sftp = client.open_sftp()
    for name in names:
        f = sftp.open(f"{node.state_dir}/bin/{name}", "wb")
        f.write(bundle.data[: len(bundle.data) // 2])
        f.flush()
    client.get_transport().close()  # killed: no close, no rename
    dead, fresh = (node.state_dir / "bin" / n for n in names)
    wait_for(
        lambda: dead.exists() and dead.stat().st_size == len(bundle.data) // 2, "the partial upload"
    )
    old = time.time() - 3600
    # its writer died an hour ago; `fresh` could still be an upload in flight
    os.utime(dead, (old, old))
    answer = agent_call(lab1)
    assert answer["ok"] and answer["removed_temp_files"] == [str(dead)], answer
    assert not dead.exists(), "a dead upload's temp file was left in bin/"
    assert fresh.exists(), "a recent temp file (maybe an upload in flight) was removed"
    assert_ok(lab1, "ping")
    fresh.unlink()


def test_the_node_runs_no_unpacked_copy_and_writes_none(lab1, node):
    """Nothing is unpacked beside the zip any more: bin/ holds exactly the verified zip."""
    assert_ok(lab1, "ping")
    assert_ok(lab1, "patch")
    names = [p.name for p in (node.state_dir / "bin").iterdir()]
    assert names and all(n.startswith("fleetops-agent-") and n.endswith(".pyz") for n in names), (
        names
    )


@pytest.mark.parametrize("leaf", ["output.log", "job.json"])
def test_a_job_file_symlinked_elsewhere_is_refused_but_a_jobs_own_files_are_its_business(
    lab1, node, leaf
):
    """`logs` reads output.log as the login user (root here): a symlink there would show any
    file."""
    secret = node.dir / "not-yours.txt"
    secret.write_text("secret\n")
    job = node.state_dir / "jobs" / "20260101T000000-planted"
    job.mkdir(parents=True, mode=0o700)
    node.state_dir.joinpath("jobs").chmod(0o700)
    # the job runs in its directory: what it makes there is its own
    (job / "own-link").symlink_to(secret)
    (job / "results.json").write_text("{}")
    (job / "results.json").chmod(0o664)
    assert_ok(lab1, "ping")
    (job / leaf).symlink_to(secret)
    assert_refused(
        lab1, "ping", parts=(f"{job / leaf} is a symlink (to {secret})", f"rm {job / leaf}")
    )
    shutil.rmtree(node.state_dir / "jobs")
    secret.unlink()
    assert_ok(lab1, "ping")
