"""Where fleetops' time goes, measured on the bench's lab (called by bench/run.py at the end of a run; it can
also wrap one `fab` invocation by itself). Nothing in fleetops is changed: the timeline wraps
fleetops.wire.ssh.NodeConnection's methods from outside.

    python3 bench/profile_fleetops.py --timeline OUT.json -- <fab args>   # one fab run, with a timeline

`profile()` returns a markdown section:
  1. start-up: `fab --list` wall, `-X importtime` by package, the cost of compiling fleetops' sources
     (this machine sets PYTHONDONTWRITEBYTECODE=1 and the editable checkout has no __pycache__);
  2. the timeline of `patch verify` at N = 1 and N = max, at 0 ms and the bench's RTT: start-up, connect, each
     exec (with the agent's own time on the node), exit; plus how often the agent zip is built and
     known_hosts parsed;
  3. the client's Python CPU by area (py-spy --gil over every thread, if py-spy is in the peers' venv);
  4. the node side: cost of one SSH connection, of one exec (sshd session + login shell), of each agent call.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

T0 = time.perf_counter()
BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


def _src() -> Path:
    """Where the fleetops being measured lives (bench/run.py's snapshot, or the checkout)."""
    import fleetops

    return Path(fleetops.__file__).resolve().parent.parent


# ------------------------------------------------------------------ wrapper modes (run inside the fab process)
def _wrap_timeline(out: str, argv: list[str]) -> int:
    from fleetops import startup

    startup.hold()  # as the installed fab does (fleetops/entry.py), before Fabric is imported
    events: list[dict] = []
    counters = {"bundle_builds": 0, "bundle_cpu": 0.0, "hostkeys_loads": 0, "hostkeys_cpu": 0.0}
    import functools
    import threading

    def ev(kind: str, host: str = "", **kw) -> None:
        events.append(
            {"t": time.perf_counter() - T0, "kind": kind, "host": host, "thread": threading.current_thread().name, **kw}
        )

    from fleetops import entry

    program = entry.import_program().program  # the installed fleet's program, imported as fleet imports it
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

    def counted_build():  # the same lru_cache(maxsize=1) as fleetops', counting how often it really builds
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

    bundle._agent_bundle = functools.lru_cache(maxsize=1)(counted_build)  # agent_bundle() calls it under its lock
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


# ------------------------------------------------------------------ measurements (run from bench/run.py)
def _run(
    cmd: list[str], cwd: Path, env: dict, timeout: float = 300
) -> tuple[float, float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    r0 = os.times()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    r1 = os.times()
    return (
        time.perf_counter() - t,
        (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system),
        proc,
    )


def _importtime(text: str) -> tuple[float, dict[str, float]]:
    """Total and per-top-level-package self time (s) from -X importtime output."""
    per: dict[str, float] = {}
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if not m:
            continue
        self_us, name = int(m.group(1)), m.group(4)
        top = name.split(".")[0]
        per[top] = per.get(top, 0.0) + self_us / 1e6
        total += self_us / 1e6
    return total, per


def _fmt_pkgs(per: dict[str, float], total: float, k: int = 8) -> str:
    top = sorted(per.items(), key=lambda kv: -kv[1])[:k]
    return ", ".join(f"{name} {sec * 1e3:.0f} ms" for name, sec in top) + f" (all imports {total * 1e3:.0f} ms)"


def _timeline_stats(events: list[dict], wall: float) -> dict:
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
            starts[(e["host"], e["kind"])] = e["t"]  # answers may be read on another thread than the start
        elif e["kind"] == "connect_end":
            connects.append(e["t"] - starts.pop((key, "connect_start"), e["t"]))
        elif e["kind"] == "exec_end" and (e["host"], "exec_start") in starts:
            exec_ends[e["host"]] = e["t"] - starts[(e["host"], "exec_start")]  # the last answer ends it
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


def _node_costs(node, client_key: str, known_hosts: str, reps: int = 10, cgroups=None) -> dict:
    """Node CPU of one connection, one exec of `true`, and each agent call; all over paramiko from this
    process. `cgroups` (bench/run.py's CpuCgroups, the node's listener in its bench-nodes): the cgroup's usage,
    which charges every session process however it ends; without it, the listener's process tree from /proc
    (undercounts what leaves the tree or is reaped after the reading)."""
    import paramiko

    from fleetops.plans.playbook import load_playbook
    from fleetops.wire.bundle import agent_bundle
    from remote_scripts.core.protocol import PROTOCOL

    pid = node.pid()
    clk = os.sysconf("SC_CLK_TCK")

    def cpu_of(p: int) -> float:
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return sum(int(x) for x in f[11:15]) / clk

    def node_cpu() -> float:
        """The listener and everything under it, live (sessions on our open connection) or reaped."""
        if cgroups:
            return cgroups.usage("nodes")
        parent = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    parent[int(entry.name)] = int(
                        Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1]
                    )
                except (OSError, ValueError, IndexError):
                    pass
        total, frontier = cpu_of(pid), {pid}
        while frontier:
            frontier = {c for c, pp in parent.items() if pp in frontier}
            total += sum(cpu_of(c) for c in frontier)
        return total

    def settle(before: set[int], fallback: float) -> None:
        """Until the step's sshd session processes have ended (only those alive before it remain): a fixed
        sleep read the node CPU before a loaded machine had finished tearing the session down."""
        if cgroups:
            cgroups.settle("nodes", before, timeout=10)
        else:
            time.sleep(fallback)

    def procs() -> set[int]:
        return cgroups.procs("nodes") if cgroups else set()

    def client() -> paramiko.SSHClient:
        c = paramiko.SSHClient()
        c.load_host_keys(known_hosts)
        c.set_missing_host_key_policy(paramiko.RejectPolicy())
        c.connect(
            "127.0.0.1",
            port=node.port,
            username="root",
            key_filename=client_key,
            look_for_keys=False,
            allow_agent=False,
        )
        return c

    def run(c: paramiko.SSHClient, cmd: str, stdin: bytes = b"") -> tuple[float, bytes]:
        t = time.perf_counter()
        chan = c.get_transport().open_session()
        chan.exec_command(cmd)
        if stdin:
            chan.sendall(stdin)
        chan.shutdown_write()
        out = b""
        while True:
            d = chan.recv(65536)
            if not d:
                break
            out += d
        chan.recv_exit_status()
        chan.close()
        return time.perf_counter() - t, out

    out: dict = {}
    # one connection, no exec
    walls, cpus = [], []
    for _ in range(reps):
        before = procs()
        c0, t = node_cpu(), time.perf_counter()
        c = client()
        walls.append(time.perf_counter() - t)
        c.close()
        settle(before, 0.1)
        cpus.append(node_cpu() - c0)
    out["connect"] = (statistics.median(walls), statistics.mean(cpus))
    book = load_playbook(_src() / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml")
    agent = f"{node.state_dir}/bin/{agent_bundle().filename}"
    base = {"protocol": PROTOCOL, "state_dir": str(node.state_dir), "operator": "bench@profile"}
    cases = [
        ("exec `true` (sshd session + login shell)", "true", b""),
        ("agent ping", f"{node.python} {agent}", json.dumps({**base, "op": "ping"}).encode()),
        (
            "agent patch (steady state)",
            f"{node.python} {agent}",
            json.dumps({**base, "op": "patch", **book.patch_request(False)}).encode(),
        ),
        (
            "agent verify grep,compile",
            f"{node.python} {agent}",
            json.dumps({**base, "op": "verify", **book.verify_request({"grep", "compile"})}).encode(),
        ),
    ]
    c = client()
    try:
        for label, cmd, stdin in cases:
            walls, cpus, inside = [], [], []
            for _ in range(reps):
                before = procs()
                c0 = node_cpu()
                w, data = run(c, cmd, stdin)
                settle(before, 0.05)
                walls.append(w)
                cpus.append(node_cpu() - c0)
                if stdin:
                    try:
                        inside.append(json.loads(data.decode().strip().splitlines()[-1])["seconds"])
                    except (ValueError, IndexError, KeyError):
                        pass
            out[label] = (
                statistics.median(walls),
                statistics.mean(cpus),
                statistics.median(inside) if inside else None,
            )
        # The agent's imports as the node runs them (over SSH: the node's environment, its bytecode cache).
        for op, req in (
            ("ping", {**base, "op": "ping"}),
            ("verify", {**base, "op": "verify", **book.verify_request({"grep", "compile"})}),
        ):
            _, data = run(c, f"{node.python} -X importtime {agent} 2>&1", json.dumps(req).encode())
            text = data.decode(errors="replace")
            total, per = _importtime(text)
            mods = {}
            for line in text.splitlines():
                m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(remote_scripts\.\S+)", line)
                if m:
                    mods[m.group(4)] = int(m.group(1)) / 1e6
            out[f"agent_imports_{op}"] = (total, per, mods)
    finally:
        c.close()
    # The node python's own start-up (locally).
    t = time.perf_counter()
    for _ in range(reps):
        subprocess.run([str(node.python), "-c", "pass"], check=True)
    out["python_startup"] = (time.perf_counter() - t) / reps
    # The login shell's rc files, which sshd's `bash -c` runs for every exec (bash sources ~/.bashrc when
    # started by sshd): the same shell locally, with and without them.
    home = os.path.expanduser("~")
    clean = {"HOME": home, "PATH": "/usr/bin:/bin"}
    for label, cmd in (("shell_rc", f". {home}/.bashrc"), ("shell_bare", "true")):
        t = time.perf_counter()
        for _ in range(reps):
            subprocess.run(["bash", "-c", cmd], env=clean, capture_output=True)
        out[label] = (time.perf_counter() - t) / reps
    return out


AREAS = [  # (area, substring of any frame in a py-spy stack), first match wins
    ("start-up: imports", "_find_and_load"),
    ("agent zip build (fleetops/wire/bundle.py agent_bundle)", "agent_bundle ("),
    ("connect: Connection setup, handshake, auth, known_hosts (NodeConnection.open)", "NodeConnection.open ("),
    ("exec: channel open, send, drain loop (NodeConnection.exec / _drain)", "NodeConnection.exec ("),
    ("JSON request/answer (NodeConnection.call)", "NodeConnection.call ("),
    ("Fabric Connection/Config per task call (executor context)", "make_context ("),
    ("paramiko transport thread (packets, crypto glue)", "Transport.run ("),
    ("output: rich rendering (fleetops/report.py)", "report.py"),
    ("inventory, playbook, task plans", "plan_for ("),
    ("main thread: CLI, fabfile, executor loop (fleetops/rollout.py _run_batch polls wait(0.2 s))", "Program.run ("),
]


def _pyspy(pyspy: str, fab: str, project: Path, env: dict, work: Path, rate: int = 250) -> dict | None:
    out = work / "pyspy.txt"
    cmd = [
        pyspy,
        "record",
        "--gil",
        "-r",
        str(rate),
        "-f",
        "raw",
        "-o",
        str(out),
        "--",
        sys.executable,
        fab,
        "-H",
        "@bench",
        "patch",
        "verify",
        "--kinds",
        "grep,compile",
    ]
    wall, cpu, proc = _run(cmd, project, env)
    if not out.exists():
        return {"error": (proc.stderr or proc.stdout)[-500:]}
    areas: dict[str, int] = {}
    leaves: dict[str, int] = {}
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        area = next((a for a, needle in AREAS if needle in stack), "other")
        areas[area] = areas.get(area, 0) + n
        leaf = stack.split(";")[-1]
        leaves[leaf] = leaves.get(leaf, 0) + n
    return {"rate": rate, "total": total, "areas": areas, "leaves": leaves, "wall": wall}


def timeline(project: Path, env: dict, work: Path, label: str, size: int) -> dict | None:
    """One wrapped `patch verify` over the hosts of hosts/bench.yaml (the caller wrote it)."""
    out = work / f"timeline-{label}.json"
    out.unlink(missing_ok=True)
    wall, _, proc = _run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--timeline",
            str(out),
            "--",
            "-H",
            "@bench",
            "patch",
            "verify",
            "--kinds",
            "grep,compile",
        ],
        project,
        env,
    )
    if proc.returncode != 0 or not out.exists():
        return None
    data = json.loads(out.read_text())
    stats = _timeline_stats(data["events"], wall)
    stats["counters"] = data["counters"]
    stats["size"] = size
    return stats


def profile(
    project: Path, node, n: int, fab: str, env: dict, work: Path, delayed=None, rtt: float = 0,
    pyspy: str | None = None, cgroups=None,
) -> str:
    """`delayed(rtt, size)`: a context manager (from bench/run.py) that points hosts/bench.yaml at the first
    `size` nodes, through a delay proxy of `rtt` ms when rtt > 0. `cgroups`: bench/run.py's CpuCgroups (node
    CPU by cgroup), or None (per process)."""
    py = sys.executable
    L = ["## Where fleetops' time goes (profile, same run)", ""]

    # 1. start-up
    lists = [_run([fab, "--list"], project, env)[0] for _ in range(5)]
    bare = [_run([py, "-c", "pass"], project, env)[0] for _ in range(5)]
    libs = [_run([py, "-c", "import fabric, invoke, paramiko, rich.console"], project, env)[0] for _ in range(5)]
    _, _, it = _run([py, "-X", "importtime", fab, "--list"], project, env)
    total, per = _importtime(it.stderr)
    fo_mods = {}
    for line in it.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(fleetops\S*|fabfile)$", line)
        if m:
            fo_mods[m.group(4)] = int(m.group(1)) / 1e6
    t = time.perf_counter()
    lines = 0
    for path in sorted((_src() / "fleetops").glob("*.py")) + [_src() / "fabfile.py"]:
        text = path.read_text()
        lines += len(text.splitlines())
        compile(text, str(path), "exec")
    fo_compile = time.perf_counter() - t
    L += [
        "### 1. Start-up (client, no network)",
        "",
        f"- `python -c pass`: {statistics.median(bare):.3f} s; `import fabric, invoke, paramiko, rich.console`: "
        f"{statistics.median(libs):.3f} s; `fab --list`: {statistics.median(lists):.3f} s (medians of 5).",
        f"- `-X importtime` of `fab --list`, self time by top-level package: {_fmt_pkgs(per, total)}.",
        "- fleetops' own modules (self time, includes compiling their source): "
        + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in sorted(fo_mods.items(), key=lambda kv: -kv[1])[:8])
        + ".",
        f"- Compiling all of fleetops/*.py + fabfile.py ({lines} lines) costs {fo_compile * 1e3:.0f} ms, paid on "
        f"every run here: PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r} on this "
        f"machine and the checkout has {'a' if (REPO / 'fleetops' / '__pycache__').exists() else 'no'} "
        "fleetops/__pycache__.",
        "",
    ]

    # 2. timelines
    rows = []
    plan = [(0.0, 1), (0.0, n)] + ([(rtt, 1), (rtt, n)] if rtt and delayed else [])
    for r, size in plan:
        if delayed is None:
            stats = timeline(project, env, work, f"rtt{r:g}-n{size}", size)
        else:
            with delayed(r, size):
                stats = timeline(project, env, work, f"rtt{r:g}-n{size}", size)
        rows.append((r, size, stats))
    L += [
        "### 2. Timeline of one `fab -H @bench patch verify --kinds grep,compile` (wrapped in-process)",
        "",
        "Seconds from the wrapper's start (the interpreter's own start-up, about the `python -c pass` above, "
        "comes before it). connect = TCP + SSH handshake + auth of one host; exec = one agent call, client side "
        "(the agent's own time on the node, as it reports it, in its own column). With delay, the extra time "
        "over the 0 ms row is also given in RTTs (node work overlaps the network, so an exec adds fewer RTTs "
        "than it has round trips).",
        "",
        "| RTT ms | N | imports done | executor start | first connect | last connect done | connect median/max | "
        "exec median/max | agent patch / verify (node) | last exec done | exit | wall (parent) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {size: s for r, size, s in rows if r == 0 and s}
    for r, size, s in rows:
        if s is None:
            L.append(f"| {r:g} | {size} | failed |")
            continue
        agent = s["agent"]
        extra = ("", "")
        if r and base.get(size):
            b, unit = base[size], r / 1e3
            extra = (
                f" (+{(s['connect_med'] - b['connect_med']) / unit:.1f} RTT vs 0 ms)",
                f" (+{(s['exec_med'] - b['exec_med']) / unit:.1f} RTT vs 0 ms)",
            )
        L.append(
            f"| {r:g} | {size} | {s['imports']:.3f} | {s['execute_start']:.3f} | {s['first_connect']:.3f} | "
            f"{s['last_connect_end']:.3f} | {s['connect_med']:.3f} / {s['connect_max']:.3f}{extra[0]} | "
            f"{s['exec_med']:.3f} / {s['exec_max']:.3f}{extra[1]} | {agent.get('patch', 0):.3f} / "
            f"{agent.get('verify', 0):.3f} | {s['last_exec_end']:.3f} | {s['exit']:.3f} | {s['wall']:.3f} |"
        )
    big = next((s for r, size, s in rows if r == 0 and size == n and s), None)
    if big:
        c = big["counters"]
        L += [
            "",
            f"In the N = {n} run: the agent zip was built {c['bundle_builds']} times "
            f"({c['bundle_cpu'] * 1e3:.0f} ms CPU, read from the client's cache when the sources did not change; "
            "`fleetops/wire/bundle.py` agent_bundle builds it once under a lock); known_hosts "
            f"was parsed {c['hostkeys_loads']} times ({c['hostkeys_cpu'] * 1e3:.0f} ms CPU; "
            "`fleetops/wire/ssh.py` keeps each file parsed once per run).",
        ]
    L.append("")

    # 3. client CPU by area (py-spy, GIL-holding samples of every thread)
    if pyspy:
        with delayed(0.0, n) if delayed else _null():
            spy = _pyspy(pyspy, fab, project, env, work)
        if spy and "error" not in spy:
            sec = lambda k: k / spy["rate"]  # noqa: E731
            L += [
                f"### 3. Client CPU by area, N = {n}, RTT 0 (py-spy --gil, {spy['rate']} Hz, every thread)",
                "",
                f"{sec(spy['total']):.2f} s of samples holding the GIL (Python-level CPU; the rest of the "
                "process's CPU is C code without the GIL and the kernel). Each stack is counted in the first "
                "area that matches.",
                "",
                "| area | s | share |",
                "|---|---|---|",
            ]
            for area, count in sorted(spy["areas"].items(), key=lambda kv: -kv[1]):
                L.append(f"| {area} | {sec(count):.2f} | {count / spy['total']:.0%} |")
            L += [
                "",
                "Top functions (self): "
                + "; ".join(
                    f"`{leaf.strip() or '(native)'}` {sec(count):.2f} s"
                    for leaf, count in sorted(spy["leaves"].items(), key=lambda kv: -kv[1])[:8]
                )
                + ".",
                "",
            ]
        else:
            L += ["### 3. Client CPU by area", "", f"py-spy failed: {spy.get('error') if spy else '?'}", ""]

    # 4. node side
    known_hosts = str(project / ".lab" / "bench_known_hosts")
    with delayed(0.0, 1) if delayed else _null():
        costs = _node_costs(node, str(project / ".lab" / "id_ed25519"), known_hosts, cgroups=cgroups)
    L += [
        "### 4. Node side (one lab node, over one paramiko connection; node CPU = "
        + (f"the nodes' cgroup, {cgroups.method}: every sshd session process however it ended; the other "
           "listeners are idle)" if cgroups else "the sshd listener's process tree from /proc, a lower bound: "
           "it misses session processes reaped late or reparented")
        + ")",
        "",
        "| step | wall s | node CPU s | agent's own time s |",
        "|---|---|---|---|",
        f"| SSH connection (handshake + auth, no exec) | {costs['connect'][0]:.3f} | {costs['connect'][1]:.3f} | |",
    ]
    for label, value in costs.items():
        if isinstance(value, tuple) and len(value) == 3 and not label.startswith("agent_imports_"):
            w, c, inside = value
            L.append(f"| {label} | {w:.3f} | {c:.3f} | {'' if inside is None else f'{inside:.3f}'} |")
    total_i, per_i, mods = costs["agent_imports_verify"]
    total_p = costs["agent_imports_ping"][0]
    L += [
        "",
        f"- Node python start-up alone: {costs['python_startup']:.3f} s.",
        "- Every exec runs the login user's shell (sshd starts `bash -c CMD`). Sourcing root's ~/.bashrc "
        f"costs {costs['shell_rc']:.3f} s locally against {costs['shell_bare']:.3f} s for a bare `bash -c true`; "
        + ("an exec of `true` over SSH costs about as much node CPU, so the lab's sessions pay it, once per exec "
           "(fleetops 1 per host, the peers 3)."
           if costs["exec `true` (sshd session + login shell)"][1] >= costs["shell_rc"] / 2 else
           f"an exec of `true` over SSH costs {costs['exec `true` (sshd session + login shell)'][1]:.3f} s of node "
           "CPU, so the lab's sessions do not source it (a node whose sshd-started bash does pays it once per "
           "exec: fleetops 1 per host, the peers 3)."),
        f"- The agent's imports on the node, run over SSH as fleetops runs it (`-X importtime`): op verify "
        f"{total_i * 1e3:.0f} ms in all (remote_scripts modules: "
        + (", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in sorted(mods.items(), key=lambda kv: -kv[1])[:6]) or "none")
        + f"), op ping {total_p * 1e3:.0f} ms.",
        "",
    ]
    FACTS.update(
        {
            "connect_node_cpu": costs["connect"][1],
            "exec_true_node_cpu": costs["exec `true` (sshd session + login shell)"][1],
            "shell_rc": costs["shell_rc"],
            "python_startup": costs["python_startup"],
            "agent_patch_node_cpu": costs["agent patch (steady state)"][1],
            "agent_verify_node_cpu": costs["agent verify grep,compile"][1],
            "agent_patch_own": costs["agent patch (steady state)"][2],
            "agent_verify_own": costs["agent verify grep,compile"][2],
            "agent_imports": total_i,
            "startup_list": statistics.median(lists),
            "imports_total": total,
            "timelines": {f"{r:g}/{size}": s for r, size, s in rows if s},
        }
    )
    if pyspy and spy and "error" not in spy:
        FACTS["pyspy"] = {a: c / spy["rate"] for a, c in spy["areas"].items()}
    return "\n".join(L)


FACTS: dict = {}  # numbers the bench's analysis quotes


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main() -> int:
    if len(sys.argv) >= 4 and sys.argv[1] == "--timeline" and sys.argv[3] == "--":
        code = _wrap_timeline(sys.argv[2], sys.argv[4:])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # as fleetops.cli ends `fab`: no interpreter teardown after the run
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
