"""Secrets are masked before any layout, against real lab nodes: four hosts (node01..node04) each
get an inventory token and a service URL that holds the host's own name
(`https://admin:Tr0ub4dor@node01:8443/v1`), and the playbook's job has a `secret_env` value of its
own. The job prints all of them (a progress line that status's table cuts, lines of their own, a
failure line) and fails. Every output of extract, tail, status, logs, diagnose and jobs (folded,
with --odd, at 80 and 152 columns, and --json), `history` and the audit log must hold no 8
characters in a row of any secret. And `run` of a command that prints each node's own URL (node01
and node02 on different sshd nodes): the hosts fold, and the URL never becomes `...@{host}:8443/v1`.
The same on the console alone: test_secret_layout_units.py."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import REPO, run_fab

pytestmark = pytest.mark.lab
PLAYBOOK = str(REPO / "tests" / "playbooks" / "secret-layout.yaml")
TOKEN = "hf_SUPERSECRETTOKENVALUE_abcdefghijklmnop"  # 41 characters, as in the defect
PB_SECRET = "pb-secret-value-Zq7Xw9Lm"  # the playbook's own secret_env value
HOSTS = ["node01", "node02", "node03", "node04"]
URLS = {h: f"https://admin:Tr0ub4dor@{h}:8443/v1" for h in HOSTS}
SECRETS = [TOKEN, PB_SECRET, *URLS.values()]
# the first PATH entry is the lab node's own bin/
PRINT_URL = 'cat "${PATH%%:*}/secret-layout-svc.env"'
WIDTHS = ("80", "152")


def leaks(text: str, n: int = 8) -> list[str]:
    """Every run of n characters of a secret found in `text`; and the URL with the folding
    placeholder."""
    found = {s[i : i + n] for s in SECRETS for i in range(len(s) - n + 1) if s[i : i + n] in text}
    return sorted(found | ({"Tr0ub4dor@{host}"} if "Tr0ub4dor@{host}" in text else set()))


def inventory(lab, tmp_path) -> str:  # fleetops.lab.Lab
    """Four hosts on the lab's two sshd nodes (node01, node03 on lab01), each with a state dir of
    its own and its own secrets."""
    out = ["hosts:"]
    for i, host in enumerate(HOSTS):
        node = lab.node("lab01" if i % 2 == 0 else "lab02")
        out += [
            f"  {host}:",
            "    address: 127.0.0.1",
            f"    port: {node.port}",
            f"    user: {lab.user}",
            f"    identity_file: {lab.client_key}",
            f"    known_hosts: {lab.known_hosts}",
            f"    python: {node.python}",
            f"    state_dir: {tmp_path / host / 'state'}",
            "    gpus: 2",
            "    env:",
            f"      HF_TOKEN: {{secret: {TOKEN}}}",
            f"      SVC_URL: {{secret: '{URLS[host]}'}}",
        ]
    return "\n".join(out) + "\n"


def test_no_secret_substring_in_any_output_at_80_and_152_columns(lab, tmp_path, monkeypatch):
    log = tmp_path / "audit.jsonl"
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(log))
    # logs has no --playbook: the run's playbook, as set
    monkeypatch.setenv("FLEETOPS_PLAYBOOK", PLAYBOOK)
    hosts_file = lab.root / "hosts" / "secret-layout.yaml"
    hosts_file.write_text(inventory(lab, tmp_path))
    printed = [lab.node(name).dir / "bin" / "secret-layout-svc.env" for name in ("lab01", "lab02")]
    for path, host in zip(printed, HOSTS):
        path.write_text(f"SVC_URL={URLS[host]}\n")
    where = ("-H", ",".join(HOSTS))
    runs: dict[str, subprocess.CompletedProcess] = {}
    try:
        for width in WIDTHS:
            runs[f"run {width}"] = run_fab(
                lab.root, *where, "run", PRINT_URL, "--odd", env={"COLUMNS": width}
            )
        runs["run --json"] = run_fab(lab.root, *where, "run", PRINT_URL, "--json")
        runs["extract"] = run_fab(
            lab.root, *where, "extract", "--job", "leak", env={"COLUMNS": "80"}
        )
        assert runs["extract"].returncode == 0, runs["extract"].stdout + runs["extract"].stderr
        # to the end
        runs["tail"] = run_fab(lab.root, *where, "tail", "--job", "leak", env={"COLUMNS": "80"})
        for width in WIDTHS:
            for task in ("tail", "status", "logs", "diagnose", "jobs"):
                runs[f"{task} {width}"] = run_fab(
                    lab.root, *where, task, "--odd", env={"COLUMNS": width}
                )
            runs[f"history {width}"] = run_fab(lab.root, "history", env={"COLUMNS": width})
        for task in ("status", "logs", "diagnose", "tail"):
            runs[f"{task} --json"] = run_fab(lab.root, *where, task, "--json")
        runs["history --json"] = run_fab(lab.root, "history", "--json")
    finally:
        hosts_file.unlink()
        for path in printed:
            path.unlink()
    for name, proc in runs.items():
        assert "Traceback" not in proc.stderr, f"{name}: {proc.stderr[-2000:]}"
        found = leaks(proc.stdout + proc.stderr)
        assert not found, f"{name} shows {found}:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}"
    found = leaks(log.read_text(encoding="utf-8"))
    assert not found, f"the audit log holds {found}"
    # Not vacuous: the nodes printed the URLs and the hosts folded; the jobs ran and printed their
    # secrets, --odd drew; at 80 columns the job table was too wide: its rows are blocks, no cell
    # cut, masked whole.
    assert "node[01-04] (4) | SVC_URL=[secret]" in runs["run 80"].stdout, runs["run 80"].stdout
    status = runs["status 80"].stdout
    assert (
        runs["status 80"].returncode == 1
        and "token=[secret] url=[secret]" in runs["status 152"].stdout
    ), status
    assert (
        "…" not in status
        and "last progress: samples=1/10 tok/s=1.0 eta=5s token=[secret] url=[secret]" in status
    )
    assert "node[01-04] (4)" in status and "odd ones out" in status, status
    assert (
        "SVC_URL=[secret]" in runs["logs 80"].stdout
        and "PB_SECRET=[secret]" in runs["logs 80"].stdout
    )
    logs = json.loads(runs["logs --json"].stdout)["results"]
    assert {r["host"] for r in logs} == set(HOSTS) and all(
        "HF_TOKEN=[secret]" in r["data"]["lines"] for r in logs
    )
    # every task run on every host, recorded
    assert len(log.read_text().splitlines()) >= 4 * (3 + 2 + 2 * 5 + 4)
