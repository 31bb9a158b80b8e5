"""Re-runs that are safe, on real lab nodes: a roll-out stopped by --serial names the hosts it never
ran in its re-run line and in @failed; patch and rollback refuse while a job of the node runs from
the files they would change (`--while-running` overrides); `extract` on a finished output does
nothing (`--again` redoes it); `extract tail` while the job runs attaches to it; a folded run shows
each job's id the moment it starts."""

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
    target.write_text(
        target.read_text().replace("kv_cache_groups=kv_cache_groups,", "kv_cache_groups=mine,")
    )


def rerun_line(stdout: str) -> str:
    line = next((x for x in stdout.splitlines() if x.startswith("re-run ")), None)
    assert line is not None, stdout
    return line.split(": ", 1)[1]


@pytest.fixture
def idle(lab):
    """Both nodes with no job and no extraction output; whatever a test starts is stopped after
    it."""
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
    assert sorted(re.findall(r"^(lab0\d) \| patch \| changed", proc.stdout, re.M)) == [
        "lab01",
        "lab02",
    ], proc.stdout


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
    # already applied: nothing to write, nothing refused
    same = run_fab(lab.root, "-H", "lab01", "patch")
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
    with Follower(
        lab.root, ["-H", "lab01", "extract", "--job", "gated", "--playbook", JOBS, "tail"], ENV
    ) as f:
        wait_for(
            lambda: any("already running" in x for x in f.lines) or f.proc.poll() is not None,
            "extract to find the running job",
        )
        (Path(job["log"]).parent / "go").touch()
        rc = f.proc.wait(timeout=120)
        time.sleep(0.2)
        out = "\n".join(f.lines + f.errors)
    assert rc == 0, out
    assert re.search(rf"lab01 \| extract \| ok \| .*{job['id']}.* already running", out), out
    assert "line 119" in out and re.search(
        r"lab01 \| tail \| ok \| job gated-\S+ succeeded", out
    ), out
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
    assert re.search(
        r"lab01 \| extract \| ok \| .*already complete \(64/64 samples", proc.stdout
    ), proc.stdout
    assert "--again" in proc.stdout
    # no job, no model loaded
    assert sorted(p.name for p in jobs_dir.iterdir() if p.is_dir()) == [first]
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


def test_a_killed_extract_again_has_a_way_out_every_next_keeps_again(idle):
    lab = idle
    node = lab.node("lab01")
    jobs_dir = node.state_dir / "jobs"
    output = node.state_dir / "hidden-states"
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch", "extract", "tail", timeout=900)
    assert rc == 0, doc
    first = {r["task"]: r for r in doc["results"]}["extract"]["data"]["job"]["id"]
    # The GPU gate refuses an --again: its next: is the same extract, --again kept.
    lab.set_gpu_state(node, "busy")
    try:
        rc, doc = fab_json(lab.root, "-H", "lab01", "extract", "--again")
    finally:
        lab.set_gpu_state(node, "idle")
    r = doc["results"][0]
    assert rc == 10 or rc == 1, r
    assert (
        r["status"] == "failed"
        and r["data"]["next"]["commands"][-1] == "fab -H lab01 extract --again"
    ), r
    # The --again run is SIGKILLed (as the OOM killer does) at its start, before it redid a sample.
    points = node.faults_dir / "failpoints.json"
    points.write_text(json.dumps({"extract.start": {"action": "kill"}}))
    try:
        rc, doc = fab_json(lab.root, "-H", "lab01", "extract", "--again", "tail", timeout=900)
    finally:
        points.unlink()
    killed = {r["task"]: r for r in doc["results"]}["extract"]["data"]["job"]["id"]
    assert rc == 1 and killed != first, doc
    rc, doc = fab_json(lab.root, "-H", "lab01", "status")
    r = doc["results"][0]
    assert rc == 1 and r["data"]["state"] == "killed", r
    assert "fab -H lab01 extract --again" in r["data"]["next"]["commands"], r["data"]["next"]
    rc, doc = fab_json(lab.root, "-H", "lab01", "diagnose")
    found = next(
        f
        for f in doc["results"][0]["data"]["findings"]
        if f["area"] in ("job", "oom") and killed in f["msg"]
    )
    assert "fab -H lab01 extract --again" in found["next"], found
    # The earlier run's complete output does not hide the killed one: a plain extract says so, and
    # how out.
    rc, doc = fab_json(lab.root, "-H", "lab01", "extract")
    r = doc["results"][0]
    assert rc == 1 and r["status"] == "failed", r
    assert (
        f"the latest run on it, job {killed} (extract --again), ended killed (signal 9)" in r["msg"]
    ), r["msg"]
    assert "already complete" not in r["msg"] and r["data"]["next"]["commands"] == [
        "fab -H lab01 extract --again"
    ]
    # nothing launched
    assert sorted(p.name for p in jobs_dir.iterdir() if p.is_dir()) == sorted([first, killed])
    # The way out, as the next: says: the redo runs, and status is no longer failed.
    rc, doc = fab_json(lab.root, "-H", "lab01", "extract", "--again", "tail", timeout=900)
    assert rc == 0, doc
    redo = {r["task"]: r for r in doc["results"]}["extract"]["data"]["job"]["id"]
    rc, doc = fab_json(lab.root, "-H", "lab01", "status")
    assert rc == 0 and doc["results"][0]["data"]["state"] == "succeeded", doc
    # jobs: each job's own part of the output, by the manifest; never the directory's size on every
    # row.
    rc, doc = fab_json(lab.root, "-H", "lab01", "jobs")
    rows = {row[0]: row for row in doc["results"][0]["data"]["table"]["rows"]}
    manifest = json.loads((output / "manifest.json").read_text())
    size = sum((output / s["file"]).stat().st_size for s in manifest["samples"].values())
    assert all(s["run"] == len(manifest["runs"]) - 1 for s in manifest["samples"].values())
    by_id = {j["id"]: j for j in doc["results"][0]["data"]["jobs"]}
    assert by_id[redo]["output_bytes"] == size and by_id[redo]["output_samples"] == 64, by_id[redo]
    assert by_id[killed]["output_samples"] == 0 and by_id[first]["output_samples"] == 0, (
        by_id[killed],
        by_id[first],
    )
    assert rows[redo][7].endswith("(64 samples)") and rows[killed][7] == "0 B (0 samples)", rows
    # fetch: what belongs to the job asked for; the killed job never wrote a manifest.
    dest = lab.root / "fetched-again"
    rc, doc = fab_json(lab.root, "-H", "lab01", "fetch", "--job-id", killed, "--dest", str(dest))
    assert rc == 0 and not (dest / "lab01" / killed / "manifest.json").exists(), doc
    notes = [i["msg"] for i in doc["results"][0]["items"] if i["label"] == "note"]
    assert any(
        n.startswith(f"no manifest of job {killed}: the one in {output} is of ") for n in notes
    ), notes
    rc, doc = fab_json(lab.root, "-H", "lab01", "fetch", "--job-id", redo, "--dest", str(dest))
    got = json.loads((dest / "lab01" / redo / "manifest.json").read_text())
    assert rc == 0 and got["runs"][-1]["job"] == redo, doc


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

            # Every job waits at line 60 for a file in its own job dir: with no id on screen yet,
            # tail cannot end, so the ids have to be shown while the jobs run.
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
