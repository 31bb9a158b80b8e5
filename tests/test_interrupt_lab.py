"""Ctrl-C against real lab nodes: a SIGINT to the `fab` client while a node writes a two-file patch
set, and while hosts are still connecting.

In the middle of a set (the agent paused at each write point in turn, failpoint `pause`): the agent
that catches the interrupt puts back what it wrote (or keeps a set it had written whole), the client
asks the node afterwards what each file is, and the console, --json and the audit log say exactly
that; an intent line is in the audit log before any write, also when a second SIGINT makes the
client exit at once. A set whose writer was killed stays marked unfinished through another
playbook's run on the same venv. What the files are is checked against pip's RECORD and GNU patch
(faultkit), never against the code under test.

While connecting (a port that accepts TCP and never sends an SSH banner, or one whose accept queue
is full, so the SYN is never answered): the run stops within a couple of seconds and says nothing
ran there."""

from __future__ import annotations

import difflib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GENERATOR, REPO, WORKER, fab_json
from faultkit import (
    arm,
    disarm,
    failpoints_hit,
    file_sha,
    hit_file,
    independent_forms,
    reset_node,
    running,
    temp_files,
    wait_for,
)

from fleetops.lab import site_packages

pytestmark = pytest.mark.lab
MODULES = (GENERATOR, WORKER)
LOCK_NAME = ".fleetops-patch.lock"
DONE = {"patch": "patched", "rollback": "pristine"}
BEFORE = {"patch": "pristine", "rollback": "patched"}


def fab(lab, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fabric", *args],
        cwd=lab.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "FLEETOPS_NO_LIVE": "1", **(env or {})},
    )


def audit_since(offset: int) -> list[dict]:
    path = Path(os.environ["FLEETOPS_AUDIT_LOG"])
    if not path.exists():
        return []
    with path.open("rb") as f:
        f.seek(offset)
        return [json.loads(line) for line in f.read().decode().splitlines() if line.strip()]


def audit_size() -> int:
    path = Path(os.environ["FLEETOPS_AUDIT_LOG"])
    return path.stat().st_size if path.exists() else 0


def form_of(node, module: str, known: dict) -> str:
    got = file_sha(node, module)
    return next((f for f, s in known[module].items() if s == got), "NEITHER")


def site_state(node) -> dict:
    path = site_packages(node.venv) / LOCK_NAME
    try:
        value, _ = json.JSONDecoder().raw_decode(path.read_text())
    except (OSError, ValueError):
        return {}
    return value


def unfinished(node) -> list:
    """The sets the venv's lock marks as being written (an older agent kept one, under
    `pending`)."""
    state = site_state(node)
    return [
        *([state["pending"]] if isinstance(state.get("pending"), dict) else []),
        *state.get("unfinished", []),
    ]


def start_form(lab, node, op: str) -> None:
    reset_node(lab, node)
    (site_packages(node.venv) / LOCK_NAME).unlink(missing_ok=True)
    if op == "rollback":
        assert fab_json(lab.root, "-H", "lab01", "patch")[0] == 0


def lock_free(node) -> bool:
    return not (node.state_dir / "lock.json").exists()


@pytest.mark.parametrize("op", ["patch", "rollback"])
def test_sigint_at_every_write_point_leaves_the_set_whole_and_says_what_the_host_has(lab, op):
    node, known = lab.node("lab01"), independent_forms(lab.node("lab01"))
    start_form(lab, node, op)
    points = failpoints_hit(lab, node, op)
    writes = [p for p in points if p[0].startswith(f"{op}.")]
    assert (f"{op}.target.before_rename", 2) in writes, points  # both files' writes are among them
    bad: list[str] = []
    tally = {"put back": 0, "kept whole": 0, "before any write": 0}
    for point, n in points:
        start_form(lab, node, op)
        hit = hit_file(node, point)
        hit.unlink(missing_ok=True)
        arm(node, {point: {"action": "pause", "skip": n - 1, "seconds": 120}})
        since = audit_size()
        proc = fab(lab, "-H", "lab01", op, "--json")
        try:
            wait_for(
                lambda hit=hit, proc=proc: hit.exists() or proc.poll() is not None,
                f"{op} to reach {point} (hit {n})",
            )
            assert hit.exists(), f"{op} ended before {point} (hit {n}): {proc.communicate()}"
            disarm(node)
            agent = int(hit.read_text())
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=120)
        finally:
            disarm(node)
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        wait_for(
            lambda agent=agent: not running(agent),
            f"the interrupted agent {agent} to end",
            timeout=60,
        )
        hit.unlink(missing_ok=True)
        case = f"SIGINT at {point} (hit {n})"
        now = {m: form_of(node, m, known) for m in MODULES}
        # every file already written
        whole_new = point == f"{op}.target.after_rename" and n == len(MODULES)
        want = DONE[op] if whole_new else BEFORE[op]
        if set(now.values()) != {want}:
            bad.append(f"{case}: files {now}, expected all {want}")
        tally[
            "kept whole"
            if whole_new
            else "put back"
            if point.startswith(f"{op}.")
            else "before any write"
        ] += 1
        if proc.returncode != 130:
            bad.append(f"{case}: exit {proc.returncode}, expected 130: {out[-500:]} {err[-500:]}")
            continue
        result = json.loads(out)["results"][0]
        said = {m: m.rsplit(".", 1)[1] + " " + now[m] for m in MODULES}
        if (
            not all(s in result["msg"] for s in said.values())
            or "every file whole, old or new" in result["msg"]
        ):
            bad.append(f"{case}: the console says {result['msg']!r}; the files are {now}")
        if result["changed"] is not whole_new:
            bad.append(
                f"{case}: result changed={result['changed']}, but the files changed: {whole_new}"
            )
        lines = [e for e in audit_since(since) if e["host"] == "lab01" and e["task"] == op]
        if [e["result"] for e in lines[:1]] != ["started"] or len(lines) != 2:
            bad.append(
                f"{case}: audit lines "
                f"{[(e['result'], e['changed']) for e in lines]}: expected the intent "
                "line, then the result"
            )
        elif lines[1]["changed"] is not whole_new or lines[1]["msg"] != result["msg"][:300]:
            bad.append(f"{case}: audit says changed={lines[1]['changed']} {lines[1]['msg']!r}")
        if temp_files(node) or not lock_free(node) or unfinished(node):
            bad.append(
                f"{case}: left temp files {temp_files(node)}, lock.json, or an unfinished mark "
                f"{unfinished(node)}"
            )
    print(f"\n{op}: SIGINT at {len(points)} points: {tally}")
    assert not bad, "\n".join(bad)


def test_two_sigints_write_the_audit_line_first_and_the_node_still_puts_the_set_back(lab):
    """The second SIGINT exits at once (no grace, no answer): the intent line was written before any
    write, the second Ctrl-C adds a line for the step it left, and the agent, alone, puts back what
    it wrote."""
    node, known = lab.node("lab01"), independent_forms(lab.node("lab01"))
    start_form(lab, node, "patch")
    point = "patch.target.before_rename"
    hit = hit_file(node, point)
    hit.unlink(missing_ok=True)
    arm(node, {point: {"action": "pause", "skip": 1, "seconds": 120}})  # the second file's write
    since = audit_size()
    proc = fab(lab, "-H", "lab01", "patch")
    try:
        wait_for(
            lambda: hit.exists() or proc.poll() is not None,
            "patch to reach the second file's write",
        )
        disarm(node)
        agent = int(hit.read_text())
        assert (
            form_of(node, GENERATOR, known) == "patched"
            and form_of(node, WORKER, known) == "pristine"
        )
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        disarm(node)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130 and "second Ctrl-C" in err, out + err
    assert "finish or undo their step on their own" not in err
    wait_for(
        lambda: not running(agent), f"the agent {agent} to put the set back and end", timeout=60
    )
    hit.unlink(missing_ok=True)
    assert {m: form_of(node, m, known) for m in MODULES} == {
        GENERATOR: "pristine",
        WORKER: "pristine",
    }
    assert lock_free(node) and not temp_files(node) and not unfinished(node)
    lines = [e for e in audit_since(since) if e["host"] == "lab01" and e["task"] == "patch"]
    assert [e["result"] for e in lines] == ["started", "failed"], lines
    assert "second Ctrl-C" in lines[1]["msg"] and lines[1]["exit_status"] == 130, lines[1]


def _other_playbook(lab, node) -> Path:
    """A playbook of its own (one file the main playbook does not touch), on the same venv."""
    target = node.module_file("speculators.version")
    old = target.read_text()
    new = old + "# patched by the other playbook\n"
    rel = "speculators/version.py"
    diff = "".join(
        difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}")
    )
    folder = lab.root / "other-playbook"
    folder.mkdir(exist_ok=True)
    (folder / "version.diff").write_text(diff)
    book = folder / "other.yaml"
    book.write_text(
        "name: other\ndescription: one line added to speculators/version.py (test fixture)\n"
        "patches:\n  - module: speculators.version\n    diff: version.diff\n"
    )
    return book


def test_the_unfinished_mark_of_a_killed_set_survives_another_playbooks_run(lab):
    node, known = lab.node("lab01"), independent_forms(lab.node("lab01"))
    start_form(lab, node, "patch")
    other = _other_playbook(lab, node)
    arm(node, {"patch.target.after_rename": {"action": "kill"}})  # dies with the first file written
    try:
        rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    finally:
        disarm(node)
    assert rc != 0, doc
    assert {m: form_of(node, m, known) for m in MODULES} == {
        GENERATOR: "patched",
        WORKER: "pristine",
    }
    assert unfinished(node), site_state(node)
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch", "--playbook", str(other))
    assert rc == 0 and doc["results"][0]["status"] == "changed", doc
    # Its files untouched, the killed set's mark still there: the next run of that set says what
    # happened.
    assert {m: form_of(node, m, known) for m in MODULES} == {
        GENERATOR: "patched",
        WORKER: "pristine",
    }
    rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    assert rc == 0, doc
    notes = [x for it in doc["results"][0]["items"] for x in it["details"].get("notes", [])]
    assert any("died before finishing this set" in x for x in notes), notes
    assert {m: form_of(node, m, known) for m in MODULES} == {
        GENERATOR: "patched",
        WORKER: "patched",
    }
    assert not unfinished(node)
    lab.reset_packages(node)


def test_a_stale_node_lock_whose_pid_names_another_process_is_taken_over_with_a_note(lab):
    """The holder died and its pid now belongs to another process (here: a sleep of ours): the lock
    is free (flock), so it is taken, and the note says so instead of passing over it."""
    node = lab.node("lab01")
    start_form(lab, node, "patch")
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        (node.state_dir / "lock.json").write_text(
            json.dumps(
                {
                    "operator": "ghost@elsewhere",
                    "op": "patch",
                    "pid": stranger.pid,
                    "since": "2026-01-01T00:00:00Z",
                }
            )
        )
        rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
        assert rc == 0, doc
        notes = [x for it in doc["results"][0]["items"] for x in it["details"].get("notes", [])]
        assert notes and notes[0].startswith("took over a stale lock from ghost@elsewhere"), notes
        assert f"pid {stranger.pid} now belongs to another process" in notes[0], notes
        assert stranger.poll() is None  # only noted, never signalled
    finally:
        stranger.kill()
        stranger.wait()


# ---------------------------------------------------------------- Ctrl-C while hosts are still
# connecting
def _stuck_inventory(lab, tmp_path: Path, ports: dict[str, int]) -> Path:
    lines = ["hosts:"]
    for name, port in ports.items():
        lines += [
            f"  {name}:",
            "    address: 127.0.0.1",
            f"    port: {port}",
            f"    user: {lab.user}",
            f"    identity_file: {lab.client_key}",
            f"    known_hosts: {lab.known_hosts}",
            "    connect_timeout: 120",
        ]
    inv = tmp_path / "stuck.yaml"
    inv.write_text("\n".join(lines) + "\n")
    return inv


def test_sigint_with_hosts_stuck_before_their_banner_or_their_syn_stops_at_once(lab, tmp_path):
    """One port accepts TCP and never speaks SSH (no banner); one has a full accept queue, so its
    SYN is never answered. connect_timeout is 120 s: the run must stop within seconds of the SIGINT
    and say nothing ran."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    fillers = []
    for _ in range(4):  # fill the accept queue: later SYNs are dropped
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(full.getsockname())
        except BlockingIOError:
            pass
        fillers.append(s)
    inv = _stuck_inventory(
        lab, tmp_path, {"silent": silent.getsockname()[1], "tarpit": full.getsockname()[1]}
    )
    proc = fab(lab, "-H", "silent,tarpit", "patch", "--json", env={"FLEETOPS_INVENTORY": str(inv)})
    try:
        silent.settimeout(60)
        accepted, _ = silent.accept()  # the client is connected and waits for the banner
        time.sleep(0.5)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        silent.close()
        full.close()
        for s in fillers:
            s.close()
    print(f"\nSIGINT with 2 hosts stuck connecting: exited {proc.returncode} after {took:.2f}s")
    assert proc.returncode == 130, out + err
    assert took < 5, f"took {took:.1f}s after the SIGINT"
    results = {r["host"]: r for r in json.loads(out)["results"]}
    for name in ("silent", "tarpit"):
        msg = results[name]["msg"]
        assert msg == "interrupted (Ctrl-C) while connecting to it: nothing ran there", (name, msg)
    assert "stops it cleanly" not in out + err and "Traceback" not in err
