"""The timeline of one `fab` run, taken inside its process: fleetops.wire.ssh.NodeConnection's
connect, agent session and answers, and the executor, wrapped from outside (nothing in fleetops is
changed); how often the agent zip is built and known_hosts parsed. `timeline()` runs
bench/profile_fleetops.py --timeline and reads the phases back.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from benchpaths import PATCH_VERIFY
from profile_tools import timed_run

# the wrapper's events are seconds from here (the script's start, give or take its imports)
T0 = time.perf_counter()


def wrap_timeline(out: str, argv: list[str]) -> int:
    """Run `fab ARGV` in this process with NodeConnection and the executor wrapped; the events go to
    `out`."""
    from fleetops import startup

    startup.hold()  # as the installed fab does (fleetops/entry.py), before Fabric is imported
    events: list[dict] = []
    counters = {"bundle_builds": 0, "bundle_cpu": 0.0, "hostkeys_loads": 0, "hostkeys_cpu": 0.0}
    import functools
    import threading

    def ev(kind: str, host: str = "", **kw) -> None:
        events.append(
            {
                "t": time.perf_counter() - T0,
                "kind": kind,
                "host": host,
                "thread": threading.current_thread().name,
                **kw,
            }
        )

    from fleetops import entry

    # the installed fleet's program, imported as fleet imports it
    program = entry.import_program().program
    import paramiko.hostkeys as hostkeys

    import fleetops.fab.executor as fabexec
    import fleetops.wire.bundle as bundle
    import fleetops.wire.ssh as transport

    ev("imports_done")
    # The agent session (wire/ssh.py): one exec per host starts it, every request is answered on it.
    orig_open, orig_session, orig_answer = (
        transport.NodeConnection.open,
        transport.NodeConnection._agent_session,
        transport.NodeConnection._answer_of,
    )
    orig_execute = fabexec.FleetExecutor.execute
    build, load = bundle._agent_bundle.__wrapped__, hostkeys.HostKeys.load

    # the same lru_cache(maxsize=1) as fleetops', counting how often it really builds
    def counted_build():
        t = time.thread_time()
        try:
            return build()
        finally:
            counters["bundle_builds"] += 1
            counters["bundle_cpu"] += time.thread_time() - t

    def counted_load(self, filename):
        t = time.thread_time()
        try:
            return load(self, filename)
        finally:
            counters["hostkeys_loads"] += 1
            counters["hostkeys_cpu"] += time.thread_time() - t

    # agent_bundle() calls it under its lock
    bundle._agent_bundle = functools.lru_cache(maxsize=1)(counted_build)
    hostkeys.HostKeys.load = counted_load

    def open_(self):
        fresh = self.cxn is None or not self.cxn.is_connected
        if fresh:
            ev("connect_start", self.host.name)
        try:
            return orig_open(self)
        finally:
            if fresh:
                ev("connect_end", self.host.name)

    def agent_session(self):
        before = self.session
        session = orig_session(self)
        if session is not before:
            ev("exec_start", self.host.name)
        return session

    def answer_of(self, ticket):
        answer, evidence = orig_answer(self, ticket)
        ev("exec_end", self.host.name)  # the exec's time: from the agent's start to its last answer
        ev("call_done", self.host.name, op=ticket.op, node_seconds=answer.get("seconds"))
        return answer, evidence

    def execute(self, *tasks):
        ev("execute_start")
        try:
            return orig_execute(self, *tasks)
        finally:
            ev("execute_end")

    transport.NodeConnection.open = open_
    transport.NodeConnection._agent_session = agent_session
    transport.NodeConnection._answer_of = answer_of
    fabexec.FleetExecutor.execute = execute
    sys.argv = ["fleet", *argv]
    code = 0
    try:
        program.run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        ev("exit")
        Path(out).write_text(json.dumps({"events": events, "counters": counters}))
    return code


def timeline_stats(events: list[dict], wall: float) -> dict:
    by = lambda kind: [e for e in events if e["kind"] == kind]  # noqa: E731
    first = lambda kind: min((e["t"] for e in by(kind)), default=float("nan"))  # noqa: E731
    last = lambda kind: max((e["t"] for e in by(kind)), default=float("nan"))  # noqa: E731
    connects: list[float] = []
    exec_ends: dict = {}
    starts: dict = {}
    for e in events:
        key = (e["host"], e["thread"])
        if e["kind"] == "connect_start":
            starts[(key, e["kind"])] = e["t"]
        elif e["kind"] == "exec_start":
            # answers may be read on another thread than the start
            starts[(e["host"], e["kind"])] = e["t"]
        elif e["kind"] == "connect_end":
            connects.append(e["t"] - starts.pop((key, "connect_start"), e["t"]))
        elif e["kind"] == "exec_end" and (e["host"], "exec_start") in starts:
            # the last answer ends it
            exec_ends[e["host"]] = e["t"] - starts[(e["host"], "exec_start")]
    execs = list(exec_ends.values())
    node = {}
    for e in by("call_done"):
        node.setdefault(e["op"], []).append(e["node_seconds"] or 0.0)
    return {
        "imports": first("imports_done"),
        "execute_start": first("execute_start"),
        "first_connect": first("connect_start"),
        "last_connect_end": last("connect_end"),
        "last_exec_end": last("exec_end"),
        "execute_end": last("execute_end"),
        "exit": last("exit"),
        "wall": wall,
        "connect_med": statistics.median(connects) if connects else float("nan"),
        "connect_max": max(connects, default=float("nan")),
        "exec_med": statistics.median(execs) if execs else float("nan"),
        "exec_max": max(execs, default=float("nan")),
        "agent": {op: statistics.median(v) for op, v in node.items()},
    }


def timeline(project: Path, env: dict, work: Path, label: str, size: int) -> dict | None:
    """One wrapped `patch verify` over the hosts of hosts/bench.yaml (the caller wrote it)."""
    out = work / f"timeline-{label}.json"
    out.unlink(missing_ok=True)
    wall, _, proc = timed_run(
        [
            sys.executable,
            str(Path(__file__).resolve().parent / "profile_fleetops.py"),
            "--timeline",
            str(out),
            "--",
            *PATCH_VERIFY,
        ],
        project,
        env,
    )
    if proc.returncode != 0 or not out.exists():
        return None
    data = json.loads(out.read_text())
    stats = timeline_stats(data["events"], wall)
    stats["counters"] = data["counters"]
    stats["size"] = size
    return stats
