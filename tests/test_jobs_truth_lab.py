"""On a lab of its own: jobs that tell the truth under faults, and `tail` for people.

- launching is atomic per node: 20 rounds of two simultaneous `extract` launch exactly one job each
  round;
- a job's liveness comes from its own processes (each carries FLEETOPS_JOB_DIR in its environment):
  after its wrapper is SIGKILLed `status` says running while it runs, `extract` refuses a second
  job, and the true end (its real exit status) is recorded; with wrapper and keeper both killed,
  `stop --job-id` still stops it;
- `stop` leaves no tagged process, a child that left the group with `setsid` included;
- a full disk (a tmpfs this module mounts over the node's jobs/ and fills itself; root only) is
  reported as ENOSPC, not as `lost`;
- `tail` attaching to a job an earlier command launched shows the last 20 lines then follows
  (`extract tail` in one command starts at the first line), `--from-start` replays, `--lines N`; on
  a terminal (a pty) the per-host progress bar is redrawn in place and the live table never says
  `queued`;
- `lab.down` stops the lab's jobs first.

Every claim is checked against the node's own evidence (/proc, the job's files), never against the
tool's answer alone."""

from __future__ import annotations

import errno
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, fab_json, run_fab
from polling import Follower, proc_state, wait_for

pytestmark = pytest.mark.lab
ENV = {"PYTHONPATH": str(REPO), "COLUMNS": "300"}
GONE = ("gone", "Z")
# 6 launch rounds: 3 raced as users race them, 3 with the node's check-to-launch window widened to 1
# s, where both clients' preflights pass and only the node's launch lock can refuse one (one such
# round proves the lock; three keep `by_node_lock >= 1` from hanging on scheduling).
# FLEETOPS_LAUNCH_ROUNDS=20 is the longer soak.
ROUNDS = int(os.environ.get("FLEETOPS_LAUNCH_ROUNDS") or 6)

# {job_dir} is filled in on the node; each job waits for <job_dir>/go (at most 300 s) where a test
# needs it.
WAIT_GO = (
    "import os, time\ndeadline = time.time() + 300\n"
    "while not os.path.exists('{job_dir}/go') and time.time() < deadline:\n    time.sleep(0.05)\n"
)
SCRIPTS = {
    "sleeper": "print('started', flush=True)\n" + WAIT_GO + "raise SystemExit(3)\n",
    "escaper": (
        "import os, subprocess, time\nkid = subprocess.Popen(['sleep', '300'])\n"
        "runaway = subprocess.Popen(['sleep', '301'], start_new_session=True)\n"
        "print(f'child {kid.pid} runaway {runaway.pid}', flush=True)\ntime.sleep(300)\n"
    ),
    "chatty": (
        "import time\nfor i in range(200):\n    print(f'line {i}', flush=True)\n"
        + WAIT_GO
        + "for i in range(200, 220):\n    print(f'line {i}', flush=True)\n    time.sleep(0.02)\n"
    ),
    # After go: 4 KiB lines until the log's filesystem refuses them (ENOSPC), then exit 1.
    "diskfill": (
        "import sys\n" + WAIT_GO + "try:\n    for i in range(100000):\n"
        "        sys.stdout.write('x' * 4095 + '\\n')\n        sys.stdout.flush()\n"
        "except OSError:\n    import os\n    os._exit(1)\n"
    ),
    # Writes nothing after go and exits 0: the only write left is the wrapper's exit record.
    "quietend": "print('started', flush=True)\n" + WAIT_GO,
    # Progress in the extraction's format: 8 steps of 8/64, 0.4 s apart, after go; then a failure
    # line.
    "slowbar": (
        "import time\nprint('warming up', flush=True)\n" + WAIT_GO + "for k in range(1, 9):\n"
        "    print(f'progress samples={8 * k}/64 batch={k}/8 tok/s={250.0 * k:.1f} "
        "eta={10.5 * (8 - k):.1f}s', flush=True)\n    time.sleep(0.4)\n"
        "print('Traceback (most recent call last): a failure line', flush=True)\n"
    ),
}
# YAML 1.2 is a superset of JSON: the playbook is written as JSON, its scripts kept readable above.
PLAYBOOK = json.dumps(
    {
        "name": "truth-jobs",
        "jobs": {
            name: {
                "kind": "command",
                "command": ["{python}", "-c", script],
                "preflight": [],
                "gpu_gate": False,
            }
            for name, script in SCRIPTS.items()
        },
    },
    indent=1,
)


@pytest.fixture(scope="module")
def truth_lab(lab_factory):
    # A lab of its own: a test here stops the whole lab (lab.down) and another mounts a tmpfs on a
    # node.
    with lab_factory.own("truth", 1) as lab:
        (lab.root / "truth-jobs.yaml").write_text(PLAYBOOK)
        yield lab


@pytest.fixture
def lab(truth_lab):
    node = truth_lab.node("lab01")
    truth_lab.start_node(node)
    run_fab(truth_lab.root, "-H", "lab01", "stop", "--grace", "1")
    for pid in [p for pids in tag_index(node.state_dir).values() for p in pids]:
        os.kill(pid, signal.SIGKILL)  # whatever a failed test left
    yield truth_lab


def tag_index(state_dir: Path) -> dict[str, list[int]]:
    """Independently of the tool: every live process whose environment names a job dir under
    state_dir."""
    out: dict[str, list[int]] = {}
    prefix = f"FLEETOPS_JOB_DIR={state_dir}/jobs/".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if proc_state(int(entry)) in GONE:
            continue
        for var in env.split(b"\0"):
            if var.startswith(prefix):
                out.setdefault(var.split(b"=", 1)[1].decode(), []).append(int(entry))
    return out


def extract(lab, name: str, *extra: str) -> tuple[int, dict]:
    return fab_json(
        lab.root, "-H", "lab01", "extract", "--job", name, "--playbook", "truth-jobs.yaml", *extra
    )


def start(lab, name: str) -> dict:
    rc, doc = extract(lab, name)
    assert rc == 0, doc
    return doc["results"][0]["data"]["job"]


def job_dir(job: dict) -> Path:
    return Path(job["log"]).parent


def wait_log(job: dict, pattern: str, what: str, timeout: float = 120) -> re.Match:
    rx = re.compile(pattern, re.M)
    log = Path(job["log"])
    return wait_for(
        lambda: rx.search(log.read_text() if log.exists() else ""), f"{what} in {log}", timeout
    )


def status(lab, *extra: str) -> tuple[int, dict]:
    rc, doc = fab_json(lab.root, "-H", "lab01", "status", *extra)
    return rc, doc["results"][0]


# ---------------------------------------------------------------- launching is atomic
def test_two_simultaneous_extracts_launch_exactly_one_job_each_round(lab):
    """Two `extract` at once, ROUNDS times. In the second half the node sleeps 1 s between its
    running check and the launch (failpoint job.launch): without the launch lock both would pass the
    check in that window."""
    node = lab.node("lab01")
    jobs_root = node.state_dir / "jobs"
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "300"}
    launched_per_round, by_node_lock = [], 0
    try:
        for n in range(ROUNDS):
            widened = n >= ROUNDS // 2
            hit = node.faults_dir / "failpoint-job.launch.hit"
            hit.unlink(missing_ok=True)
            if widened:
                node.faults_dir.mkdir(mode=0o700, exist_ok=True)
                (node.faults_dir / "failpoints.json").write_text(
                    json.dumps({"job.launch": {"action": "sleep", "seconds": 1}})
                )
            before = (
                {p.name for p in jobs_root.iterdir() if p.is_dir()} if jobs_root.exists() else set()
            )
            procs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "fabric",
                        "-H",
                        "lab01",
                        "extract",
                        "--job",
                        "sleeper",
                        "--playbook",
                        "truth-jobs.yaml",
                        "--json",
                    ],
                    cwd=lab.root,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for _ in range(2)
            ]
            outs = [p.communicate(timeout=600) for p in procs]
            results = [json.loads(out)["results"][0] for out, _ in outs]
            launched = [r for r in results if r["status"] == "changed"]
            other = [r for r in results if r["status"] != "changed"]
            # the node's evidence
            made = sorted({p.name for p in jobs_root.iterdir() if p.is_dir()} - before)
            launched_per_round.append(len(launched))
            assert len(launched) == 1 and len(made) == 1, (n, [r["msg"] for r in results], made)
            job = launched[0]["data"]["job"]
            # The other found the same job running and left it alone (its `tail` would attach to
            # it).
            assert made == [job["id"]] and [p.returncode for p in procs].count(0) == 2
            assert other[0]["status"] == "ok", other[0]
            assert f"job {job['id']} (sleeper) is already running" in other[0]["msg"], other[0][
                "msg"
            ]
            # found by the node under the lock, not by the preflight
            if "on this node" in other[0]["msg"]:
                by_node_lock += 1
            if widened:  # the window was really open: the launching agent slept in it
                assert hit.exists()
            (node.faults_dir / "failpoints.json").unlink(missing_ok=True)
            (job_dir(job) / "go").touch()  # end it (exit 3) before the next round
            ended = job_dir(job) / "exit.json"
            wait_for(ended.exists, "the round's job to end", 120)
    finally:
        (node.faults_dir / "failpoints.json").unlink(missing_ok=True)
    print(
        f"\nlaunch rounds: {ROUNDS}, launched per round: {launched_per_round}, found running by "
        f"the node's launch lock (both passed the client's preflight): {by_node_lock}"
    )
    # In the widened rounds both clients' preflights ran while no job existed yet at least once: the
    # lock decided.
    assert by_node_lock >= 1, by_node_lock


# ---------------------------------------------------------------- liveness from the processes
def test_wrapper_sigkilled_status_says_running_then_the_true_end(lab):
    job = start(lab, "sleeper")
    wait_log(job, r"^started$", "the job's first line")
    os.kill(job["wrapper_pid"], signal.SIGKILL)
    wait_for(lambda: proc_state(job["wrapper_pid"]) in GONE, "the wrapper to die")
    assert proc_state(job["pid"]) not in GONE
    rc, r = status(lab)
    assert rc == 0 and r["data"]["state"] == "running", r
    assert job["pid"] in r["data"]["tagged"], r["data"]
    # No second job beside it: extract finds it running (its tail would attach to it) and launches
    # nothing.
    rc, doc = extract(lab, "sleeper")
    assert (
        rc == 0 and f"job {job['id']} (sleeper) is already running" in doc["results"][0]["msg"]
    ), doc
    assert sorted(
        p.name
        for p in (lab.node("lab01").state_dir / "jobs").iterdir()
        if p.is_dir() and p.name.startswith("sleeper-") and not (p / "exit.json").exists()
    ) == [job["id"]]
    (job_dir(job) / "go").touch()  # the job ends on its own with exit status 3
    wait_for(lambda: proc_state(job["pid"]) in GONE, "the job to end")
    rc, r = status(lab)
    ended = json.loads((job_dir(job) / "exit.json").read_text())
    assert ended["exit_code"] == 3 and ended["by"] == "keeper", ended
    assert rc == 1 and r["data"]["state"] == "failed" and r["data"]["exit"]["exit_code"] == 3, r
    assert f"its wrapper (pid {job['wrapper_pid']}) died first (signal 9)" in r["msg"], r["msg"]
    rc, doc = fab_json(lab.root, "-H", "lab01", "tail")
    assert rc == 1 and "failed (exit status 3)" in doc["results"][0]["msg"], doc["results"][0][
        "msg"
    ]


def test_wrapper_and_keeper_sigkilled_stop_still_stops_the_running_job(lab):
    job = start(lab, "sleeper")
    wait_log(job, r"^started$", "the job's first line")
    for pid in (job["wrapper_pid"], job["keeper_pid"]):
        os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: all(proc_state(p) in GONE for p in (job["wrapper_pid"], job["keeper_pid"])),
        "wrapper and keeper to die",
    )
    rc, r = status(lab)
    assert rc == 0 and r["data"]["state"] == "running", r
    assert "nothing will record its exit status" in r["msg"], r["msg"]
    rc, doc = fab_json(lab.root, "-H", "lab01", "stop", "--job-id", job["id"], "--grace", "30")
    r = doc["results"][0]
    assert rc == 0 and r["status"] == "changed", r
    assert "had ended" not in r["msg"] and r["msg"].startswith(
        f"stopped job {job['id']} with SIGTERM"
    ), r["msg"]
    assert proc_state(job["pid"]) in GONE
    assert str(job_dir(job)) not in tag_index(lab.node("lab01").state_dir)


def _job_finding(lab) -> tuple[int, dict, dict]:
    rc, doc = fab_json(lab.root, "-H", "lab01", "diagnose")
    result = doc["results"][0]
    return rc, result, next(f for f in result["data"]["findings"] if f["area"] == "job")


def test_a_job_ended_by_stop_is_stopped_everywhere_and_status_exits_0(lab):
    job = start(lab, "sleeper")
    wait_log(job, r"^started$", "the job's first line")
    rc, doc = fab_json(lab.root, "-H", "lab01", "stop", "--grace", "30")
    assert rc == 0 and doc["results"][0]["msg"].startswith(
        f"stopped job {job['id']} with SIGTERM"
    ), doc
    ended = json.loads((job_dir(job) / "exit.json").read_text())  # the node's own record of the end
    assert ended["signal"] == signal.SIGTERM and ended["by"] == "stop", ended
    rc, r = status(lab)
    assert rc == 0 and r["status"] == "ok" and r["data"]["state"] == "stopped", r
    assert "stopped by fleetops' `stop` (signal 15)" in r["msg"] and "killed" not in r["msg"], r[
        "msg"
    ]
    assert r["data"]["next"] is None, r["data"]["next"]
    rc, doc = fab_json(lab.root, "-H", "lab01", "tail", "--job-id", job["id"])
    assert rc == 0 and "stopped by fleetops' `stop`" in doc["results"][0]["msg"], doc["results"][0]
    rc, doc = fab_json(lab.root, "-H", "lab01", "jobs")
    assert rc == 0 and doc["results"][0]["data"]["table"]["rows"][0][:3] == [
        job["id"],
        "sleeper",
        "stopped",
    ], doc
    _, _, found = _job_finding(lab)
    assert found["verdict"] == "OK" and "stopped" in found["msg"], found


def test_a_job_sigkilled_by_another_is_failed_in_status_and_in_diagnose_alike(lab):
    job = start(lab, "sleeper")
    wait_log(job, r"^started$", "the job's first line")
    os.kill(job["pid"], signal.SIGKILL)  # not fleetops' stop: someone (or something) else
    wait_for(lambda: (job_dir(job) / "exit.json").exists(), "the wrapper's exit record")
    rc, r = status(lab)
    assert rc == 1 and r["status"] == "failed" and r["data"]["state"] == "killed", r
    rc, result, found = _job_finding(lab)
    assert found["verdict"] == "WARN" and "killed by signal 9" in found["msg"], found
    # The recap counts the host as its exit status says: failed, never "1 ok" beside exit 20.
    assert rc >= 20 and result["status"] == "failed", (rc, result["status"], result["msg"])
    plain = run_fab(lab.root, "-H", "lab01", "diagnose")
    assert "1 host: 0 ok, 0 changed, 1 failed" in plain.stdout, plain.stdout


def test_stop_leaves_no_tagged_process_a_setsid_child_included(lab):
    job = start(lab, "escaper")
    m = wait_log(job, r"^child (\d+) runaway (\d+)$", "the job's children")
    kid, runaway = int(m[1]), int(m[2])
    # The runaway really left: its own session and group, not the job's.
    stat = Path(f"/proc/{runaway}/stat").read_text().rsplit(")", 1)[1].split()
    assert (
        int(stat[2]) != job["pgid"] and int(stat[3]) != job["pgid"] and int(stat[3]) == runaway
    ), stat
    tagged = tag_index(lab.node("lab01").state_dir)[str(job_dir(job))]
    assert {job["pid"], kid, runaway} <= set(tagged), tagged
    rc, doc = fab_json(lab.root, "-H", "lab01", "stop", "--grace", "30")
    r = doc["results"][0]
    assert rc == 0 and r["status"] == "changed", r
    assert (
        "also ended 1 processes outside its group, "
        f"found by their FLEETOPS_JOB_DIR tag: [{runaway}]"
    ) in r["msg"]
    for pid in (job["pid"], kid, runaway, job["wrapper_pid"], job["keeper_pid"]):
        assert proc_state(pid) in GONE, f"pid {pid} survived stop ({proc_state(pid)})"
    assert str(job_dir(job)) not in tag_index(lab.node("lab01").state_dir)


# ---------------------------------------------------------------- a full disk
def _mount_full_jobs_dir(node) -> Path:
    jobs_root = node.state_dir / "jobs"
    jobs_root.mkdir(exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(jobs_root)], check=True
    )
    return jobs_root


def _fill(path: Path) -> None:
    """Fill the filesystem of `path` and prove it: a new 4 KiB write fails with ENOSPC."""
    subprocess.run(["dd", "if=/dev/zero", f"of={path / 'filler'}", "bs=4096"], capture_output=True)
    with pytest.raises(OSError) as exc:
        (path / "probe").write_bytes(b"x" * 4096)
    assert exc.value.errno == errno.ENOSPC


@pytest.mark.root("mounting a tmpfs needs root")
def test_disk_full_is_reported_as_enospc_not_lost(lab):
    node = lab.node("lab01")
    jobs_root = _mount_full_jobs_dir(node)
    try:
        # 1. The job's log fills the disk: the job fails, and the end says why.
        job = start(lab, "diskfill")
        _fill(jobs_root)
        (job_dir(job) / "go").touch()  # an empty file needs no block
        wait_for(lambda: (job_dir(job) / "exit.json").exists(), "the wrapper's exit record", 120)
        rc, r = status(lab)
        assert rc == 1 and r["data"]["state"] == "failed", r
        assert (
            "ENOSPC (No space left on device)" in r["msg"] and "filesystem was full" in r["msg"]
        ), r["msg"]
        assert "lost" not in r["msg"]
        # 2. Nothing but the exit record is left to write on a full disk: it is still recorded
        #    (space reserved
        # at launch), and the end is the job's own (exit 0), with the full disk named.
        (jobs_root / "filler").unlink()
        (jobs_root / "probe").unlink(missing_ok=True)
        job = start(lab, "quietend")
        wait_log(job, r"^started$", "the job's first line")
        _fill(jobs_root)
        (job_dir(job) / "go").touch()
        wait_for(lambda: (job_dir(job) / "exit.json").exists(), "the wrapper's exit record", 120)
        rc, r = status(lab)
        assert (
            rc == 0 and r["data"]["state"] == "succeeded" and r["data"]["exit"]["exit_code"] == 0
        ), r
        assert "ENOSPC" in r["msg"], r["msg"]
    finally:
        run_fab(lab.root, "-H", "lab01", "stop", "--grace", "1")
        subprocess.run(["umount", str(jobs_root)], check=True)


def test_a_job_that_ends_while_its_state_is_read_is_never_called_lost(lab):
    """Seen once in a loaded run of test_tail_reattach_...: the job's end read as "lost: its wrapper
    is gone and left no exit status". job_state read exit.json (not there yet), then found no job
    process and no wrapper: the wrapper had written exit.json and exited in between. The failpoint
    holds the status read right after its first look at exit.json while the job ends and its wrapper
    and keeper exit."""
    node = lab.node("lab01")
    job = start(lab, "quietend")
    wait_log(job, r"^started$", "the job's first line")
    node.faults_dir.mkdir(mode=0o700, exist_ok=True)
    hit = node.faults_dir / "failpoint-job.state.read.hit"
    hit.unlink(missing_ok=True)
    (node.faults_dir / "failpoints.json").write_text(
        json.dumps({"job.state.read": {"action": "pause", "seconds": 120}})
    )
    env = {**os.environ, **ENV}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabric", "-H", "lab01", "status", "--json"],
        cwd=lab.root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: hit.exists() or proc.poll() is not None,
            "the status read to pause after exit.json",
            180,
        )
        assert hit.exists(), proc.communicate()
        (job_dir(job) / "go").touch()
        wait_for((job_dir(job) / "exit.json").exists, "the wrapper's exit record", 120)
        recorded = json.loads((job_dir(job) / "job.json").read_text())
        supervisors = [recorded["wrapper_pid"], recorded["keeper_pid"]]
        wait_for(
            lambda: all(proc_state(pid) in ("gone", "Z") for pid in supervisors),
            "the job's wrapper and keeper to exit",
            120,
        )
    finally:
        (node.faults_dir / "failpoints.json").unlink(missing_ok=True)
        hit.unlink(missing_ok=True)  # the paused read goes on
    out, err = proc.communicate(timeout=300)
    result = json.loads(out)["results"][0]
    assert result["data"]["state"] == "succeeded" and proc.returncode == 0, (result["msg"], err)


# ---------------------------------------------------------------- tail for people
def _lab01_lines(text: str) -> list[int]:
    return [int(m[1]) for m in re.finditer(r"^lab01 \| line (\d+)$", text, re.M)]


def test_tail_reattach_shows_the_last_20_lines_then_follows(lab):
    # launched by one command, attached to by later ones: the on-call use
    job = start(lab, "chatty")
    wait_log(job, r"^line 199$", "the job's first 200 lines")
    # The first tail of a job it did not launch: the last 20 lines, said so; Ctrl-C detaches it.
    with Follower(lab.root, ["-H", "lab01", "tail"], ENV) as first:
        first.wait_line(r"^lab01 \| line 199$", "the first attach to show line 199")
        assert _lab01_lines(first.text()) == list(range(180, 200)), first.text()[-2000:]
        assert re.search(
            r"^lab01 \| job \S+: 180 earlier lines not shown \(\d+ bytes\); --from-start replays",
            first.text(),
            re.M,
        ), first.text()
        first.proc.send_signal(signal.SIGINT)
        rc, out, _ = first.finish(timeout=120)
    assert rc == 130 and _lab01_lines(out) == list(range(180, 200)), out[-2000:]
    # The re-attach: the same rule, then it follows the job to its end.
    with Follower(lab.root, ["-H", "lab01", "tail"], ENV) as again:
        again.wait_line(r"^lab01 \| line 199$", "the re-attach to show line 199")
        shown = _lab01_lines(again.text())
        assert shown == list(range(180, 200)), shown
        assert re.search(
            r"^lab01 \| job \S+: 180 earlier lines not shown \(\d+ bytes\); --from-start replays",
            again.text(),
            re.M,
        ), again.text()
        (job_dir(job) / "go").touch()
        rc, out, err = again.finish(timeout=300)
    assert rc == 0, out + err
    assert _lab01_lines(out) == list(range(180, 220)), _lab01_lines(out)
    replay = run_fab(lab.root, "-H", "lab01", "tail", "--from-start", env={"COLUMNS": "300"})
    assert replay.returncode == 0 and _lab01_lines(replay.stdout) == list(range(220)), (
        replay.stdout[-1000:]
    )
    assert "earlier lines not shown" not in replay.stdout, replay.stdout[-1000:]
    five = run_fab(lab.root, "-H", "lab01", "tail", "--lines", "5", env={"COLUMNS": "300"})
    assert five.returncode == 0 and _lab01_lines(five.stdout) == list(range(215, 220)), five.stdout[
        -1000:
    ]


def test_tail_right_after_extract_in_one_command_starts_at_the_first_line(lab):
    """`extract tail`: the tail follows the job its own command launched, and nothing of it was
    shown yet."""
    current = lab.node("lab01").state_dir / "jobs" / "current.json"
    before = current.read_text() if current.exists() else None
    args = ["-H", "lab01", "extract", "--job", "chatty", "--playbook", "truth-jobs.yaml", "tail"]
    with Follower(lab.root, args, ENV) as both:
        both.wait_line(r"^lab01 \| line 199$", "extract tail to show line 199")
        # the job this command launched is the node's current one
        assert current.read_text() != before
        job_id = json.loads(current.read_text())["id"]
        (current.parent / job_id / "go").touch()
        rc, out, err = both.finish(timeout=300)
    assert rc == 0, out + err
    assert _lab01_lines(out) == list(range(220)), _lab01_lines(out)
    assert "earlier lines not shown" not in out, out[-2000:]


def _read_pty(fd: int, proc: subprocess.Popen, until: float) -> bytes:
    out = b""
    while time.monotonic() < until:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    return out


ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def test_tail_on_a_terminal_redraws_a_progress_bar_in_place_and_never_says_queued(lab):
    job = start(lab, "slowbar")
    wait_log(job, r"^warming up$", "the job's first line")
    leader, follower = pty.openpty()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "COLUMNS": "160",
        "LINES": "40",
        "TERM": "xterm-256color",
    }
    env.pop("FLEETOPS_NO_LIVE", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabric", "-H", "lab01", "tail"],
        cwd=lab.root,
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        close_fds=True,
    )
    os.close(follower)
    try:
        seen = b""
        deadline = time.monotonic() + 120
        while b"warming up" not in ANSI.sub(b"", seen) and time.monotonic() < deadline:
            seen += _read_pty(leader, proc, time.monotonic() + 1)
        assert b"warming up" in ANSI.sub(b"", seen), seen[-2000:]
        (job_dir(job) / "go").touch()
        seen += _read_pty(leader, proc, time.monotonic() + 180)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    text = ANSI.sub(b"", seen).decode("utf-8", "replace")
    assert proc.returncode == 0, text[-3000:]
    streaming = text[text.index("warming up") :]
    assert "queued" not in streaming, streaming[-3000:]
    # The live view's rows while streaming: the host's task is the tail of its job, its state
    # running.
    assert re.search(rf"lab01\s+│\s+tail {re.escape(job['id'])}\s+│\s+running", streaming), (
        streaming[-3000:]
    )
    # The bar's rows (host, state, bar, samples, tok/s, ETA): several frames, drawn over each other.
    frames = re.findall(
        r"lab01\s+│\s+(\w+)\s+│\s+\S+\s+│\s+(\d+)/64\s+│\s+(\d+)\s+│\s+(\d+:\d\d)", streaming
    )
    done = [int(f[1]) for f in frames]
    assert len(set(done)) >= 4 and done == sorted(done) and done[-1] == 64, frames
    for _state, d, rate, _eta in frames:
        assert int(rate) == 250 * (int(d) // 8), frames
    assert re.search(rb"\x1b\[\d*A", seen), "no cursor-up: the bar was not redrawn in place"
    assert not re.search(r"lab01 \| \[[#.]+\]", text), (
        "the piped form (a bar before each line) on a terminal"
    )
    # Failure lines stand out: bold red.
    assert re.search(rb"\x1b\[1;31m\| Traceback \(most recent call last\): a failure line", seen), (
        seen[-2000:]
    )


def test_tail_piped_prints_plain_progress_lines(lab):
    job = start(lab, "slowbar")
    (job_dir(job) / "go").touch()
    proc = run_fab(lab.root, "-H", "lab01", "tail", "--from-start", env={"COLUMNS": "300"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "\x1b[" not in proc.stdout and "queued" not in proc.stdout
    bars = re.findall(
        r"^lab01 \| \[#*\.*\] (\d+)/64 \d+% (\d+) tok/s ETA \d+:\d\d progress samples=",
        proc.stdout,
        re.M,
    )
    assert [int(b[0]) for b in bars] == [8 * k for k in range(1, 9)], proc.stdout


# ---------------------------------------------------------------- lab.down
def test_lab_down_stops_the_lab_jobs_first(lab):
    node = lab.node("lab01")
    job = start(lab, "escaper")
    m = wait_log(job, r"^child (\d+) runaway (\d+)$", "the job's children")
    pids = [job["pid"], int(m[1]), int(m[2]), job["wrapper_pid"], job["keeper_pid"]]
    assert all(proc_state(p) not in GONE for p in pids)
    lab.down()  # not purged: the module's lab comes back up below
    try:
        assert [p for p in pids if proc_state(p) not in GONE] == []
        assert tag_index(node.state_dir) == {}
        ended = json.loads((job_dir(job) / "exit.json").read_text())
        assert ended["signal"] in (signal.SIGTERM, signal.SIGKILL), ended
    finally:
        lab.start_node(node)
