"""fleetops.api.run inside a host program that has its own Ctrl-C handler: the handler stays the
program's for the whole run (a thread watches it), it is the one Python calls on SIGINT, and the
KeyboardInterrupt it raises stops the run as `fab`'s Ctrl-C does (starting nothing new, the node's
step interrupted and reported as such) instead of ending the host program. A second Ctrl-C during
the stop cuts it short; the host program still runs on. Real lab node, real signals to a real
process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.lab

HOST_PROGRAM = """
import json, signal, sys, threading, time
from fleetops import api

calls = []

def host_handler(signum, frame):
    calls.append(signum)
    raise KeyboardInterrupt

signal.signal(signal.SIGINT, host_handler)
seen = set()
done = threading.Event()

def watch():
    while not done.is_set():
        seen.add(signal.getsignal(signal.SIGINT) is host_handler)
        time.sleep(0.01)

threading.Thread(target=watch, daemon=True).start()
started = time.monotonic()
try:
    results = api.run(".", "lab01", [("run", {"command": sys.argv[1]}), ("ping", {})])
    raised = None
except KeyboardInterrupt:
    results, raised = [], "KeyboardInterrupt"
done.set()
print(json.dumps({"calls": len(calls), "handler_always_the_hosts": seen == {True},
                  "handler_after": signal.getsignal(signal.SIGINT) is host_handler, "raised": \
raised,
                  "seconds": time.monotonic() - started,
                  "results": [[r.host, r.task, r.status.value, r.code, r.data.get("error_kind")] \
for r in results]}))
print("host program still running")
"""


def host_run(lab, marker: Path, interrupts: int) -> tuple[int, dict, str]:
    """The host program runs a long command on lab01; once the node has started it (the marker
    file), the program gets `interrupts` SIGINTs, a tenth of a second apart."""
    marker.unlink(missing_ok=True)
    command = f"echo started > {marker}; sleep 60"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOST_PROGRAM, command],
        cwd=lab.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the node never started the command"
            time.sleep(0.05)
        for _ in range(interrupts):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.1)
        out, err = proc.communicate(timeout=45)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = out.splitlines()
    assert proc.returncode == 0 and lines[-1:] == ["host program still running"], (
        proc.returncode,
        out,
        err,
    )
    return proc.returncode, json.loads(lines[-2]), err


@pytest.mark.parametrize("interrupts", [1, 2])
def test_the_host_programs_handler_is_untouched_and_its_ctrl_c_stops_the_run(
    lab, tmp_path, interrupts
):
    _, seen, err = host_run(lab, tmp_path / "started", interrupts)
    assert seen["handler_always_the_hosts"] and seen["handler_after"], seen
    assert seen["calls"] == interrupts, seen  # Python called the host's handler, for every Ctrl-C
    # stopped, not waited out (sleep 60)
    assert seen["raised"] is None and seen["seconds"] < 30, seen
    ran, never = seen["results"]
    assert ran == ["lab01", "run", "failed", 130, "interrupted"], seen
    assert never[:3] == ["lab01", "ping", "skipped"], seen
    assert err == "", err  # quiet: nothing printed, the Ctrl-C note included
