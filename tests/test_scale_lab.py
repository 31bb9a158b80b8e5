"""256 hosts from one client process, under a Mac laptop's default open-file limit (`ulimit -n
256`), against the large lab (fleetops/lab/scale.py: 256 real sshd-served hosts on loopback
addresses, each with its own venv and state dir). Asked for more hosts at once than the limit
allows, fleetops lowers its fan-out and says so; the client's open files, threads and memory stay
bounded (sampled from /proc while it runs), and every host answers: nothing is lost. Slow tier: a
lab test (~1 minute here)."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from conftest import REPO, make_project

from fleetops.lab.scale import ScaleLab

pytestmark = pytest.mark.lab

HOSTS = 256
NOFILE = 256
RSS_LIMIT_MB = 300


@pytest.fixture(scope="module")
def scale_project(lab_base, tmp_path_factory) -> Path:
    project = make_project(tmp_path_factory.mktemp("scale") / "project")
    lab = ScaleLab(project)
    lab.up(HOSTS, progress=lambda m: print(m, file=sys.stderr))
    try:
        yield project
    finally:
        lab.down(purge=True)


def _peak(pid: int, peak: dict, done: threading.Event) -> None:
    """The client's open files and threads, sampled until `done`."""
    while not done.is_set():
        try:
            fds = len(os.listdir(f"/proc/{pid}/fd"))
            threads = int(
                next(
                    x
                    for x in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if x.startswith("Threads:")
                ).split()[1]
            )
        except (OSError, StopIteration, ValueError):
            break
        peak["fds"], peak["threads"] = max(peak["fds"], fds), max(peak["threads"], threads)
        done.wait(0.02)


def fab_limited(project: Path, *args: str) -> tuple[int, str, str, dict]:
    """fab in `project` with the open-file limit at NOFILE (soft and hard); (rc, stdout, stderr,
    peaks): its open files and threads sampled from /proc, its peak RSS from its own rusage
    (os.wait4)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))

    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80", "FLEETOPS_NO_LIVE": "1"}
    peak = {"fds": 0, "threads": 0}
    done = threading.Event()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fabric", *args],
            cwd=project,
            env=env,
            text=True,
            stdout=out,
            stderr=err,
            preexec_fn=limit,
        )
        watcher = threading.Thread(target=_peak, args=(proc.pid, peak, done), daemon=True)
        watcher.start()
        _, status, usage = os.wait4(proc.pid, 0)
        # reaped here: Popen must not wait for it again
        proc.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        watcher.join()
        peak["rss_mb"] = usage.ru_maxrss / 1024
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read(), err.read(), peak


def screen_rows(text: str) -> int:
    return sum(max(1, -(-len(x) // 80)) for x in text.splitlines())


def test_256_hosts_under_256_open_files_all_answer_with_bounded_files_threads_and_memory(
    scale_project,
):
    rc, out, err, peak = fab_limited(scale_project, "-H", "@scale", "ping", "--forks", str(HOSTS))
    both = out + err
    assert rc == 0, both
    assert "Traceback" not in both and "Too many open files" not in both, both
    lowered = re.search(
        r"forks lowered from 256 to (\d+): this process may open 256 files \(ulimit -n\)", both
    )
    assert lowered, both
    forks = int(lowered.group(1))
    assert 8 <= forks < HOSTS
    assert f"{HOSTS} hosts: {HOSTS} ok, 0 changed, 0 failed, 0 unreachable" in both, both
    assert 0 < peak["fds"] <= NOFILE, peak
    # Per host at work a worker and paramiko's transport thread, which ends a moment after its link
    # closed (one closing while the next host's opens), and a few of the process's own: bounded by
    # forks, not hosts
    assert peak["threads"] <= 3 * forks + 16 < HOSTS, peak
    assert peak["rss_mb"] <= RSS_LIMIT_MB, peak


def test_a_check_over_256_hosts_loses_no_host_and_folds_to_one_screen(scale_project):
    rc, out, err, peak = fab_limited(scale_project, "-H", "@scale", "patch", "--check", "--json")
    assert "Traceback" not in out + err, err
    doc = json.loads(out)
    hosts = {r["host"] for r in doc["results"]}
    assert hosts == {f"scale{i:04d}" for i in range(1, HOSTS + 1)}, sorted(hosts)[:5]
    assert doc["exit_status"] == rc == 0 and not doc["failed_hosts"], err[-2000:]
    assert peak["fds"] <= NOFILE and peak["rss_mb"] <= RSS_LIMIT_MB, peak
    rc, out, err, _ = fab_limited(scale_project, "-H", "@scale", "patch", "--check")
    assert rc == 0 and f"{HOSTS} hosts: 0 ok, {HOSTS} changed" in out, out[-3000:] + err[-2000:]
    _, one, _, _ = fab_limited(scale_project, "-H", "scale0001", "patch", "--check")
    # the diff shown once for the fleet, not 256 times
    assert screen_rows(out) <= screen_rows(one) + 12, out
