"""The audit log against real lab sshd nodes: one log per project, what each entry carries (address,
inventory file, the exit status the run really returned), and `history` readable at 80 columns."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, fab_json, make_project, run_fab

from fleetops import audit

pytestmark = pytest.mark.lab


def fab_own_log(project: Path, *args: str, state: Path) -> subprocess.CompletedProcess:
    """fab as an operator runs it: FLEETOPS_AUDIT_LOG unset (conftest sets it for the whole
    session), so the log is the project's own, under XDG_STATE_HOME (a temp dir here, never the real
    home)."""
    env = {k: v for k, v in os.environ.items() if k != "FLEETOPS_AUDIT_LOG"}
    env.update({"PYTHONPATH": str(REPO), "COLUMNS": "200", "XDG_STATE_HOME": str(state)})
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )


def test_each_project_has_its_own_audit_log_and_history(lab, tmp_path):
    state = tmp_path / "state"
    other = make_project(tmp_path / "other")
    shutil.copy(lab.hosts_file, other / "hosts" / "lab.yaml")  # the same nodes, another checkout
    assert fab_own_log(lab.root, "-H", "lab01", "ping", state=state).returncode == 0
    proc = fab_own_log(other, "-H", "lab02", "ping", "facts", state=state)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    mine = json.loads(fab_own_log(lab.root, "history", "--json", state=state).stdout)
    theirs = json.loads(fab_own_log(other, "history", "--json", state=state).stdout)
    assert [(r["host"], r["task"]) for r in mine] == [("lab01", "ping")]
    assert [(r["host"], r["task"]) for r in theirs] == [("lab02", "ping"), ("lab02", "facts")]
    assert mine[0]["project"] == str(lab.root.resolve()) and theirs[0]["project"] == str(
        other.resolve()
    )

    # Two files under the state directory, each named after its project, none in the shared old
    # place, and the session's FLEETOPS_AUDIT_LOG untouched by these runs.
    logs = sorted(state.glob("fleetops/projects/*/audit.jsonl"))
    assert len(logs) == 2 and not (state / "fleetops" / "audit.jsonl").exists()
    assert {p.parent.joinpath("project").read_text().strip() for p in logs} == {
        str(lab.root.resolve()),
        str(other.resolve()),
    }
    assert {p.parent.name.rsplit("-", 1)[0] for p in logs} == {lab.root.name, other.name}
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in logs)
    assert not any("lab02" in line for line in logs_of(lab.root, logs))
    table = fab_own_log(lab.root, "history", state=state).stdout
    assert "lab01" in table and "lab02" not in table and "fleetops/projects/" in table


def logs_of(root: Path, logs: list[Path]) -> list[str]:
    [log] = [
        p for p in logs if p.parent.joinpath("project").read_text().strip() == str(root.resolve())
    ]
    return log.read_text().splitlines()


def test_failed_verify_is_logged_with_the_exit_status_the_run_returned(lab):
    before = len(audit.read())
    # the fixture left lab01 unpatched
    rc, doc = fab_json(lab.root, "-H", "lab01", "verify", "--kinds", "grep")
    assert rc != 0 and doc["results"][0]["status"] == "failed", doc
    [rec] = audit.read()[before:]
    assert rec["task"] == "verify" and rec["result"] == "failed"
    assert rec["exit_status"] == rc  # was 0: the result's own code, not what the process returned

    node = lab.node("lab01")
    assert rec["address"] == f"{lab.user}@127.0.0.1:{node.port}"
    assert Path(rec["inventory"]).resolve() == lab.hosts_file.resolve()
    assert rec["project"] == str(lab.root.resolve())

    rc, _ = fab_json(lab.root, "-H", "lab01", "ping")
    assert (
        rc == 0
        and audit.read()[-1]["exit_status"] == 0
        and audit.read()[-1]["address"] == rec["address"]
    )


def test_history_is_readable_at_80_columns(lab, tmp_path):
    # A failed verify (exit 1), a ping (no playbook: None in the log) and an unreachable host (a
    # long message).
    fab_json(lab.root, "-H", "lab01", "verify", "--kinds", "grep")
    assert run_fab(lab.root, "-H", "lab01", "ping").returncode == 0
    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = lab.root / "hosts" / "deadnode.yaml"
    dead.write_text(
        f"hosts:\n  deadnode:\n    address: 127.0.0.1\n    port: {port}\n    user: {lab.user}\n"
        f"    known_hosts: {lab.known_hosts}\n    identity_file: {lab.client_key}\n"
    )
    try:
        assert run_fab(lab.root, "-H", "deadnode", "ping").returncode == 4
        proc = run_fab(lab.root, "history", "--last", "3", env={"COLUMNS": "80"})
    finally:
        dead.unlink()
    assert proc.returncode == 0, proc.stderr
    logged = audit.read(last=3)
    lines = proc.stdout.splitlines()
    # At 80 columns each entry is a block: its columns on one line, its message wrapped under it, so
    # no id or path is cut (the wide table is below).
    starts = [
        i for i, line in enumerate(lines) if re.match(r"[A-Z][a-z]{2} \d\d \d\d:\d\d  ", line)
    ]
    assert len(starts) == 3 and all(len(line) <= 80 for line in lines[starts[0] :]), proc.stdout
    for word in ("None", "False", "True", "2026-…"):
        assert word not in proc.stdout, (word, proc.stdout)
    assert logged[0]["exit_status"] != 0
    for at, end, rec in zip(starts, starts[1:] + [len(lines)], logged):
        fields = lines[at].split()
        assert fields[4:7] == [rec["host"], rec["task"], rec["result"]], (fields, rec)
        assert fields[fields.index("exit") + 1] == str(rec["exit_status"]), (fields, rec)
        shown = "".join(line.strip() for line in lines[at + 1 : end]).replace(" ", "")
        # whole: 3 lines hold these messages
        assert shown == rec["msg"].replace(" ", ""), (shown, rec)
    # Wide, every column shows, with dashes for what a ping has not (playbook) and yes/no for
    # changed.
    wide = run_fab(
        lab.root, "history", "--host", "lab01", "--last", "1", env={"COLUMNS": "300"}
    ).stdout
    header = next(
        [c.strip() for c in line.split("┃")[1:-1]]
        for line in wide.splitlines()
        if line.startswith("┃")
    )
    [row] = [
        [c.strip() for c in line.split("│")[1:-1]]
        for line in wide.splitlines()
        if line.startswith("│")
    ]
    cell = dict(zip(header, row))
    assert (
        cell["playbook"] == "-"
        and cell["changed"] == "no"
        and cell["inventory"] == "hosts/lab.yaml"
    ), wide
    assert cell["address"] == audit.read("lab01")[-1]["address"], wide
