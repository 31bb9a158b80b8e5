"""Secrets (and inventory paths) against real lab sshd nodes: a secret with quotes, a backslash and
non-ASCII (`Tök"en\\pass`) is masked in the human output, `--json`, `logs --json`, the audit log and
`history --json`; an unset `secret_from_env` fails only the host and the task that need it;
`state_dir: "-c"` is refused before anything connects.

A module of its own with a 2-node lab (a throwaway project) and its own audit log, so nothing here
touches the session's shared lab or log."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, fab_json, run_fab

from fleetops.lab import Lab

pytestmark = pytest.mark.lab
JOBS = str(REPO / "tests" / "playbooks" / "jobs.yaml")
SECRET = 'Tök"en\\pass'  # the issue's quote: T ö k " e n \ p a s s
# Every form the secret takes once something quotes it: none may appear anywhere.
FORMS = [
    SECRET,
    json.dumps(SECRET)[1:-1],
    json.dumps(SECRET, ensure_ascii=False)[1:-1],
    repr(SECRET)[1:-1],
    "Tök",
    "T\\u00f6k",
]


@pytest.fixture(scope="module")
def lab2(lab_factory):
    return lab_factory.shared(2, __name__)


@pytest.fixture
def audit_log(tmp_path, monkeypatch):
    log = tmp_path / "audit.jsonl"
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(log))  # run_fab passes os.environ on
    return log


def host_entry(lab: Lab, name: str, node_name: str, extra: str = "") -> str:
    node = lab.node(node_name)
    return (
        f"  {name}:\n    address: 127.0.0.1\n    port: {node.port}\n    user: {lab.user}\n    "
        f"identity_file: {lab.client_key}\n    known_hosts: {lab.known_hosts}\n    python: "
        f"{node.python}\n    state_dir: {node.state_dir}\n    gpus: 2\n{extra}"
    )


def leaks(text: str) -> list[str]:
    return [form for form in FORMS if form in text]


def test_quoted_secret_is_masked_in_every_output_and_log(lab2, audit_log):
    # Quote: "a secret with non-ASCII or quote characters (Tök"en\pass) is not masked in `logs
    # --json`, the audit log or `history --json` (masking runs after JSON escaping)".
    extra = lab2.root / "hosts" / "secret.yaml"
    entry = host_entry(
        lab2, "sec01", "lab01", "    env:\n      HF_TOKEN: {secret: 'Tök\"en\\pass'}\n"
    )
    extra.write_text("hosts:\n" + entry, encoding="utf-8")
    # the secret in the command itself and in its output
    command = "printf '%s\\n' 'token=Tök\"en\\pass'"
    try:
        human = run_fab(
            lab2.root,
            "-H",
            "sec01",
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
            "logs",
        )
        logs_json = run_fab(lab2.root, "-H", "sec01", "logs", "--json")
        run_human = run_fab(lab2.root, "-H", "sec01", "run", command)
        run_json = run_fab(lab2.root, "-H", "sec01", "run", command, "--json")
        hist = run_fab(lab2.root, "history", "--host", "sec01", "--json")
        hist_human = run_fab(lab2.root, "history", "--host", "sec01")
    finally:
        extra.unlink()
    assert human.returncode == 0, human.stdout + human.stderr
    # the job printed it; fleetops masked it
    assert "token is [secret]" in human.stdout, human.stdout
    assert logs_json.returncode == 0, logs_json.stderr
    assert "token is [secret]" in json.dumps(json.loads(logs_json.stdout))
    assert run_human.returncode == 0 and "sec01 | token=[secret]" in run_human.stdout, (
        run_human.stdout
    )
    doc = json.loads(run_json.stdout)
    assert run_json.returncode == 0 and doc["results"][0]["data"]["stdout"] == "token=[secret]\n", (
        doc
    )
    records = json.loads(hist.stdout)
    assert {r["task"] for r in records} >= {"extract", "tail", "logs", "run"}
    log_text = audit_log.read_text(encoding="utf-8")
    # `run CMD`
    assert any("[secret]" in json.loads(line)["msg"] for line in log_text.splitlines()), log_text
    for name, text in (
        ("human", human.stdout + human.stderr),
        ("logs --json", logs_json.stdout),
        ("run", run_human.stdout + run_human.stderr),
        ("run --json", run_json.stdout),
        ("history --json", hist.stdout),
        ("history", hist_human.stdout),
        ("audit log", log_text),
    ):
        assert not leaks(text), f"{name} shows the secret as {leaks(text)}:\n{text[-3000:]}"


def test_unset_secret_from_env_fails_only_the_host_and_task_that_need_it(lab2, audit_log):
    # Quote: "one host's unset secret_from_env fails every host".
    path = lab2.root / "hosts" / "partial.yaml"
    env_of = "    env:\n      HF_TOKEN: {{secret_from_env: {}}}\n".format
    path.write_text(
        "hosts:\n"
        + host_entry(lab2, "good", "lab01", env_of("FLEETOPS_T12_SET"))
        + host_entry(lab2, "bad", "lab02", env_of("FLEETOPS_T12_UNSET"))
    )
    env = {"FLEETOPS_T12_SET": "good-token-48213"}
    bad_line = (
        path.read_text().splitlines().index("      HF_TOKEN: {secret_from_env: FLEETOPS_T12_UNSET}")
        + 1
    )
    try:
        # needs no job environment
        rc, ping = fab_json(lab2.root, "-H", "good,bad", "ping", env=env)
        extract = run_fab(
            lab2.root,
            "-H",
            "good,bad",
            "extract",
            "--job",
            "showtoken",
            "--playbook",
            JOBS,
            "--json",
            env=env,
        )
        tail = run_fab(
            lab2.root, "-H", "good", "tail", "--job", "showtoken", "--playbook", JOBS, env=env
        )
    finally:
        path.unlink()
    assert rc == 0 and {r["host"]: r["status"] for r in ping["results"]} == {
        "good": "ok",
        "bad": "ok",
    }, ping
    assert "Traceback" not in extract.stderr, extract.stderr
    doc = json.loads(extract.stdout)
    got = {r["host"]: r for r in doc["results"]}
    assert extract.returncode == 1 and doc["failed_hosts"] == ["bad"], doc
    assert got["good"]["status"] == "changed", got["good"]
    msg = got["bad"]["msg"]
    assert (
        got["bad"]["status"] == "failed"
        and "FLEETOPS_T12_UNSET" in msg
        and f"{path}:{bad_line}:" in msg
    ), msg
    # a missing secret is the operator's to fix, not a bug
    assert not msg.startswith("internal error"), msg
    assert "job" not in got["bad"].get("data", {}), got["bad"]  # nothing was launched there
    assert tail.returncode == 0 and "token is [secret]" in tail.stdout, tail.stdout + tail.stderr
    assert "good-token-48213" not in extract.stdout + tail.stdout + audit_log.read_text()


def test_unset_passphrase_fails_only_its_host(lab2, audit_log):
    path = lab2.root / "hosts" / "locked.yaml"
    path.write_text(
        "hosts:\n"
        + host_entry(lab2, "open", "lab01")
        + host_entry(
            lab2,
            "locked",
            "lab02",
            "    identity_passphrase: {secret_from_env: FLEETOPS_T12_NO_PASS}\n",
        )
    )
    try:
        proc = run_fab(lab2.root, "-H", "open,locked", "ping", "--json")
    finally:
        path.unlink()
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    got = {r["host"]: r for r in doc["results"]}
    assert proc.returncode != 0 and got["open"]["status"] == "ok", doc
    assert (
        got["locked"]["status"] in ("failed", "unreachable")
        and "FLEETOPS_T12_NO_PASS" in got["locked"]["msg"]
    )
    assert not got["locked"]["msg"].startswith("internal error"), got["locked"]["msg"]


def test_dash_state_dir_is_refused_before_connecting(lab2, audit_log):
    # Quote: "`state_dir: "-c"` passes validation (the agent command line becomes `python
    # -c/bin/…`)".
    path = lab2.root / "hosts" / "dash.yaml"
    path.write_text(
        "hosts:\n"
        + host_entry(lab2, "dash", "lab01").replace(
            f"state_dir: {lab2.node('lab01').state_dir}", 'state_dir: "-c"'
        )
    )
    line = path.read_text().splitlines().index('    state_dir: "-c"') + 1
    try:
        proc = run_fab(lab2.root, "-H", "dash", "ping")
    finally:
        path.unlink()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        f"{path}:{line}:" in proc.stderr
        and "absolute" in proc.stderr
        and "Traceback" not in proc.stderr
    )
    # nothing ran, nothing was logged
    assert not audit_log.exists() or "dash" not in audit_log.read_text()
