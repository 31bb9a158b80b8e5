"""Re-runs that are safe, on real lab nodes: a roll-out stopped by --serial names the hosts it never ran in its
re-run line and in @failed; patch and rollback refuse while a job of the node runs from the files they would
change (`--while-running` overrides); `extract` on a finished output does nothing (`--again` redoes it);
`extract tail` while the job runs attaches to it; a folded run shows each job's id the moment it starts."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from conftest import GENERATOR, REPO, fab_json, run_fab
from polling import Follower, wait_for

pytestmark = pytest.mark.lab
JOBS = str(REPO / "tests" / "playbooks" / "jobs.yaml")
ENV = {"PYTHONPATH": str(REPO), "COLUMNS": "200"}
UNPATCHED = "kv_cache_specs=kv_cache_spec,"


def drift(lab, name: str) -> None:
    target = lab.node(name).module_file(GENERATOR)
    target.write_text(target.read_text().replace("kv_cache_groups=kv_cache_groups,", "kv_cache_groups=mine,"))


def rerun_line(stdout: str) -> str:
    line = next((x for x in stdout.splitlines() if x.startswith("re-run ")), None)
    assert line is not None, stdout
    return line.split(": ", 1)[1]


@pytest.fixture
def idle(lab):
    """Both nodes with no job and no extraction output; whatever a test starts is stopped after it."""
    for node in lab.nodes():
        for sub in ("hidden-states", "jobs"):
            subprocess.run(["rm", "-rf", str(node.state_dir / sub)], check=True)
    yield lab
    for node in lab.nodes():
        run_fab(lab.root, "-H", node.name, "stop", "--grace", "1")


def start(lab, host: str, job: str) -> dict:
    rc, doc = fab_json(lab.root, "-H", host, "extract", "--job", job, "--playbook", JOBS)
    assert rc == 0, doc
    return doc["results"][0]["data"]["job"]


def test_a_stopped_rollout_names_its_skipped_hosts_in_the_rerun_line_and_failed(lab):
    drift(lab, "lab01")
    first = run_fab(lab.root, "-H", "lab01,lab02", "patch", "--serial", "1")
    assert first.returncode == 1, first.stdout + first.stderr
    assert "skipped: roll-out stopped after batch 1" in first.stdout
    command = rerun_line(first.stdout)
    assert "lab[01-02]" in command, command  # lab02 never ran: it is as much to do again as lab01
    saved = (lab.root / ".fleetops" / "last-failed").read_text().splitlines()
    assert saved[0] == "lab[01-02]", saved

    lab.reset_packages(lab.node("lab01"))  # the cause fixed, the printed command is followed
    again = run_fab(lab.root, *shlex.split(command)[1:])
    assert again.returncode == 0, again.stdout + again.stderr
    for name in ("lab01", "lab02"):  # nothing left unpatched behind a clean exit
        assert UNPATCHED not in lab.node(name).module_file(GENERATOR).read_text(), name
    assert not (lab.root / ".fleetops" / "last-failed").exists()


def test_at_failed_names_the_hosts_a_stopped_rollout_never_ran(lab):
    drift(lab, "lab01")
    assert run_fab(lab.root, "-H", "lab01,lab02", "patch", "--serial", "1").returncode == 1
    lab.reset_packages(lab.node("lab01"))
    proc = run_fab(lab.root, "-H", "@failed", "patch", "--no-fold")  # a line per host
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(re.findall(r"^(lab0\d) \| patch \| changed", proc.stdout, re.M)) == ["lab01", "lab02"], proc.stdout


def test_patch_and_rollback_refuse_while_a_job_runs_from_the_files(idle):
    lab = idle
    target = lab.node("lab01").module_file(GENERATOR)
    job = start(lab, "lab01", "spawner")
    pristine = target.read_bytes()

    refused = run_fab(lab.root, "-H", "lab01", "patch")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert job["id"] in refused.stdout and "--while-running" in refused.stdout, refused.stdout
    assert target.read_bytes() == pristine  # nothing written under the running job
    check = run_fab(lab.root, "-H", "lab01", "patch", "--check")  # a look changes nothing: allowed
    assert check.returncode == 0, check.stdout + check.stderr

    forced = run_fab(lab.root, "-H", "lab01", "patch", "--while-running")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert UNPATCHED not in target.read_text()
    same = run_fab(lab.root, "-H", "lab01", "patch")  # already applied: nothing to write, nothing refused
    assert same.returncode == 0, same.stdout + same.stderr

    patched = target.read_bytes()
    back = run_fab(lab.root, "-H", "lab01", "rollback")
    assert back.returncode == 1 and job["id"] in back.stdout, back.stdout + back.stderr
    assert target.read_bytes() == patched

    assert run_fab(lab.root, "-H", "lab01", "stop", "--grace", "1").returncode == 0
    back = run_fab(lab.root, "-H", "lab01", "rollback")
    assert back.returncode == 0, back.stdout + back.stderr
    assert target.read_bytes() == pristine


def test_extract_tail_while_the_job_runs_attaches_to_it(idle):
    lab = idle
    job = start(lab, "lab01", "gated")
    log = Path(job["log"])
    wait_for(lambda: log.exists() and "line 59" in log.read_text(), "the job at its gate")
    with Follower(lab.root, ["-H", "lab01", "extract", "--job", "gated", "--playbook", JOBS, "tail"], ENV) as f:
        wait_for(lambda: any("already running" in x for x in f.lines) or f.proc.poll() is not None,
                 "extract to find the running job")
        (Path(job["log"]).parent / "go").touch()
        rc = f.proc.wait(timeout=120)
        time.sleep(0.2)
        out = "\n".join(f.lines + f.errors)
    assert rc == 0, out
    assert re.search(rf"lab01 \| extract \| ok \| .*{job['id']}.* already running", out), out
    assert "line 119" in out and re.search(r"lab01 \| tail \| ok \| job gated-\S+ succeeded", out), out
    jobs = sorted(p.name for p in (lab.node("lab01").state_dir / "jobs").iterdir() if p.is_dir())
    assert jobs == [job["id"]], jobs  # no second job was launched


def test_extract_on_a_complete_output_does_nothing_and_again_redoes_it(idle):
    lab = idle
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch", "extract", "tail", timeout=900)
    assert rc == 0, doc
    first = {r["task"]: r for r in doc["results"]}["extract"]["data"]["job"]["id"]
    jobs_dir = lab.node("lab01").state_dir / "jobs"
    manifest = lab.node("lab01").state_dir / "hidden-states" / "manifest.json"
    assert len(json.loads(manifest.read_text())["samples"]) == 64

    started = time.monotonic()
    proc = run_fab(lab.root, "-H", "lab01", "extract")
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"lab01 \| extract \| ok \| .*already complete \(64/64 samples", proc.stdout), proc.stdout
    assert "--again" in proc.stdout
    assert sorted(p.name for p in jobs_dir.iterdir() if p.is_dir()) == [first]  # no job, no model loaded
    assert took < 60, took

    rc, doc = fab_json(lab.root, "-H", "lab01", "extract", "--again", "tail", timeout=900)
    assert rc == 0, doc
    by = {r["task"]: r for r in doc["results"]}
    again = by["extract"]["data"]["job"]["id"]
    assert again != first
    log = (jobs_dir / again / "output.log").read_text()
    assert "done: 64/64 samples" in log and "0 to go" not in log, log[-2000:]
    runs = json.loads(manifest.read_text())["runs"]
    assert runs[-1]["job"] == again and runs[-1]["already_done"] == 0, runs[-1]


@pytest.fixture(scope="module")
def lab4(lab_factory):
    return lab_factory.shared(4, __name__)


def test_a_folded_extract_tail_shows_each_job_id_when_its_job_starts(lab4):
    lab = lab4
    hosts = [n.name for n in lab.nodes()]
    assert len(hosts) == 4
    args = ["-H", "lab[01-04]", "extract", "--job", "gated", "--playbook", JOBS, "tail"]
    try:
        with Follower(lab.root, args, ENV) as f:
            def ids() -> dict[str, str]:
                found = {}
                for line in list(f.lines):
                    m = re.match(r"(lab0\d)\b.*\bjob (gated-[0-9A-Za-z_-]+)", line)
                    if m:
                        found[m.group(1)] = m.group(2)
                return found if set(found) == set(hosts) else {}

            # Every job waits at line 60 for a file in its own job dir: with no id on screen yet, tail cannot
            # end, so the ids have to be shown while the jobs run.
            seen = wait_for(ids, "every host's job id while the jobs run", timeout=120)
            assert f.proc.poll() is None
            for host, job_id in seen.items():
                (lab.node(host).state_dir / "jobs" / job_id / "go").touch()
            rc = f.proc.wait(timeout=300)
            out = "\n".join(f.lines + f.errors)
        assert rc == 0, out
    finally:
        for host in hosts:
            run_fab(lab.root, "-H", host, "stop", "--grace", "1")
