"""The audit log's place and the `history` table, without the lab: where a project's log lives, and
how the table fits a terminal (the lab tests in test_audit_lab.py run the real commands)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from fleetops import audit
from fleetops.report import history


@pytest.fixture
def own_log(monkeypatch, tmp_path):
    """As an operator runs it: no FLEETOPS_AUDIT_LOG (conftest sets one for the session), a temp
    state dir."""
    monkeypatch.delenv("FLEETOPS_AUDIT_LOG", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


def test_two_projects_two_logs_named_after_them(own_log, tmp_path):
    a, b = tmp_path / "fleet", tmp_path / "elsewhere" / "fleet"
    for root in (a, b):
        root.mkdir(parents=True)
        (root / "fabfile.py").write_text("")
    assert audit.log_path(a) != audit.log_path(b)
    assert audit.log_path(a).parent.parent == own_log / "fleetops" / "projects"
    assert audit.log_path(a).parent.name.startswith("fleet-")
    (a / "sub").mkdir()
    # found from a subdirectory, as Fabric finds the fabfile
    assert audit.project_root(a / "sub") == a.resolve()


def test_relative_xdg_state_home_is_ignored(monkeypatch, tmp_path):
    monkeypatch.delenv("FLEETOPS_AUDIT_LOG", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")
    assert audit.log_path(tmp_path).is_relative_to(Path.home() / ".local" / "state")


def test_empty_project_log_names_the_old_shared_file(own_log, tmp_path, monkeypatch, capsys):
    old = own_log / "fleetops" / "audit.jsonl"
    old.parent.mkdir(parents=True)
    old.write_text('{"host": "lab02"}\n')
    monkeypatch.chdir(tmp_path)
    history.show_history(None, 50, False, tmp_path)
    out = capsys.readouterr().out
    assert "no entries" in out and str(old) in out and "lab02" not in out


def test_message_is_cut_at_a_word_with_one_ellipsis():
    assert history.truncate("short", 10) == "short"
    assert history.truncate("cannot connect to 127.0.0.1:2222: refused", 24) == "cannot connect to…"
    assert history.truncate("x" * 40, 10) == "x" * 9 + "…"


def test_time_is_local_and_short():
    now = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc).astimezone()
    this_year = {"time": "2026-11-30T11:05:09+00:00"}
    expected = (
        dt.datetime(2026, 11, 30, 11, 5, 9, tzinfo=dt.timezone.utc)
        .astimezone()
        .strftime("%b %d %H:%M")
    )
    assert history.when(this_year, now) == expected
    assert history.when({"time": "2024-01-02T03:04:05+00:00"}, now).startswith("2024-01-0")
    assert history.when({}, now) == "-"


def test_80_columns_keep_every_required_column_whole():
    rec = {
        "time": "2026-11-30T11:05:09+00:00",
        "operator": "someone@laptop",
        "host": "gpu-node-017",
        "task": "rollback",
        "playbook": "speculators-0.3.0-vllm-0.16",
        "result": "unreachable",
        "changed": False,
        "exit_status": 4,
        "duration_s": 10.2,
        "address": "root@10.0.0.17:22",
        "msg": "m " * 100,
    }
    rows = [[c.cell(rec) for c in history.COLUMNS]]
    shown, msg_width = history.fit(rows, 80)
    names = [history.COLUMNS[i].key for i in shown]
    assert names == ["time", "host", "task", "result", "exit_status", "msg"]
    fixed = sum(
        len(rows[0][i])
        if len(rows[0][i]) > len(history.COLUMNS[i].header)
        else len(history.COLUMNS[i].header)
        for i in shown[:-1]
    )
    assert fixed + msg_width + 3 * len(shown) + 1 == 80 and msg_width >= 12
    wide, _ = history.fit(rows, 300)
    assert len(wide) == len(history.COLUMNS)


def test_the_log_directory_is_made_once_and_again_if_it_was_removed(own_log, tmp_path):
    """The directory checks are paid once per process, not once per result; a directory removed by
    hand between two results is made again, so no record is lost."""
    import shutil

    root = tmp_path / "fleet"
    root.mkdir()
    record = {"host": "lab01", "task": "ping", "project": str(root)}
    audit.append(record, root)
    shutil.rmtree(audit.log_path(root).parent)
    audit.append({**record, "host": "lab02"}, root)
    assert [r["host"] for r in audit.read(root=root)] == ["lab02"]
    assert (audit.log_path(root).parent / "project").read_text() == f"{root}\n"
