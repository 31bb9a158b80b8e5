"""SSH trust, secrets and the audit log, against real lab sshd nodes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, fab_json, run_fab

from fleetops import audit

pytestmark = pytest.mark.lab
JOBS = str(REPO / "tests" / "playbooks" / "jobs.yaml")
TOKEN = "hf_SuperSecretToken1234567"
PASSPHRASE = "correct horse battery staple"


def host_entry(lab, name: str, known_hosts: Path, extra: str = "") -> str:
    node = lab.node("lab01")
    return (
        f"hosts:\n  {name}:\n    address: 127.0.0.1\n    port: {node.port}\n    user: "
        f"{lab.user}\n    identity_file: {lab.client_key}\n    known_hosts: {known_hosts}\n    "
        f"python: {node.python}\n    state_dir: {node.state_dir}\n"
        f"    gpus: 2\n    groups: [lab]\n{extra}"
    )


def test_unknown_host_key_is_refused_until_the_operator_names_its_fingerprint(lab, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    extra = lab.root / "hosts" / "newhost.yaml"
    extra.write_text(host_entry(lab, "newhost", known))
    real = lab.node("lab01").host_key.with_suffix(".pub").read_text().split()
    try:
        rc, doc = fab_json(lab.root, "-H", "newhost", "ping")
        assert rc == 4 and "unknown host key" in doc["results"][0]["msg"]
        # The node's real fingerprint, from its key file (not from the message under test), must be
        # named.
        offered = subprocess.run(
            ["ssh-keygen", "-lf", str(lab.node("lab01").host_key.with_suffix(".pub"))],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[1]
        assert offered.startswith("SHA256:") and offered in doc["results"][0]["msg"], doc[
            "results"
        ][0]["msg"]
        rc, doc = fab_json(lab.root, "-H", "newhost", "trust")
        # The offered key is shown to compare, never as a ready `trust --fingerprint` to paste
        # unchecked.
        msg = doc["results"][0]["msg"]
        assert (
            rc == 1
            and offered in msg
            and f"--fingerprint {offered}" not in msg
            and known.read_text() == ""
        )
        rc, doc = fab_json(
            lab.root, "-H", "newhost", "trust", "--fingerprint", "SHA256:not-the-right-one"
        )
        assert rc == 1 and "nothing trusted" in doc["results"][0]["msg"] and known.read_text() == ""
        rc, doc = fab_json(lab.root, "-H", "newhost", "trust", "--fingerprint", offered)
        assert rc == 0 and doc["results"][0]["status"] == "changed"
        assert known.read_text().split()[1:3] == real[:2]
        rc, doc = fab_json(lab.root, "-H", "newhost", "trust", "ping")
        assert rc == 0 and doc["results"][0]["msg"].startswith("host key already in known_hosts")
    finally:
        extra.unlink()


def test_changed_host_key_is_refused_by_trust_too(lab, tmp_path):
    other = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known = tmp_path / "known_hosts"
    known.write_text(
        f"[127.0.0.1]:{lab.node('lab01').port} "
        + " ".join(other.with_suffix(".pub").read_text().split()[:2])
        + "\n"
    )
    extra = lab.root / "hosts" / "changed.yaml"
    extra.write_text(host_entry(lab, "changed", known))
    try:
        rc, doc = fab_json(lab.root, "-H", "changed", "trust", "--fingerprint", "SHA256:whatever")
    finally:
        extra.unlink()
    assert rc == 1 and "host key CHANGED" in doc["results"][0]["msg"]
    msg = doc["results"][0]["msg"]
    # known_hosts' key, the one offered, and the one command that replaces it (only with --replace
    # and only for the fingerprint named): the named 'SHA256:whatever' is never added.
    assert "known_hosts has SHA256:" in msg and "trust --replace --fingerprint SHA256:" in msg, msg
    assert "whatever" not in known.read_text()


def test_secrets_never_appear_in_output_json_or_audit_log(lab, tmp_path):
    enc = tmp_path / "enc_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-f", str(enc)], check=True
    )
    auth = lab.node("lab01").dir / "authorized_keys"
    original = auth.read_text()
    auth.write_text(original + enc.with_suffix(".pub").read_text())
    extra = lab.root / "hosts" / "secret.yaml"
    entry = host_entry(
        lab,
        "secretnode",
        lab.known_hosts,
        "    identity_passphrase: {secret_from_env: FLEETOPS_TEST_PASSPHRASE}\n"
        f"    env:\n      HF_TOKEN: {{secret: {TOKEN}}}\n",
    )
    extra.write_text(entry.replace(str(lab.client_key), str(enc)))
    env = {"FLEETOPS_TEST_PASSPHRASE": PASSPHRASE}
    try:
        human = run_fab(
            lab.root,
            "-H",
            "secretnode",
            "ping",
            "extract",
            "--job",
            "showtoken",
            "--playbook",
            JOBS,
            "tail",
            "--job",
            "showtoken",
            "--playbook",
            JOBS,
            "status",
            "logs",
            env=env,
        )
        assert human.returncode == 0, human.stdout + human.stderr
        rc, doc = fab_json(lab.root, "-H", "secretnode", "logs", "status", env=env)
        assert rc == 0
        text = json.dumps(doc)
        hist = run_fab(lab.root, "history", "--host", "secretnode", "--json", env=env)
    finally:
        extra.unlink()
        auth.write_text(original)
    assert "token is [secret]" in human.stdout  # the job printed it; fleetops masked it
    assert "token is [secret]" in text
    records = json.loads(hist.stdout)
    assert records and {r["task"] for r in records} >= {"ping", "extract", "tail", "status", "logs"}
    everything = human.stdout + human.stderr + text + hist.stdout + audit.log_path().read_text()
    assert TOKEN not in everything and PASSPHRASE not in everything
    job = json.loads(
        Path(doc["results"][1]["data"]["job"]["log"]).with_name("job.json").read_text()
    )
    assert (
        job["shown_env"]["HF_TOKEN"] == "[secret]"
        and "HF_TOKEN" not in doc["results"][1]["data"]["job"]
    )


def test_audit_log_has_one_line_per_task_run_and_history_filters_by_host(lab):
    # An older lab01 entry first, so `--last 2` has something to leave out.
    assert run_fab(lab.root, "-H", "lab01", "ping").returncode == 0
    before = len(audit.read())
    rc, _ = fab_json(lab.root, "-H", "lab01,lab02", "patch", "verify", "--kinds", "grep")
    assert rc == 0
    every = audit.read()[before:]
    records = [r for r in every if r["result"] != "started"]  # a patch's intent line comes first
    assert len(records) == 4
    assert [(r["host"], r["result"]) for r in every if r["task"] == "patch"].count(
        ("lab01", "started")
    ) == 1
    rec = next(r for r in records if r["host"] == "lab01" and r["task"] == "patch")
    assert set(rec) >= {
        "time",
        "operator",
        "host",
        "task",
        "playbook",
        "playbook_sha256",
        "result",
        "changed",
        "duration_s",
    }
    assert rec["playbook"] == "speculators-0.3.0-vllm-0.16" and len(rec["playbook_sha256"]) == 64
    assert rec["result"] == "changed" and rec["changed"] is True and rec["operator"].count("@") == 1
    proc = run_fab(lab.root, "history", "--host", "lab02", "--json")
    only = json.loads(proc.stdout)
    assert only and all(r["host"] == "lab02" for r in only)
    lab01 = [r for r in audit.read() if r["host"] == "lab01"]
    assert [(r["task"], r["result"]) for r in lab01[-4:]] == [
        ("ping", "ok"),
        ("patch", "started"),
        ("patch", "changed"),
        ("verify", "ok"),
    ]
    proc = run_fab(lab.root, "history", "--host", "lab01", "--last", "2", "--json")
    # exactly the 2 newest, in order
    assert proc.returncode == 0 and json.loads(proc.stdout) == lab01[-2:]
    table = run_fab(lab.root, "history", "--host", "lab01", "--last", "2", env={"COLUMNS": "400"})
    assert table.returncode == 0 and "lab02" not in table.stdout
    rows = [
        [cell.strip() for cell in line.split("│")]
        for line in table.stdout.splitlines()
        if "│" in line
    ]
    hosts_tasks = [(row[3], row[4]) for row in rows if len(row) > 4 and row[3]]
    assert hosts_tasks == [("lab01", "patch"), ("lab01", "verify")], table.stdout
    assert os.environ["FLEETOPS_AUDIT_LOG"] == str(audit.log_path())
