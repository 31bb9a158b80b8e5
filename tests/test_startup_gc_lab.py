"""The `fleet` program does not run Python's garbage collector while it starts (about 90
collections, 20-25 ms of client CPU before the first connection of `fleet -H lab01 patch verify`,
each walking the modules and plans just built) and collects as usual from the moment the run is
planned (fleetops/startup.py).

The lab test runs the installed entry point (fleetops.entry:main, what .venv/bin/fleet calls)
against a real lab sshd and watches the collector from inside the process: gc.callbacks count
collections, and the audit hook marks the run's first reach for the node (paramiko's
socket.connect, or the first `ssh` the openssh transport starts). The same run imports no task
family it does not name (client start-up). Invoke's own import of unittest.mock (and the asyncio
and ssl it pulls in) is Invoke's: fleetops stands in for no module (docs/perf.md has what it
costs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import REPO

WATCH = textwrap.dedent("""
    import gc, json, sys
    out = sys.argv.pop(1)
    seen = {"starting": 0, "running": 0, "connected": None}
    program = False
    def save():
        with open(out, "w") as f:
            json.dump(seen, f)
    def on_gc(phase, info):
        if phase == "stop" and program:
            # nothing is frozen until startup.release(): a collection before it is one of the \
start-up's
            seen["running" if gc.get_freeze_count() else "starting"] += 1
            save()
    def on_audit(event, args):
        # the run's first reach for the node: paramiko's socket, or the openssh transport's
        # first `ssh` (its `ssh -G`)
        if event in ("socket.connect", "subprocess.Popen") and seen["connected"] is None:
            seen["connected"] = {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}
            save()
    import os
    exit_now = os._exit
    def exiting(code):  # how the program ends (cli._run_and_exit): what it had imported by then
        seen["modules"] = sorted(m for m in sys.modules if m.startswith("fleetops.tasks."))
        save()
        exit_now(code)
    os._exit = exiting
    gc.callbacks.append(on_gc)
    sys.addaudithook(on_audit)
    sys.argv[0] = "fleet"
    from fleetops.entry import main
    program = True
    main()
""")


def _watched(project: Path, out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run(
        [sys.executable, "-c", WATCH, str(out), *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        # the run's own connections: on a live master (openssh) an agent started early connects
        # while the program starts, by design (wire/warmstart.py), before there is a run to plan
        env={**os.environ, "PYTHONPATH": str(REPO), "FLEETOPS_EARLY_AGENTS": "0"},
    )
    return proc, json.loads(out.read_text())


def test_fab_collects_nothing_while_it_starts_and_collects_again_once_planned(lab, tmp_path):
    proc, seen = _watched(
        lab.root, tmp_path / "gc.json", "-H", "lab01", "patch", "verify", "--kinds", "grep,compile"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert seen["connected"] is not None, "the run never connected"
    assert seen["starting"] == 0, f"{seen['starting']} collections while the program started"
    assert seen["connected"]["enabled"], "the collector was still off when the run connected"
    # what start-up built is out of every later collection's way (gc.freeze), not just left
    # uncollected
    # (tens of thousands of objects: ~49,000 for this run; none without the freeze)
    assert seen["connected"]["frozen"] > 20_000, seen
    assert seen["running"] > 0, "nothing was collected once the run was under way"
    # nor, start to end, a task family the run does not name that is not declared in the task table
    # itself (the declared families are the table: docs/architecture.md): the jobs family and
    # diagnose load on first use
    assert (
        "fleetops.tasks.patching" in seen["modules"] and "fleetops.tasks.checks" in seen["modules"]
    ), seen
    assert not [
        m
        for m in seen["modules"]
        if m.startswith(("fleetops.tasks.jobs", "fleetops.tasks.diagnose"))
    ], seen["modules"]


def test_a_failing_run_still_turns_the_collector_back_on(lab, tmp_path):
    """An unreachable host: the run is planned, connects (and fails); the collector is on by
    then."""
    lab.stop_node(lab.nodes()[1])
    try:
        proc, seen = _watched(lab.root, tmp_path / "gc.json", "-H", "lab02", "ping")
    finally:
        lab.start_node(lab.nodes()[1])
    assert proc.returncode != 0
    assert seen["starting"] == 0 and seen["connected"]["enabled"], seen


def _probe(body: str) -> dict:
    code = "import gc, json\nfrom fleetops import startup\n" + textwrap.dedent(body)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_release_turns_on_only_what_hold_turned_off():
    seen = _probe("""
        startup.hold(); held = gc.isenabled()
        startup.release(); released = (gc.isenabled(), gc.get_freeze_count() > 0)
        startup.release(); again = gc.isenabled()
        gc.disable(); startup.hold(); startup.release(); caller_off = gc.isenabled()
        print(json.dumps([held, released, again, caller_off]))
    """)
    assert seen == [False, [True, True], True, False]


def test_importing_the_cli_or_running_the_library_never_holds_the_collector():
    seen = _probe("""
        frozen = gc.get_freeze_count()  # Python 3.12 starts with some
        import fleetops.cli, fleetops.api, fleetops.run
        before = gc.isenabled()
        startup.release()  # what run.execute does: a no-op when nothing was held
        print(json.dumps([before, gc.isenabled(), gc.get_freeze_count() - frozen]))
    """)
    assert seen == [True, True, 0]
