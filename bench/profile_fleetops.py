"""Where fleetops' time goes, measured on the bench's lab (called by bench/run.py at the end of a
run; it can also wrap one `fab` invocation by itself). Nothing in fleetops is changed: the timeline
wraps fleetops.wire.ssh.NodeConnection's methods from outside (bench/profile_timeline.py).

    # one fab run, with a timeline:
    python3 bench/profile_fleetops.py --timeline OUT.json -- <fab args>

`profile()` returns a markdown section:
  1. start-up: `fab --list` wall, `-X importtime` by package, the cost of compiling fleetops'
     sources (this machine sets PYTHONDONTWRITEBYTECODE=1 and the editable checkout has no
     __pycache__);
  2. the timeline of `patch verify` at N = 1 and N = max, at 0 ms and the bench's RTT: start-up,
     connect, each exec (with the agent's own time on the node), exit; plus how often the agent zip
     is built and known_hosts parsed;
  3. the client's Python CPU by area (py-spy --gil over every thread, if py-spy is in the peers'
     venv);
  4. the node side: cost of one SSH connection, of one exec (sshd session + login shell), of each
     agent call (bench/profile_node.py).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from benchpaths import PATCH_VERIFY
from profile_node import EXEC_TRUE, node_costs
from profile_timeline import timeline, wrap_timeline
from profile_tools import fmt_pkgs, importtime, module_times, src_root, timed_run

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


AREAS = [  # (area, substring of any frame in a py-spy stack), first match wins
    ("start-up: imports", "_find_and_load"),
    ("agent zip build (fleetops/wire/bundle.py agent_bundle)", "agent_bundle ("),
    (
        "connect: Connection setup, handshake, auth, known_hosts (NodeConnection.open)",
        "NodeConnection.open (",
    ),
    (
        "exec: channel open, send, drain loop (NodeConnection.exec / _drain)",
        "NodeConnection.exec (",
    ),
    ("JSON request/answer (NodeConnection.call)", "NodeConnection.call ("),
    ("Fabric Connection/Config per task call (executor context)", "make_context ("),
    ("paramiko transport thread (packets, crypto glue)", "Transport.run ("),
    ("output: rich rendering (fleetops/report.py)", "report.py"),
    ("inventory, playbook, task plans", "plan_for ("),
    (
        "main thread: CLI, fabfile, executor loop "
        "(fleetops/rollout.py _run_batch polls wait(0.2 s))",
        "Program.run (",
    ),
]


def _pyspy(
    pyspy: str, fab: str, project: Path, env: dict, work: Path, rate: int = 250
) -> dict | None:
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
        *PATCH_VERIFY,
    ]
    wall, cpu, proc = timed_run(cmd, project, env)
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


def profile(
    project: Path,
    node,
    n: int,
    fab: str,
    env: dict,
    work: Path,
    delayed=None,
    rtt: float = 0,
    pyspy: str | None = None,
    cgroups=None,
) -> str:
    """`delayed(rtt, size)`: a context manager (from bench/run.py) that points hosts/bench.yaml at
    the first `size` nodes, through a delay proxy of `rtt` ms when rtt > 0. `cgroups`:
    bench/cpuacct.py's CpuCgroups (node CPU by cgroup), or None (per process)."""
    facts: dict = {}  # FACTS gets them only once every section has run
    L = ["## Where fleetops' time goes (profile, same run)", ""]
    L += _startup(project, fab, env, facts)
    L += _timelines(project, env, work, n, rtt, delayed, facts)
    if pyspy:
        L += _client_areas(pyspy, fab, project, env, work, n, delayed, facts)
    L += _node_side(project, node, delayed, cgroups, facts)
    FACTS.update(facts)
    return "\n".join(L)


def _startup(project: Path, fab: str, env: dict, facts: dict) -> list[str]:
    """1. `python -c pass`, the libraries' imports, `fab --list`, its -X importtime, compiling
    fleetops."""
    py = sys.executable
    lists = [timed_run([fab, "--list"], project, env)[0] for _ in range(5)]
    bare = [timed_run([py, "-c", "pass"], project, env)[0] for _ in range(5)]
    libs = [
        timed_run([py, "-c", "import fabric, invoke, paramiko, rich.console"], project, env)[0]
        for _ in range(5)
    ]
    _, _, it = timed_run([py, "-X", "importtime", fab, "--list"], project, env)
    total, per = importtime(it.stderr)
    fo_mods = module_times(it.stderr, r"(?:fleetops\S*|fabfile)$")
    t = time.perf_counter()
    lines = 0
    for path in sorted((src_root() / "fleetops").rglob("*.py")) + [src_root() / "fabfile.py"]:
        text = path.read_text()
        lines += len(text.splitlines())
        compile(text, str(path), "exec")
    fo_compile = time.perf_counter() - t
    facts.update({"startup_list": statistics.median(lists), "imports_total": total})
    return [
        "### 1. Start-up (client, no network)",
        "",
        f"- `python -c pass`: {statistics.median(bare):.3f} s; `import fabric, invoke, paramiko, "
        f"rich.console`: {statistics.median(libs):.3f} s; `fab --list`: "
        f"{statistics.median(lists):.3f} s (medians of 5).",
        (
            "- `-X importtime` of `fab --list`, self time by top-level package: "
            f"{fmt_pkgs(per, total)}."
        ),
        "- fleetops' own modules (self time, includes compiling their source): "
        + ", ".join(
            f"{k} {v * 1e3:.0f} ms" for k, v in sorted(fo_mods.items(), key=lambda kv: -kv[1])[:8]
        )
        + ".",
        f"- Compiling all of fleetops/**/*.py + fabfile.py ({lines} lines) costs "
        f"{fo_compile * 1e3:.0f} ms, paid on "
        "every run here: "
        f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r} on this "
        "machine and the checkout has "
        f"{'a' if (REPO / 'fleetops' / '__pycache__').exists() else 'no'} "
        "fleetops/__pycache__.",
        "",
    ]


def _timelines(
    project: Path, env: dict, work: Path, n: int, rtt: float, delayed, facts: dict
) -> list[str]:
    """2. One wrapped `patch verify` at N = 1 and N = n, at 0 ms and at `rtt`."""
    rows = []
    plan = [(0.0, 1), (0.0, n)] + ([(rtt, 1), (rtt, n)] if rtt and delayed else [])
    for r, size in plan:
        with delayed(r, size) if delayed else _null():
            stats = timeline(project, env, work, f"rtt{r:g}-n{size}", size)
        rows.append((r, size, stats))
    L = [
        (
            "### 2. Timeline of one `fab -H @bench patch "
            "verify --kinds grep,compile` (wrapped in-process)"
        ),
        "",
        "Seconds from the wrapper's start (the interpreter's own start-up, about the `python -c "
        "pass` above, comes before it). connect = TCP + SSH handshake + auth of one host; exec = "
        "one agent call, client side (the agent's own time on the node, as it reports it, in its "
        "own column). With delay, the extra time over the 0 ms row is also given in RTTs (node "
        "work overlaps the network, so an exec adds fewer RTTs than it has round trips).",
        "",
        "| RTT ms | N | imports done | executor start | first connect | last connect done | "
        "connect median/max | exec median/max | agent patch / verify (node) | last exec done | "
        "exit | wall (parent) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {size: s for r, size, s in rows if r == 0 and s}
    L += [_timeline_row(r, size, s, base) for r, size, s in rows]
    big = next((s for r, size, s in rows if r == 0 and size == n and s), None)
    if big:
        c = big["counters"]
        L += [
            "",
            f"In the N = {n} run: the agent zip was built {c['bundle_builds']} times "
            f"({c['bundle_cpu'] * 1e3:.0f} ms CPU, read from the "
            "client's cache when the sources did not change; "
            "`fleetops/wire/bundle.py` agent_bundle builds it once under a lock); known_hosts "
            f"was parsed {c['hostkeys_loads']} times ({c['hostkeys_cpu'] * 1e3:.0f} ms CPU; "
            "`fleetops/wire/ssh.py` keeps each file parsed once per run).",
        ]
    L.append("")
    facts["timelines"] = {f"{r:g}/{size}": s for r, size, s in rows if s}
    return L


def _timeline_row(r: float, size: int, s: dict | None, base: dict) -> str:
    if s is None:
        return f"| {r:g} | {size} | failed |"
    agent = s["agent"]
    extra = ("", "")
    if r and base.get(size):
        b, unit = base[size], r / 1e3
        extra = (
            f" (+{(s['connect_med'] - b['connect_med']) / unit:.1f} RTT vs 0 ms)",
            f" (+{(s['exec_med'] - b['exec_med']) / unit:.1f} RTT vs 0 ms)",
        )
    return (
        f"| {r:g} | {size} | {s['imports']:.3f} | {s['execute_start']:.3f} | "
        f"{s['first_connect']:.3f} | {s['last_connect_end']:.3f} | {s['connect_med']:.3f} / "
        f"{s['connect_max']:.3f}{extra[0]} | {s['exec_med']:.3f} / {s['exec_max']:.3f}{extra[1]} "
        f"| {agent.get('patch', 0):.3f} / {agent.get('verify', 0):.3f} | "
        f"{s['last_exec_end']:.3f} | {s['exit']:.3f} | {s['wall']:.3f} |"
    )


def _client_areas(
    pyspy: str, fab: str, project: Path, env: dict, work: Path, n: int, delayed, facts: dict
) -> list[str]:
    """3. The client's Python CPU by area (py-spy, GIL-holding samples of every thread)."""
    with delayed(0.0, n) if delayed else _null():
        spy = _pyspy(pyspy, fab, project, env, work)
    if not spy or "error" in spy:
        return [
            "### 3. Client CPU by area",
            "",
            f"py-spy failed: {spy.get('error') if spy else '?'}",
            "",
        ]
    facts["pyspy"] = {a: c / spy["rate"] for a, c in spy["areas"].items()}
    sec = lambda k: k / spy["rate"]  # noqa: E731
    L = [
        f"### 3. Client CPU by area, N = {n}, RTT 0 (py-spy --gil, {spy['rate']} Hz, every thread)",
        "",
        f"{sec(spy['total']):.2f} s of samples holding the GIL (Python-level CPU; the rest of the "
        "process's CPU is C code without the GIL and "
        "the kernel). Each stack is counted in the first "
        "area that matches.",
        "",
        "| area | s | share |",
        "|---|---|---|",
    ]
    for area, count in sorted(spy["areas"].items(), key=lambda kv: -kv[1]):
        L.append(f"| {area} | {sec(count):.2f} | {count / spy['total']:.0%} |")
    return L + [
        "",
        "Top functions (self): "
        + "; ".join(
            f"`{leaf.strip() or '(native)'}` {sec(count):.2f} s"
            for leaf, count in sorted(spy["leaves"].items(), key=lambda kv: -kv[1])[:8]
        )
        + ".",
        "",
    ]


def _node_side(project: Path, node, delayed, cgroups, facts: dict) -> list[str]:
    """4. One lab node's cost of a connection, an exec and each agent call
    (bench/profile_node.py)."""
    known_hosts = str(project / ".lab" / "bench_known_hosts")
    with delayed(0.0, 1) if delayed else _null():
        costs = node_costs(node, str(project / ".lab" / "id_ed25519"), known_hosts, cgroups=cgroups)
    L = [
        "### 4. Node side (one lab node, over one paramiko connection; node CPU = "
        + (
            f"the nodes' cgroup, {cgroups.method}: every sshd "
            "session process however it ended; the other "
            "listeners are idle)"
            if cgroups
            else "the sshd listener's process tree from /proc, a lower bound: "
            "it misses session processes reaped late or reparented"
        )
        + ")",
        "",
        "| step | wall s | node CPU s | agent's own time s |",
        "|---|---|---|---|",
        (
            f"| SSH connection (handshake + auth, no exec) | {costs['connect'][0]:.3f} | "
            f"{costs['connect'][1]:.3f} | |"
        ),
    ]
    for label, value in costs.items():
        if isinstance(value, tuple) and len(value) == 3 and not label.startswith("agent_imports_"):
            w, c, inside = value
            L.append(
                f"| {label} | {w:.3f} | {c:.3f} | {'' if inside is None else f'{inside:.3f}'} |"
            )
    total_i, per_i, mods = costs["agent_imports_verify"]
    total_p = costs["agent_imports_ping"][0]
    L += [
        "",
        f"- Node python start-up alone: {costs['python_startup']:.3f} s.",
        "- Every exec runs the login user's shell (sshd "
        "starts `bash -c CMD`). Sourcing root's ~/.bashrc "
        f"costs {costs['shell_rc']:.3f} s locally against "
        f"{costs['shell_bare']:.3f} s for a bare `bash -c true`; "
        + (
            "an exec of `true` over SSH costs about as much node CPU, so the lab's sessions pay "
            "it, once per exec (fleetops 1 per host, the peers 3)."
            if costs[EXEC_TRUE][1] >= costs["shell_rc"] / 2
            else f"an exec of `true` over SSH costs {costs[EXEC_TRUE][1]:.3f} s of node "
            "CPU, so the lab's sessions do not source it (a "
            "node whose sshd-started bash does pays it once per "
            "exec: fleetops 1 per host, the peers 3)."
        ),
        "- The agent's imports on the node, run over SSH as fleetops runs it (`-X importtime`): "
        f"op verify {total_i * 1e3:.0f} ms in all (remote_scripts modules: "
        + (
            ", ".join(
                f"{k} {v * 1e3:.1f} ms" for k, v in sorted(mods.items(), key=lambda kv: -kv[1])[:6]
            )
            or "none"
        )
        + f"), op ping {total_p * 1e3:.0f} ms.",
        "",
    ]
    facts.update(
        {
            "connect_node_cpu": costs["connect"][1],
            "exec_true_node_cpu": costs[EXEC_TRUE][1],
            "shell_rc": costs["shell_rc"],
            "python_startup": costs["python_startup"],
            "agent_patch_node_cpu": costs["agent patch (steady state)"][1],
            "agent_verify_node_cpu": costs["agent verify grep,compile"][1],
            "agent_patch_own": costs["agent patch (steady state)"][2],
            "agent_verify_own": costs["agent verify grep,compile"][2],
            "agent_imports": total_i,
        }
    )
    return L


FACTS: dict = {}  # numbers the bench's analysis quotes


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main() -> int:
    if len(sys.argv) >= 4 and sys.argv[1] == "--timeline" and sys.argv[3] == "--":
        code = wrap_timeline(sys.argv[2], sys.argv[4:])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # as fleetops.cli ends `fab`: no interpreter teardown after the run
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
