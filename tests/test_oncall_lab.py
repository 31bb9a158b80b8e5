"""On-call from a laptop, and secrets on the job side, against real lab sshd nodes: `fetch` (the
latest job's log and manifest, --path, refusals, a 200 MB copy killed mid-transfer and resumed,
sha256 from the node against an independent hash), `jobs` after several runs and unknown --job-id
answers that list the real ids, `ssh-config` read back by paramiko and used by the real OpenSSH
client, and secret env values that never stay on the node's disk.

A module of its own with a 2-node lab (a throwaway project), so big files and killed clients never
touch the session's shared lab."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest
from conftest import REPO, fab_json, run_fab, sha256
from polling import wait_for

from fleetops.lab import Lab
from fleetops.plans.inventory import load_inventory
from fleetops.wire.ssh import _fabric_connection, _known_hosts_files

pytestmark = pytest.mark.lab
PLAYBOOK = str(REPO / "tests" / "playbooks" / "oncall.yaml")
ENV = {"PYTHONPATH": str(REPO), "COLUMNS": "200"}
BIG = 200 * 1000 * 1000


@pytest.fixture(scope="module")
def lab2(lab_factory):
    lab = lab_factory.shared(2, __name__)
    yield lab
    for node in lab.nodes():
        run_fab(lab.root, "-H", node.name, "stop", "--grace", "1")


@pytest.fixture
def lab(lab2):
    for node in lab2.nodes():
        lab2.start_node(node)
    shutil.rmtree(lab2.root / "fetched", ignore_errors=True)
    return lab2


def run_job(lab: Lab, host: str, job: str) -> str:
    """extract + tail of a test playbook job, to its end; returns the job id."""
    rc, doc = fab_json(
        lab.root,
        "-H",
        host,
        "extract",
        "--job",
        job,
        "-p",
        PLAYBOOK,
        "tail",
        "--job",
        job,
        "-p",
        PLAYBOOK,
    )
    assert rc == 0, json.dumps(doc, indent=1)
    return [r for r in doc["results"] if r["task"] == "extract"][0]["data"]["job"]["id"]


def fetched(doc: dict, host: str) -> dict:
    return [r for r in doc["results"] if r["host"] == host and r["task"] == "fetch"][0]


# ---------------------------------------------------------------- item 3: jobs, unknown ids
def test_jobs_after_three_runs_newest_first_and_unknown_id_lists_the_real_ones(lab):
    node = lab.node("lab01")
    shutil.rmtree(node.state_dir / "jobs", ignore_errors=True)
    ids = [run_job(lab, "lab01", "quick") for _ in range(3)]
    rc, doc = fab_json(lab.root, "-H", "lab01", "jobs")
    assert rc == 0, doc
    data = doc["results"][0]["data"]
    listed = data["jobs"]
    assert [j["id"] for j in listed] == ids[::-1]  # newest first
    assert data["total"] == 3 and data["latest"] == ids[-1]
    for job in listed:
        log = node.state_dir / "jobs" / job["id"] / "output.log"
        assert (
            job["name"] == "quick" and job["state"] == "succeeded" and job["exit"]["exit_code"] == 0
        ), job
        assert job["log_bytes"] == log.stat().st_size and log.read_text().count("quick line") == 5
        assert job["runtime_s"] is not None and job["runtime_s"] >= 0
    human = run_fab(lab.root, "-H", "lab01", "jobs", env=ENV)
    assert human.returncode == 0, human.stdout + human.stderr
    where = [human.stdout.index(i) for i in ids[::-1]]
    assert where == sorted(where), human.stdout  # the table too is newest first
    assert human.stdout.count("succeeded") == 3 and "3 jobs, newest first" in human.stdout

    # `status --job-id nope` names the node's jobs, not only "no job 'nope'".
    for task in ("status", "logs", "tail"):
        proc = run_fab(lab.root, "-H", "lab01", task, "--job-id", "nope", env=ENV)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        line = next(x for x in proc.stdout.splitlines() if x.startswith(f"lab01 | {task} | failed"))
        assert (
            "no job 'nope' on this node; its jobs, newest first: " + ", ".join(ids[::-1]) in line
        ), line
        assert "Traceback" not in proc.stdout + proc.stderr


def test_jobs_on_a_node_without_jobs_says_how_to_start_one(lab):
    node = lab.node("lab02")
    if any((node.state_dir / "jobs").glob("*/job.json")):
        shutil.rmtree(node.state_dir / "jobs")
    rc, doc = fab_json(lab.root, "-H", "lab02", "jobs")
    assert rc == 0 and doc["results"][0]["data"]["jobs"] == []
    assert (
        "no jobs on this node" in doc["results"][0]["msg"]
        and "fab -H lab02 extract" in doc["results"][0]["msg"]
    )


# ---------------------------------------------------------------- item 2: fetch
def test_fetch_default_is_the_latest_jobs_log_and_manifest_per_host_in_parallel(lab):
    n1, n2 = lab.node("lab01"), lab.node("lab02")
    quick = run_job(lab, "lab01", "quick")
    # the lab's tiny model on the CPU: writes a manifest
    extract = run_job(lab, "lab02", "tinyextract")
    manifest = n2.state_dir / "oncall-hidden-states" / "manifest.json"
    assert json.loads(manifest.read_text())["runs"][-1]["job"] == extract
    rc, doc = fab_json(lab.root, "-H", "lab01,lab02", "fetch")
    assert rc == 0, json.dumps(doc, indent=1)
    out = lab.root / "fetched"
    expected = {
        out / "lab01" / quick / "output.log": n1.state_dir / "jobs" / quick / "output.log",
        out / "lab02" / extract / "output.log": n2.state_dir / "jobs" / extract / "output.log",
        out / "lab02" / extract / "manifest.json": manifest,
    }
    assert sorted(p for p in out.rglob("*") if p.is_file()) == sorted(expected)
    for local, remote in expected.items():
        assert local.read_bytes() == remote.read_bytes(), local
        assert stat.S_IMODE(local.stat().st_mode) == 0o600
    for host, job in (("lab01", quick), ("lab02", extract)):
        r = fetched(doc, host)
        assert r["status"] == "changed" and r["data"]["job_id"] == job
        for f in r["data"]["files"]:
            assert f["sha256"] == sha256(Path(f["remote"])) == sha256(Path(f["local"]))
    notes = [i["msg"] for i in fetched(doc, "lab01")["items"] if i["label"] == "note"]
    assert notes == [f"no manifest: job {quick} is a command job (only extract jobs write one)"]
    # Again: nothing to copy, and it says why.
    rc, doc = fab_json(lab.root, "-H", "lab02", "fetch")
    r = fetched(doc, "lab02")
    assert rc == 0 and r["status"] == "ok" and "nothing to do" in r["msg"], r
    assert all(f["fetched_bytes"] == 0 and "same sha256" in f["msg"] for f in r["data"]["files"])
    # --job-id picks an older job; an unknown one lists the real ids.
    rc, doc = fab_json(lab.root, "-H", "lab02", "fetch", "--job-id", "nope")
    assert rc == 1 and f"its jobs, newest first: {extract}" in fetched(doc, "lab02")["msg"]


def test_fetch_of_200_mb_killed_mid_transfer_resumes_and_sha256_matches(lab, tmp_path):
    node = lab.node("lab01")
    big = node.state_dir / "big.bin"
    digest = hashlib.sha256()
    with open(big, "wb") as f:
        for _ in range(BIG // (1 << 20)):
            chunk = os.urandom(1 << 20)
            digest.update(chunk)
            f.write(chunk)
        tail = os.urandom(BIG % (1 << 20))
        digest.update(tail)
        f.write(tail)
    want = digest.hexdigest()
    dest = tmp_path / "dl"
    part = dest / "lab01" / "state" / "big.bin.part"
    seed = int.from_bytes(os.urandom(4), "big")
    cut = random.Random(seed).randint(BIG // 10, BIG * 9 // 10)
    print(f"kill the client once {cut} of {BIG} bytes are written (seed {seed})")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabric",
            "-H",
            "lab01",
            "fetch",
            "--path",
            str(big),
            "--dest",
            str(dest),
        ],
        cwd=lab.root,
        env={**os.environ, **ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: part.exists() and part.stat().st_size >= cut,
            f"{cut} bytes in {part}",
            timeout=600,
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    partial = part.stat().st_size
    assert cut <= partial < BIG, (cut, partial)
    assert not (dest / "lab01" / "state" / "big.bin").exists()
    rc, doc = fab_json(lab.root, "-H", "lab01", "fetch", "--path", str(big), "--dest", str(dest))
    assert rc == 0, json.dumps(doc, indent=1)
    f = fetched(doc, "lab01")["data"]["files"][0]
    assert f["resumed_from"] == partial and f["fetched_bytes"] == BIG - partial, f
    assert f["sha256"] == want and f"resumed at byte {partial}" in f["msg"]
    final = dest / "lab01" / "state" / "big.bin"
    # independent of fleetops' own hashes
    assert final.stat().st_size == BIG and sha256(final) == want
    assert not part.exists()
    big.unlink()


def test_fetch_starts_over_when_the_partial_copy_is_of_other_bytes(lab, tmp_path):
    node = lab.node("lab01")
    src = node.state_dir / "medium.bin"
    src.write_bytes(os.urandom(3 << 20))
    part = tmp_path / "dl" / "lab01" / "state" / "medium.bin.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(os.urandom(1 << 20))  # a prefix of something else
    proc = run_fab(
        lab.root,
        "-H",
        "lab01",
        "fetch",
        "--path",
        str(src),
        "--dest",
        str(tmp_path / "dl"),
        env=ENV,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "the partial copy did not match the node's file; downloading it again from byte 0"
        in proc.stdout
    )
    assert (part.parent / "medium.bin").read_bytes() == src.read_bytes() and not part.exists()
    src.unlink()


def test_fetch_refuses_paths_outside_and_symlink_escapes(lab, tmp_path):
    node = lab.node("lab01")
    state = node.state_dir
    outside = tmp_path / "outside-secret.txt"
    outside.write_text("not for fetch\n")
    links = {
        state / "escape-file": outside,
        state / "escape-dir": tmp_path,
        state / "inside-link": state / "lab-data" / "prompts.jsonl",
    }
    for link, target in links.items():
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    dest = tmp_path / "dl"
    try:
        cases = {
            str(outside): "outside the state and job directories",
            str(
                state / ".." / ".." / outside.relative_to("/")
            ): "outside the state and job directories",
            str(state / "escape-file"): "a symlink that leads outside",
            "escape-file": "a symlink that leads outside",  # relative: to the node's state dir
            "jobs/../escape-file": "a symlink that leads outside",
            "../../../" + str(outside.relative_to("/")): "outside the state and job directories",
            str(state / "escape-dir" / outside.name): "a symlink that leads outside",
        }
        for path, why in cases.items():
            rc, doc = fab_json(
                lab.root, "-H", "lab01", "fetch", "--path", path, "--dest", str(dest)
            )
            r = fetched(doc, "lab01")
            assert (
                rc == 1 and r["status"] == "failed" and why in r["msg"] and "refused" in r["msg"]
            ), (path, r)
            assert "--any-path" in r["msg"]
            assert not dest.exists() or not any(p.is_file() for p in dest.rglob("*")), list(
                dest.rglob("*")
            )
        # A symlink that stays inside is fine; --any-path lifts the rule (for what the login user
        # may read).
        rc, doc = fab_json(
            lab.root,
            "-H",
            "lab01",
            "fetch",
            "--path",
            str(state / "inside-link"),
            "--dest",
            str(dest),
        )
        assert rc == 0, doc
        got = Path(fetched(doc, "lab01")["data"]["files"][0]["local"])
        assert got.read_bytes() == (state / "lab-data" / "prompts.jsonl").read_bytes()
        rc, doc = fab_json(
            lab.root,
            "-H",
            "lab01",
            "fetch",
            "--path",
            str(outside),
            "--any-path",
            "--dest",
            str(dest),
        )
        assert rc == 0, doc
        got = Path(fetched(doc, "lab01")["data"]["files"][0]["local"])
        assert (
            got == dest / "lab01" / "other" / outside.relative_to("/")
            and got.read_text() == "not for fetch\n"
        )
    finally:
        for link in links:
            link.unlink(missing_ok=True)


# ---------------------------------------------------------------- secrets (job side)
def test_secret_env_values_never_stay_on_the_nodes_disk(lab):
    node = lab.node("lab01")
    secret = 'oncall-secret-Tök"en-4242'
    rc, doc = fab_json(lab.root, "-H", "lab01", "extract", "--job", "secretwait", "-p", PLAYBOOK)
    assert rc == 0, doc
    job = doc["results"][0]["data"]["job"]
    job_dir = node.state_dir / "jobs" / job["id"]
    log = job_dir / "output.log"
    line = wait_for(
        lambda: log.exists() and "token sha256" in log.read_text() and log.read_text(),
        "the job's first line",
    )
    # The job's process has the value (its hash and its environment say so) ...
    assert hashlib.sha256(secret.encode()).hexdigest() in line
    environ = Path(f"/proc/{job['pid']}/environ").read_bytes().split(b"\0")
    assert f"ONCALL_TOKEN={secret}".encode() in environ and b"PLAIN_VALUE=not-a-secret" in environ

    def on_disk() -> list[str]:
        hits = []
        for path in (node.state_dir / "jobs").rglob("*"):
            if path.is_file() and secret.encode() in path.read_bytes():
                hits.append(str(path))
        return hits

    # ... and no file of the node holds it while the job runs, nor after it ended (job.json must not
    # keep secret env values in plain text once the job ended).
    assert on_disk() == [] and not (job_dir / "secret-env.json").exists()
    saved = json.loads((job_dir / "job.json").read_text())
    assert "ONCALL_TOKEN" not in saved["env"] and saved["env"]["PLAIN_VALUE"] == "not-a-secret"
    assert (
        saved["secret_env_keys"] == ["ONCALL_TOKEN"]
        and saved["shown_env"]["ONCALL_TOKEN"] != secret
    )
    (job_dir / "go").touch()
    rc, doc = fab_json(lab.root, "-H", "lab01", "tail", "--job-id", job["id"])
    assert rc == 0 and doc["results"][0]["data"]["state"] == "succeeded", doc
    assert on_disk() == []


# ---------------------------------------------------------------- item 4: ssh-config
@pytest.fixture
def extra_hosts(lab, tmp_path):
    """A host behind a jump host (lab01 through lab02) and one whose key path has a blank in it."""
    n1 = lab.node("lab01")
    key = tmp_path / "key dir" / "id_ed25519"
    key.parent.mkdir()
    shutil.copy(lab.client_key, key)
    key.chmod(0o600)
    extra = lab.root / "hosts" / "oncall-extra.yaml"
    common = (
        f"    address: 127.0.0.1\n    port: {n1.port}\n    user: {lab.user}\n    known_hosts: "
        f"{lab.known_hosts}\n    python: {n1.python}\n    state_dir: {n1.state_dir}\n"
    )
    extra.write_text(
        f"hosts:\n  behind:\n{common}    identity_file: {lab.client_key}\n    jump: lab02\n"
        f"  spaced:\n{common}    identity_file: {key}\n    connect_timeout: 7\n"
    )
    yield ["behind", "spaced"]
    extra.unlink()


def test_ssh_config_round_trips_through_paramiko_to_what_fleetops_connects_with(lab, extra_hosts):
    proc = run_fab(lab.root, "ssh-config", env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    config = paramiko.SSHConfig.from_text(proc.stdout)
    inventory = load_inventory(lab.root / "hosts")
    assert set(inventory.names()) == {"lab01", "lab02", *extra_hosts}
    for name in inventory.names():
        host = inventory.hosts[name]
        got = config.lookup(name)
        # what fleetops itself would connect with (nothing opened)
        cxn = _fabric_connection(host, inventory)
        assert (got["hostname"], int(got["port"]), got["user"]) == (cxn.host, cxn.port, cxn.user), (
            name
        )
        # an inventory host logs in with its identity file's key, loaded once (or ssh-agent's copy
        # of it)
        keys = (
            [str(host.identity_file)] if host.identity_file else cxn.connect_kwargs["key_filename"]
        )
        assert got["identityfile"] == ([keys] if isinstance(keys, str) else list(keys)), name
        assert "pkey" in cxn.connect_kwargs or not host.identity_file, name
        assert got["identitiesonly"] == "yes"
        assert (
            cxn.connect_kwargs["look_for_keys"] is False
            and cxn.connect_kwargs["allow_agent"] is False
        )
        assert got["userknownhostsfile"] == _known_hosts_files(host, cxn)[0]
        assert got["stricthostkeychecking"] == "yes"
        assert int(got["connecttimeout"]) == cxn.connect_timeout
        if cxn.gateway is None:
            assert "proxyjump" not in got, name
        else:
            hop = config.lookup(got["proxyjump"])
            assert (hop["hostname"], int(hop["port"]), hop["user"]) == (
                cxn.gateway.host,
                cxn.gateway.port,
                cxn.gateway.user,
            ), name
    assert (
        "spaced" in proc.stdout and '"' in proc.stdout.split("Host spaced", 1)[1].split("\n\n")[0]
    )
    # --host narrows it, through the inventory's own words.
    only = run_fab(lab.root, "ssh-config", "--host", "lab0*", env=ENV)
    assert only.returncode == 0 and "Host lab01" in only.stdout and "Host behind" not in only.stdout
    bad = run_fab(lab.root, "ssh-config", "--host", "lab9", env=ENV)
    assert (
        bad.returncode == 2
        and "unknown host 'lab9'" in bad.stderr
        and "Traceback" not in bad.stderr
    )


def test_real_openssh_client_uses_the_printed_config_with_strict_host_keys(
    lab, extra_hosts, tmp_path
):
    ssh = shutil.which("ssh")
    assert ssh, "the OpenSSH client (ssh) is needed: Debian openssh-client"
    text = run_fab(lab.root, "ssh-config", env=ENV, check=True).stdout
    conf = tmp_path / "ssh_config"
    conf.write_text(text)
    n1 = lab.node("lab01")
    # direct, through ProxyJump lab02, a key path with a blank
    for name in ("lab01", "behind", "spaced"):
        proc = subprocess.run(
            [ssh, "-F", str(conf), "-o", "BatchMode=yes", name, "echo", "$SSH_CONNECTION"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, (name, proc.stderr)
        assert proc.stdout.split()[-1] == str(n1.port), (name, proc.stdout)
    # Saved by a shell redirection and pulled in by `Include` at the top of a config, as the header
    # says (`ssh -F <(fab ssh-config)` cannot work: ssh closes inherited descriptors before it reads
    # -F).
    saved = tmp_path / "fleetops.conf"
    main = tmp_path / "config"
    main.write_text(f"Include {saved}\n\nHost *\n    ServerAliveInterval 30\n")
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f"{sys.executable} -m fabric ssh-config > {saved} && {ssh} -F {main} "
            "-o BatchMode=yes lab02 'echo $SSH_CONNECTION'",
        ],
        cwd=lab.root,
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == str(lab.node("lab02").port)
    # A reader that is gone before it writes (as with `| head`, or ssh closing a `-F <(...)`): no
    # traceback.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "fabric", "ssh-config"],
            cwd=lab.root,
            env={**os.environ, **ENV},
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    # Strict: with a known_hosts that lacks the node's key, ssh refuses instead of adding it.
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    conf.write_text(text.replace(str(lab.known_hosts), str(empty)))
    proc = subprocess.run(
        [ssh, "-F", str(conf), "-o", "BatchMode=yes", "lab01", "true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 255 and "Host key verification failed" in proc.stderr, proc.stderr
    assert empty.read_text() == ""
