"""Faults during patch and rollback on a real lab node, at EVERY failpoint hit of both operations:
every atomic write (before and after its rename) of both target files, their backups and backup
records, and of the node lock's info file, plus the points after the lock and after each backup.

The points are enumerated by the node itself: patch and rollback run once with the failpoint
recorder on ({"*": {"action": "record"}}), which lists every (point, n-th hit) in order; the test
fails if that list is not exactly the one below (3 lock points + 7 per file for patch, 3 + 2 per
file for rollback: 24), so a new write can never go unfaulted. Each (point, n-th hit) is then
faulted with {"action": "pause", "skip": n-1}: the agent stops right there and the test applies the
fault with no timing window:
  kill-agent      the agent is SIGKILLed at that point;
  cut-connection  the agent's sshd session is SIGKILLed: the connection drops, the agent sees its
                  answer pipe fail (its client watchdog), stops right there, puts back the files of
                  the set it had written and cleans up (no temp file, lock released);
  stop-sshd       the sessions are listed first, then the node's sshd listener is stopped and every
                  session killed (OpenSSH leaves live sessions running, re-parented, when only the
                  listener stops).
Every point gets all three kinds: 72 faults, about 4-5 minutes on 2 loaded cores (~3.5 s a fault, ~5
s with the sshd restart). Each fault is checked against the node's own evidence (/proc, the node's
sshd.log, its lock file), tallied per kind and per operation, and the last test prints and checks
the tally.

After each fault: every target file is byte-identical to its pristine form (pip's RECORD) or its
fully patched form (the shipped diff applied by GNU patch, checked against tests/fixtures/*.sha256):
the exact one the point and the kind imply (a cut agent leaves the set whole); only the killed
agent's temp files may be left, and after the next run none at all; the next patch and rollback
succeed and end in exactly the expected forms."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass

import pytest
from conftest import REPO
from faultkit import (
    arm,
    clear_fault_leftovers,
    client_port,
    disarm,
    file_sha,
    hit_file,
    independent_forms,
    last_session_id,
    log_closed_session,
    log_started_session,
    playbook_patches,
    reset_node,
    running,
    session_of,
    sessions,
    sshd_log_size,
    temp_files,
    temp_writer,
    trace,
    wait_for,
)

from fleetops import api
from fleetops.lab import port_open

pytestmark = pytest.mark.lab
MODULES = [m for m, _ in playbook_patches()]
KINDS = ("kill-agent", "cut-connection", "stop-sshd")
OPS = ("patch", "rollback")
LOCK_POINTS = ["lock.info.before_rename", "lock.info.after_rename", "lock.acquired"]
FILE_POINTS = {
    "patch": [
        "patch.backup.before_rename",
        "patch.backup.after_rename",
        "patch.record.before_rename",
        "patch.record.after_rename",
        "patch.after_backup",
        "patch.target.before_rename",
        "patch.target.after_rename",
    ],
    "rollback": ["rollback.target.before_rename", "rollback.target.after_rename"],
}
DONE = {"patch": "patched", "rollback": "pristine"}  # each file's form once the operation finished
BEFORE = {"patch": "pristine", "rollback": "patched"}


def expected_points(op: str) -> list[tuple[str, int]]:
    """(point, n-th hit) in the order the node reaches them: the lock, then file after file."""
    return [(p, 1) for p in LOCK_POINTS] + [
        (p, i + 1) for i in range(len(MODULES)) for p in FILE_POINTS[op]
    ]


# 72
CASES = [(op, point, n, kind) for op in OPS for point, n in expected_points(op) for kind in KINDS]

TALLY: dict[tuple[str, str], Counter] = {(op, kind): Counter() for op in OPS for kind in KINDS}
DONE_CASES: set[tuple[str, str, int, str]] = set()
_ENUMERATED: dict[str, list[tuple[str, int]]] = {}
# op → (point, n) → the file the node was writing
_WRITTEN: dict[str, dict[tuple[str, int], str]] = {}


def results(lab, node, op: str) -> list:
    return api.run(lab.root, node.name, [(op, {})])


def enumerated(lab) -> dict[str, list[tuple[str, int]]]:
    """Every (point, n-th hit) that patch and rollback reach on lab01, recorded by the node (once a
    session)."""
    if not _ENUMERATED:
        node = lab.node("lab01")
        for op in OPS:
            (node.faults_dir / "failpoints.trace").unlink(missing_ok=True)
            arm(node, {"*": {"action": "record"}})
            try:
                (r,) = results(lab, node, op)
            finally:
                disarm(node)
            assert r.status.value == "changed", r.msg
            hits = trace(node)
            _ENUMERATED[op] = [(p, n) for p, n, _ in hits]
            _WRITTEN[op] = {(p, n): written for p, n, written in hits}
        reset_node(lab, node)
    return _ENUMERATED


def written_by(node, op: str, point: str, n: int) -> str:
    """The file the n-th hit of `point` must be writing: the lock info, or the n-th file's backup,
    backup record or target (the playbook's order)."""
    if point.startswith("lock.info."):
        return "lock.json"
    module_file = os.path.realpath(node.module_file(MODULES[n - 1]))
    if ".backup." in point:
        return f"-{os.path.basename(module_file)}.orig"
    if ".record." in point:
        return f"-{os.path.basename(module_file)}.json"
    return module_file if ".target." in point else ""


def test_every_write_of_both_files_and_the_lock_is_enumerated(lab):
    found = enumerated(lab)
    node = lab.node("lab01")
    for op in OPS:
        print(f"\n{op}: the node reached {len(found[op])} failpoints: {found[op]}")
        for i, module in enumerate(MODULES):  # each file's own writes, not just the first file's
            assert (f"{op}.target.before_rename", i + 1) in found[op], (
                f"{op} never reached {module}'s write"
            )
        assert ("lock.info.before_rename", 1) in found[op], f"{op} never reached the lock writes"
        assert found[op] == expected_points(op), (
            f"{op}: the node's failpoints changed; fault every new one (update "
            "FILE_POINTS/LOCK_POINTS)"
        )
        # and each hit writes the file its place implies
        for (point, n), written in _WRITTEN[op].items():
            want = written_by(node, op, point, n)
            assert written.endswith(want) if want else written == "", (
                f"{op}: {point} hit {n} wrote {written!r}"
            )
    assert len(found["patch"]) + len(found["rollback"]) == 24


@dataclass
class Fault:
    agent: int
    rc: int
    msg: str
    stale_lock: bool  # the killed agent's lock info was left behind (the next run must take over)


def inject(lab, node, op: str, point: str, n: int, kind: str) -> Fault:
    """Pause the agent at the n-th hit of `point`, apply the fault, and check it on the node's own
    evidence."""
    hit = hit_file(node, point)
    hit.unlink(missing_ok=True)
    arm(node, {point: {"action": "pause", "skip": n - 1, "seconds": 120}})
    since = sshd_log_size(node)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabric", "-H", node.name, op, "--json"],
        cwd=lab.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    listener = node.pid()
    killed: list[int] = []
    agent = 0
    try:
        wait_for(
            lambda: hit.exists() or proc.poll() is not None, f"{op} to reach {point} (hit {n})"
        )
        assert hit.exists(), f"{op} ended without reaching {point} (hit {n}): {proc.communicate()}"
        disarm(node)
        agent = int(hit.read_text())
        assert running(agent)
        # Listed while the listener still runs: once it stops, the sessions live on re-parented to
        # init.
        live = sessions(listener)
        session = session_of(agent, listener)
        assert session in live, f"agent {agent}'s session {session} is not among {live}"
        port = client_port(live[session], node.port)
        wait_for(
            lambda: log_started_session(node, port, since),
            f"sshd.log to show the session from port {port}",
        )
        cut = last_session_id(node, port, since)
        if kind == "kill-agent":
            os.kill(agent, signal.SIGKILL)
            wait_for(lambda: not running(agent), f"killed agent {agent} to be gone")
        else:
            if kind == "stop-sshd":
                # its sessions are cut below, then its masters closed: a master closed first
                # would end them cleanly
                assert lab.stop_node(node, masters=False), "the node's sshd was not running"
                wait_for(lambda: not running(listener), f"sshd listener {listener} to stop")
                assert not port_open(node.port), "the stopped node still accepts connections"
            for s, pids in live.items():
                if kind == "stop-sshd" or s == session:
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                    killed += pids
            wait_for(lambda: not any(running(p) for p in killed), f"sessions {killed} to be gone")
            if kind == "stop-sshd":
                lab.close_masters(node)  # the node is gone: no later run reaches it through one
            # Still paused at the point: the agent's watchdog sees its client gone and stops it
            # there, by itself.
            wait_for(
                lambda: not running(agent), f"the cut agent {agent} to notice and stop", timeout=60
            )
        lock = node.state_dir / "lock.json"
        holder = json.loads(lock.read_text())["pid"] if lock.exists() else None
        hit.unlink()  # a cut agent goes on from its pause point with no one to answer to
        out, err = proc.communicate(timeout=120)
        wait_for(
            lambda: not running(agent),
            f"the orphaned agent {agent} to finish its step",
            timeout=120,
        )
        assert not hit.exists(), f"{point} fired twice: a fault must hit exactly one write"
    finally:
        disarm(node)
        # a failed check left our agent paused, holding the lock
        if agent and hit.exists() and running(agent):
            os.kill(agent, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if kind == "stop-sshd":
            lab.start_node(node)
    assert proc.returncode != 0, f"the client did not notice the {kind} fault: {out}"
    msg = json.loads(out)["results"][0]["msg"]
    if kind == "kill-agent":
        # The client cannot tell a killed agent from a dropped connection (sshd sends exit-signal,
        # not an exit status), so either message is right; the node's evidence below tells them
        # apart.
        assert "agent failed" in msg or "lost during the step" in msg, msg
        # Node evidence: the agent died inside the lock (its pid still names the holder, or its
        # lock-info temp file is there), and its session outlived it and then closed normally.
        assert holder == agent or (node.state_dir / f".lock.json.fleetops-tmp-{agent}").exists(), (
            holder
        )
        wait_for(
            lambda: log_closed_session(node, port, since),
            f"sshd.log to show the session from port {port} closed",
        )
    else:
        assert "lost during the step" in msg, msg
        # Node evidence: the sessions existed and are gone (/proc), the node's sshd never logged the
        # session's end (it was cut, not closed), the agent lived on and left the lock itself.
        assert killed and not any(running(p) for p in killed)
        assert not log_closed_session(node, port, since, cut), (
            f"the session from port {port} (id {cut}) closed normally: not a cut"
        )
        assert not (node.state_dir / "lock.json").exists(), (
            "the cut agent did not release the lock itself"
        )
        assert not temp_files(node), "the cut agent left a temp file: it did not unwind cleanly"
        if kind == "stop-sshd":
            assert node.pid() != listener and running(node.pid())
    TALLY[(op, kind)]["verified"] += 1
    return Fault(agent, proc.returncode, msg, kind == "kill-agent" and holder == agent)


def expected_after(op: str, point: str, n: int, kind: str) -> dict[str, str]:
    """Each file's exact form right after the fault. A killed agent dies at `point`: only the writes
    before it are done (the next run finishes the set). A cut agent is still alive: it puts back
    what it wrote, unless every file was already written (then the set stays whole and new)."""
    whole_new = point == f"{op}.target.after_rename" and n == len(MODULES)
    out = {}
    for i, module in enumerate(MODULES, start=1):
        written = point.startswith(op + ".") and (
            i < n or (i == n and point == f"{op}.target.after_rename")
        )
        if kind != "kill-agent":
            written = whole_new
        out[module] = DONE[op] if written else BEFORE[op]
    return out


def assert_forms(node, forms: dict, want: dict[str, str], when: str) -> None:
    for module, form in want.items():
        got = file_sha(node, module)
        assert got == forms[module][form], (
            f"{when}: {module} should be {form} but is "
            f"{next((f for f, s in forms[module].items() if s == got), 'NEITHER')}"
        )


@pytest.mark.parametrize(
    ("op", "point", "n", "kind"), CASES, ids=[f"{op}-{p}-hit{n}-{k}" for op, p, n, k in CASES]
)
def test_fault(lab, op, point, n, kind):
    node = lab.node("lab01")
    assert (point, n) in enumerated(lab)[op], (
        f"the node no longer reaches {point} (hit {n}) during {op}"
    )
    clear_fault_leftovers(node)
    forms = independent_forms(node)  # the lab fixture just gave the node pristine files
    if op == "rollback":
        (r,) = results(lab, node, "patch")
        assert r.status.value == "changed", r.msg
        assert_forms(node, forms, {m: "patched" for m in MODULES}, "after patch")
    TALLY[(op, kind)]["injected"] += 1
    fault = inject(lab, node, op, point, n, kind)
    DONE_CASES.add((op, point, n, kind))

    assert_forms(
        node, forms, expected_after(op, point, n, kind), f"right after {kind} at {point} (hit {n})"
    )
    for tmp in temp_files(node):  # only a dead writer's half-done write may be left, and only now
        assert temp_writer(tmp) == fault.agent and not running(fault.agent), (
            f"{tmp} left by a live writer"
        )

    (r,) = results(lab, node, op)
    assert r.status.value in ("changed", "ok"), r.msg
    if fault.stale_lock:
        notes = [note for item in r.items for note in item.details.get("notes", [])]
        assert notes and f"pid {fault.agent} is gone" in notes[0], notes
    assert temp_files(node) == [], "temp files left after the next run"
    assert_forms(node, forms, {m: DONE[op] for m in MODULES}, f"after the next {op}")

    undo = "rollback" if op == "patch" else "patch"
    (r,) = results(lab, node, undo)
    assert r.status.value == "changed", r.msg
    assert temp_files(node) == []
    assert_forms(node, forms, {m: DONE[undo] for m in MODULES}, f"after {undo}")


def test_zz_fault_tally(request, capsys):
    """Every selected fault was injected and verified by the node's own evidence; print the
    tally."""
    selected = Counter(
        (i.callspec.params["op"], i.callspec.params["kind"])
        for i in request.session.items
        if i.module is request.module and getattr(i, "originalname", "") == "test_fault"
    )
    assert selected, "no fault test ran: run the whole file"
    lines = ["", "fault injection tally (injected / verified by the node's evidence):"]
    for kind in KINDS:
        per_op = ", ".join(
            f"{op} {TALLY[(op, kind)]['injected']}/{TALLY[(op, kind)]['verified']}" for op in OPS
        )
        total = [sum(TALLY[(op, kind)][k] for op in OPS) for k in ("injected", "verified")]
        lines.append(f"  {kind:15s} {total[0]:3d} / {total[1]:3d}   ({per_op})")
    injected = sum(c["injected"] for c in TALLY.values())
    points = {(op, point, n) for op, point, n, _ in DONE_CASES}
    lines.append(
        f"  {injected} faults injected at {len(points)} distinct (operation, point, hit) of "
        f"{sum(len(v) for v in _ENUMERATED.values())} enumerated"
    )
    with capsys.disabled():  # shown in every run, not only with -s
        print("\n".join(lines))
    for (op, kind), want in selected.items():
        got = TALLY[(op, kind)]
        assert got["injected"] == want, (
            f"{op}/{kind}: {got['injected']} injected of {want} selected"
        )
        assert got["verified"] == got["injected"] > 0, (
            f"{op}/{kind}: only {got['verified']} of {got['injected']} faults verified on the node"
        )
    # the whole file ran: every enumerated point was faulted
    if sum(selected.values()) == len(CASES):
        assert set(CASES) == DONE_CASES, f"not injected: {sorted(set(CASES) - DONE_CASES)}"
        for op in OPS:
            for kind in KINDS:
                assert {c[1:3] for c in DONE_CASES if c[0] == op and c[3] == kind} == set(
                    _ENUMERATED[op]
                )
