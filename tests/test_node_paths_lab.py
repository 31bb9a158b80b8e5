"""The state dir's whole path, and what every process fleetops starts on a node runs, against a real
lab node.

- The state dir's path is checked as written, component by component (like OpenSSH's StrictModes): a
  state dir reached through a symlink that sits in an others-writable directory (`sym01`) is refused
  like one directly in that directory (`direct01`); a symlink on the way is followed only where no
  other user can replace it.
- The job keeper and the extract process run only the agent bytes whose sha256 the client sent
  (through the verifying bootstrap, never `python <state_dir>/bin/<agent>.pyz` by path): the agent
  zip swapped while a failpoint holds the launch (the deterministic form of the race another user
  won 2 times in 4) never runs.

The attacks are made by uid 65534 itself (setpriv) where the attack is another user's; code that
must never run would create a marker file, and the marker never appears."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, fab_json_output, run_fab
from faultkit import arm, disarm, hit_file
from polling import wait_for

pytestmark = [
    pytest.mark.lab,
    pytest.mark.root("the attacks are made as uid 65534 through setpriv"),
]
NOBODY = 65534
JOBS = str(REPO / "tests" / "playbooks" / "jobs.yaml")


def as_nobody(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


def planted_zip(marker: Path) -> bytes:
    """An agent zip that, if Python ever ran it (as `python zip wrap|extract ...` would), drops
    `marker`."""
    code = (
        f"import os\nopen({str(marker)!r}, 'w').write('planted "
        "code ran as uid %d' % os.geteuid())\n"
    )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("__main__.py", code)
        zf.writestr("remote_scripts/__init__.py", code)
        zf.writestr("remote_scripts/core/__init__.py", code)
        zf.writestr("remote_scripts/core/agent.py", code)
    return buf.getvalue()


def host_yaml(lab, hosts: dict[str, dict]) -> str:
    node = lab.node("lab01")
    lines = [
        "defaults:",
        "  address: 127.0.0.1",
        f"  user: {lab.user}",
        f"  identity_file: {lab.client_key}",
        f"  known_hosts: {lab.known_hosts}",
        "  lab: true",
        "  connect_timeout: 10",
        "hosts:",
    ]
    for name, values in hosts.items():
        lines += [
            f"  {name}:",
            f"    port: {node.port}",
            f"    python: {values.get('python', node.python)}",
            f"    state_dir: {values['state_dir']}",
            "    gpus: 2",
            "    groups: [lab]",
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def place(lab):
    """/tmp/<new> (0755) with shared/ (0777, not sticky: any user may create and rename there),
    real/ (0755), shared/link -> real, and sticky/ (1777, like /tmp); its hosts file is removed at
    the end."""
    top = Path(tempfile.mkdtemp(prefix="fleetops-paths-", dir="/tmp"))
    top.chmod(0o755)
    for name, mode in (("shared", 0o777), ("real", 0o755), ("sticky", 0o1777), ("marks", 0o1777)):
        (top / name).mkdir()
        (top / name).chmod(mode)
    (top / "shared" / "link").symlink_to(top / "real")
    hosts = lab.root / "hosts" / "paths.yaml"
    yield top, hosts
    hosts.unlink(missing_ok=True)
    disarm(lab.node("lab01"))
    shutil.rmtree(top, ignore_errors=True)


def refused(lab, host: str, *parts: str) -> str:
    rc, doc, both = fab_json_output(lab.root, "-H", host, "ping")
    (result,) = doc["results"]
    assert rc == 1 and result["status"] == "failed", both
    for part in parts:
        assert part in result["msg"], (part, result["msg"])
    return result["msg"]


def test_a_state_dir_through_a_symlink_in_an_others_writable_dir_is_refused_like_one_directly_in_it(
    lab, place
):
    top, hosts = place
    shared = top / "shared"
    hosts.write_text(
        host_yaml(
            lab,
            {
                "direct01": {"state_dir": shared / "state"},
                "sym01": {"state_dir": shared / "link" / "state"},
            },
        )
    )
    refused(
        lab,
        "sym01",
        f"{shared} (on the way to {shared / 'link' / 'state'}) is writable by group or others "
        "and not sticky",
        "(0777)",
    )
    refused(
        lab,
        "direct01",
        f"{shared} (on the way to {shared / 'state'}) is writable by group or others and "
        "not sticky",
        "(0777)",
    )
    # refused before anything was written there: no agent was uploaded behind the link
    assert not (top / "real" / "state").exists()


def test_a_symlink_on_the_way_is_followed_only_where_no_other_user_can_replace_it(lab, place):
    top, hosts = place
    (top / "safe").mkdir(mode=0o755)
    # root's link in a directory only root may write
    (top / "safe" / "link").symlink_to(top / "real")
    # root's link in a sticky directory: only root's to move
    (top / "sticky" / "rootlink").symlink_to(top / "real")
    # another user's link there
    proc = as_nobody("ln", "-s", str(top / "real"), str(top / "sticky" / "theirs"))
    assert proc.returncode == 0, proc.stderr
    hosts.write_text(
        host_yaml(
            lab,
            {
                "safe01": {"state_dir": top / "safe" / "link" / "state1"},
                "sticky01": {"state_dir": top / "sticky" / "rootlink" / "state2"},
                "theirs01": {"state_dir": top / "sticky" / "theirs" / "state3"},
            },
        )
    )
    for host in ("safe01", "sticky01"):
        rc, doc, both = fab_json_output(lab.root, "-H", host, "ping")
        assert rc == 0, both
    refused(
        lab,
        "theirs01",
        f"{top / 'sticky' / 'theirs'} (a symlink on the way to",
        f"owned by uid {NOBODY}",
    )
    assert not (top / "real" / "state3").exists()


def _race(lab, place, host: str, point: str, attack) -> tuple[int, str, bool]:
    """`fab -H host extract --job numbers` with `point` armed to pause; if the node reaches it,
    `attack()` runs while it waits there, then the point is released. Returns (exit status, output,
    whether it was reached)."""
    node = lab.node("lab01")
    arm(node, {point: {"action": "pause", "seconds": 120}})
    hit = hit_file(node, point)
    hit.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabric",
            "-H",
            host,
            "extract",
            "--job",
            "numbers",
            "--playbook",
            JOBS,
            "--json",
        ],
        cwd=lab.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        reached = (
            wait_for(
                lambda: "hit" if hit.exists() else ("ended" if proc.poll() is not None else None),
                f"{point} or the end of the command",
                timeout=300,
            )
            == "hit"
        )
        if reached:
            attack()
            hit.unlink()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        disarm(node)
    return proc.returncode, out + err, reached


def test_another_user_swapping_the_link_as_the_keeper_starts_never_gets_code_run(lab, place):
    """The issue's reproduction, deterministic: uid 65534 points the state dir's link at its own
    copy of the agent's name while the node is about to start the job's keeper."""
    top, hosts = place
    shared, marker = top / "shared", top / "marks" / "PWNED"
    hosts.write_text(host_yaml(lab, {"sym01": {"state_dir": shared / "link" / "state"}}))
    attacker = top / "attacker.py"
    attacker.write_text(
        "import os, sys\nS, zipdata, name, job = sys.argv[1:5]\nos.makedirs(S + "
        "'/evil/state/bin', exist_ok=True)\nos.makedirs(S + '/evil/state/jobs/' + job)\nopen(S + "
        "'/evil/state/bin/' + name, 'wb').write(open(zipdata, 'rb').read())\nos.symlink(S + "
        "'/evil', S + '/.swap')\nos.rename(S + '/.swap', S + '/link')\n"
    )
    attacker.chmod(0o644)
    zipdata = top / "marks" / "planted.zip"
    zipdata.write_bytes(planted_zip(marker))
    zipdata.chmod(0o644)

    def swap() -> None:
        # The agent's name and the job's id are anyone's to see once the keeper runs (`ps` shows its
        # command): root reads them here, as the attacker who won the race (its copy of the job's
        # dir lets the keeper start).
        (name,) = [p.name for p in (top / "real" / "state" / "bin").glob("*.pyz")]
        job = json.loads((top / "real" / "state" / "jobs" / "current.json").read_text())["id"]
        proc = as_nobody(sys.executable, "-I", str(attacker), str(shared), str(zipdata), name, job)
        assert proc.returncode == 0, proc.stderr

    rc, out, reached = _race(lab, place, "sym01", "job.keeper.launch", swap)
    assert not marker.exists(), f"{marker.read_text()}\n{out}"
    # refused before the agent ran: the keeper was never about to start
    assert rc == 1 and not reached, out
    assert f"{shared} (on the way to" in out, out


def _shipped(node) -> Path:
    zips = sorted(
        (node.state_dir / "bin").glob("fleetops-agent-*.pyz"), key=lambda p: p.stat().st_mtime_ns
    )
    assert zips, "no agent zip on the node"
    return zips[-1]


def _swap_in(target: Path, data: bytes) -> None:
    """Replace the zip's bytes under its name (a rename: the running agent, which holds its verified
    bytes, is not touched), as something on the node that changed it would."""
    tmp = target.with_name(target.name + ".swap")
    tmp.write_bytes(data)
    tmp.chmod(0o600)
    tmp.replace(target)


@pytest.mark.parametrize(
    "role, job, point",
    [("keeper", "numbers", "job.keeper.launch"), ("extract", "badmodel", "job.wrapper.start")],
)
def test_a_process_a_job_starts_runs_only_the_agent_bytes_the_client_sent(
    lab, place, role, job, point
):
    top, _ = place
    node = lab.node("lab01")
    # the agent of this checkout on the node
    rc, _, both = fab_json_output(lab.root, "-H", "lab01", "ping")
    assert rc == 0, both
    marker = top / "marks" / f"{role}-ran"
    target = _shipped(node)
    real = target.read_bytes()
    arm(node, {point: {"action": "pause", "seconds": 120}})
    hit = hit_file(node, point)
    hit.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabric",
            "-H",
            "lab01",
            "extract",
            "--job",
            job,
            "--playbook",
            JOBS,
            "--json",
        ],
        cwd=lab.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        wait_for(lambda: hit.exists() or proc.poll() is not None, f"failpoint {point}", timeout=300)
        assert hit.exists(), proc.communicate()
        _swap_in(target, planted_zip(marker))
        hit.unlink()
        out, err = proc.communicate(timeout=300)
        # the job started; what its extract process did is in its log, and in its end
        if role == "extract":
            job_dir = Path(json.loads(out)["results"][0]["data"]["job"]["log"]).parent
            wait_for(lambda: (job_dir / "exit.json").exists(), "the job's end", timeout=120)
            time.sleep(0.5)
            log = (job_dir / "output.log").read_text()
            assert not marker.exists(), f"{marker.read_text()}\n{log}"
            assert f"{target} is not the agent fleetops sent" in log, log
            assert json.loads((job_dir / "exit.json").read_text())["exit_code"] == 3
        else:  # the job was never started: the keeper's bootstrap refused, and `extract` says why
            assert not marker.exists(), f"{marker.read_text()}\n{out}{err}"
            (result,) = json.loads(out)["results"]
            assert proc.returncode == 1 and result["status"] == "failed", out + err
            assert "its keeper refused to run" in result["msg"], result["msg"]
            assert f"{target} is not the agent fleetops sent" in result["msg"], result["msg"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        disarm(node)
        _swap_in(target, real)
        run_fab(lab.root, "-H", "lab01", "stop", "--grace", "1")
