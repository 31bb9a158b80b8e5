#!/usr/bin/env python3
"""fleetops against Ansible, pyinfra and a hand-written Fabric ThreadingGroup script, same lab, one
run.

    .venv/bin/python bench/run.py [--sizes 1,8,32] [--rtts 0,50] [--reps 3] [--out bench/RESULTS.md]
    .venv/bin/python bench/run.py --targets      # only the rows the targets are judged on
    .venv/bin/python bench/run.py --scale [--sizes 256,1000 ...]   # bench/scale.py's section

Run by hand, not by CI (see bench/README.md). Stdlib + fleetops' lab on the client side; Ansible and
pyinfra live in their own venv under bench/.work/peers (made here with pip on first use, never in
the system python).

What it does, in order:
  1. a throwaway project under bench/.work/project (symlinks to fabfile.py, fabric.yaml, playbooks/;
     its own hosts/ and .lab/), max(sizes) lab nodes (real sshd on 127.0.0.1), every node patched
     once (steady state), the two diff files copied to <state_dir>/bench-diffs on every node (so no
     tool pays an upload);
  2. calibration of the delay proxy (bench/delay_proxy.py): an echo server behind it, then `ssh
     true`;
  3. for each RTT, for each N: one warm-up and one probe run per tool (the probe samples the client
     process tree's memory; fleetops' probe runs traced with --json), then --reps repetitions, tools
     alternating (fleetops patch verify, fleetops patch --check, Ansible, pyinfra, Fabric, the floor
     row, then again);
  4. CLI overhead (`fab -H bench01 ping` and `fab --list` at 0 ms), and a profile of fleetops
     (bench/profile_fleetops.py: start-up imports, per-phase timeline, node-side agent cost);
  5. the table, the targets and the machine, printed and written to --out; everything stopped
     (try/finally).

Per run: wall time (start to exit), peak RSS (os.wait4's ru_maxrss: the largest single process among
the tool and every descendant it reaped; Ansible's ControlPersist masters are adopted by this
process as a child subreaper and added), client CPU, node CPU (sshd sessions, shells, commands) and
proxy CPU, by cgroup where the machine allows it (CpuCgroups: bench-client / bench-nodes /
bench-proxy; else per process, an undercount), machine-wide busy CPU (/proc/stat) as a cross-check,
and SSH connections / execs / sftp sessions / bytes per host counted from the lines each run added
to the nodes' sshd logs (LogLevel VERBOSE).

The modules beside this one, each one job: benchpaths (paths, tools, the snapshot), cpuacct (process
and cgroup CPU), labhosts (the lab, the peers' venv, inventories), calibrate (the delay proxy),
measure (one measured run), tables (RESULTS.md), verdicts (targets and "where the time goes"),
machineinfo.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

# the bench's own modules, also under runpy
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchpaths import REPO, need_project_venv, take_snapshot

if __name__ == "__main__":
    need_project_venv()

take_snapshot() if __name__ == "__main__" else sys.path.insert(0, str(REPO))

import cpuacct  # noqa: E402
from benchpaths import BENCH, FAB, TARGET_TOOLS, TOOLS, WORK, say  # noqa: E402
from calibrate import calibrate, start_proxy, stop_proc  # noqa: E402
from cpuacct import CpuCgroups, set_child_subreaper  # noqa: E402
from labhosts import (  # noqa: E402
    Env,
    ensure_peers,
    make_project,
    write_inventories,
    write_known_hosts,
    write_spec,
)
from machineinfo import machine_info  # noqa: E402
from measure import Run, Runner, med, per_host  # noqa: E402
from tables import render  # noqa: E402

from fleetops.lab import Lab  # noqa: E402

TARGETS_PRESET = {
    "sizes": "1,32",
    "rtts": "50",
    "big": 0,
    "tools": ",".join(TARGET_TOOLS),
    "no_cli": True,
    "no_profile": True,
}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="1,8,32")
    ap.add_argument(
        "--big", type=int, default=128, help="one more fleet size, run at --big-rtt only (0: none)"
    )
    ap.add_argument("--big-rtt", type=float, default=50)
    ap.add_argument("--rtts", default="0,50")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--tools",
        default=",".join(key for key, _ in TOOLS),
        help="the rows to run, in their usual order (default: all of them)",
    )
    ap.add_argument(
        "--out",
        default=None,
        help=f"where the table goes (default {BENCH / 'RESULTS.md'}; with --targets "
        f"{WORK / 'targets.md'})",
    )
    ap.add_argument("--timeout", type=float, default=240, help="seconds before a run is killed")
    ap.add_argument(
        "--no-profile", action="store_true", help="skip the fleetops profile at the end"
    )
    ap.add_argument(
        "--no-cli",
        action="store_true",
        help="skip the CLI overhead rows (ping, --list, deep verify)",
    )
    ap.add_argument(
        "--targets",
        action="store_true",
        help="only the rows the targets need: --sizes 1,32 --rtts 50 --big 0 --tools "
        f"{','.join(TARGET_TOOLS)} --no-cli --no-profile",
    )
    ap.add_argument(
        "--quiet-cores",
        type=float,
        default=0.3,
        help="before each measured run, wait until the machine's load is at most this (cores)",
    )
    ap.add_argument(
        "--noisy-cores",
        type=float,
        default=0.5,
        help="run again (up to 3 times) if others used more than this many cores during a run",
    )
    ap.add_argument(
        "--max-wait", type=float, default=900, help="longest wait for a quiet machine (s)"
    )
    args = ap.parse_args()
    if args.targets:
        vars(args).update(TARGETS_PRESET)
    if args.reps < 1:
        ap.error(
            "--reps must be at least 1 (3 for the published "
            "figures; fewer is a reduced run, said so)"
        )
    unknown = set(args.tools.split(",")) - {key for key, _ in TOOLS}
    if unknown:
        ap.error(
            f"--tools: no row {', '.join(sorted(unknown))} (rows: "
            f"{', '.join(key for key, _ in TOOLS)})"
        )
    args.out = args.out or str(WORK / "targets.md" if args.targets else BENCH / "RESULTS.md")
    return args


# SIGTERM, and SIGINT even when started in the background (where it is ignored)
def stop(signum, frame):
    # Once: a second signal (`timeout` forwards one, an impatient Ctrl-C) must not cut the cleanup
    # short and leave the lab's sshd listeners behind.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def start_lab(env: Env, most: int) -> None:
    """`most` lab nodes, in the nodes' cgroup when measuring by cgroup, each with the diffs the
    peers apply."""
    say(f"bench: starting {most} lab nodes in {env.project}")
    env.nodes = env.lab.up(most, progress=lambda m: say(f"  {m}"))
    cpuacct.CGROUPS = CpuCgroups.make()
    if cpuacct.CGROUPS:
        for node in env.nodes:  # listeners only: the sessions each one forks from now on inherit it
            cpuacct.CGROUPS.add("nodes", node.pid())
        say(
            f"bench: CPU measured by {cpuacct.CGROUPS.method} under {cpuacct.CGROUPS.root} "
            "(bench-nodes/-client/-proxy)"
        )
    else:
        say(
            "bench: no usable cgroup (needs root and a cgroup v1 cpuacct or v2 mount): CPU "
            "measured per process, which misses the nodes' sessions that are reaped late or "
            "reparented (an undercount)"
        )
    # fleetops sees only hosts/bench.yaml
    (env.project / "hosts" / "lab.yaml").unlink(missing_ok=True)


def steady_state(env: Env, runner: Runner, spec: dict) -> str:
    """Every node patched once, and the peers' commands checked to do the same work: returns what
    they did."""
    for node in env.nodes:
        d = node.state_dir / "bench-diffs"
        d.mkdir(parents=True, exist_ok=True)
        for src in spec["diff_sources"]:
            shutil.copy(src, d / Path(src).name)
    write_known_hosts(env, 0)
    hosts_all = env.hosts(len(env.nodes), 0)
    write_inventories(env, hosts_all, WORK / "scenario")
    say("bench: patching every node once (steady state)")
    first = subprocess.run(
        [FAB, "-H", "@bench", "patch"],
        cwd=env.project,
        env=runner.base_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if first.returncode != 0:
        raise SystemExit(f"initial patch failed:\n{first.stdout[-3000:]}\n{first.stderr[-3000:]}")
    # The peers' commands really do the work: the Fabric peer's output on bench01, checked.
    shown = subprocess.run(
        [
            sys.executable,
            str(BENCH / "peer_fabric.py"),
            str(WORK / "scenario" / "fabric_hosts.json"),
            str(env.spec_file),
            "--show",
        ],
        cwd=WORK,
        env=runner.base_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    first_host = [
        part
        for part in shown.stdout.split("--- ")
        if part.startswith(f"127.0.0.1:{hosts_all[0].port} ")
    ]
    expect = {"already applied": len(spec["diffs"]), ": ok": len(spec["greps"]), "compiled": 1}
    got = {k: sum(part.count(k) for part in first_host) for k in expect}
    peer_check = f"peer commands on one node: {got} (expected {expect})"
    say(f"bench: {peer_check}")
    if shown.returncode != 0 or got != expect:
        raise SystemExit(
            f"the peer commands do not do the expected work:\n{shown.stdout}\n{shown.stderr}"
        )
    return peer_check


def scenario(
    runner: Runner, env: Env, tools: list[str], n: int, rtt: float, reps: int
) -> list[Run]:
    """N hosts at one RTT: a warm-up and a probe run per tool, then `reps` repetitions, tools
    alternating."""
    runs: list[Run] = []
    hosts = env.hosts(n, rtt)
    work = WORK / "scenario"
    write_inventories(env, hosts, work)
    say(f"bench: N={n} RTT={rtt:g} ms")
    for kind in ("warmup", "probe"):
        for tool in tools:
            r = (
                runner.run(tool, hosts, rtt, work, kind)
                if kind == "warmup"
                else runner.measured(tool, hosts, rtt, work, kind)[-1]
            )
            runs.append(r)
            say(
                f"  {kind:6} {tool:8} {r.wall:7.3f} s rc={r.rc} conns/host={per_host([r.conns])} "
                f"execs/host={per_host([r.execs])} rss={r.maxrss_kb / 1024:.0f} MB"
            )
    for rep in range(reps):
        line = []
        for tool in tools:
            attempts = runner.measured(tool, hosts, rtt, work, "rep")
            runs.extend(attempts)
            r = attempts[-1]
            line.append(
                f"{tool} {r.wall:.3f}"
                + ("" if r.ok else f" (rc {r.rc})")
                + (f" ({len(attempts) - 1} noisy)" if len(attempts) > 1 else "")
            )
        say(f"  rep {rep + 1}: " + ", ".join(line))
    return runs


def every_rtt(args, env: Env, runner: Runner, runs: list[Run], calib: list[dict]) -> None:
    """Each RTT (calibrated, behind a delay proxy when > 0), each fleet size at it."""
    sizes = [int(s) for s in args.sizes.split(",")]
    rtts = [float(r) for r in args.rtts.split(",")]
    tools = [key for key, _ in TOOLS if key in args.tools.split(",")]
    for rtt in sorted(set(rtts) | ({args.big_rtt} if args.big else set())):
        if rtt:
            c = calibrate(rtt, env)
            calib.append(c)
            say(
                f"bench: calibration {rtt:g} ms: connect {c['connect_ms']:.1f} ms, connect+first "
                f"byte {c['connect_first_byte_ms']:.1f} ms, echo turn {c['echo_turn_ms']:.1f} "
                f"ms; ssh true {c['ssh_true_direct_s']:.3f} s direct, "
                f"{c['ssh_true_proxied_s']:.3f} s proxied "
                f"({c['ssh_true_extra_rtts']:.1f} extra RTTs)"
            )
            env.proxy, env.proxy_ports = start_proxy(rtt, [n.port for n in env.nodes])
        write_known_hosts(env, rtt)
        for n in [m for m in sizes if rtt in rtts] + (
            [args.big] if args.big and rtt == args.big_rtt else []
        ):
            runs += scenario(runner, env, tools, n, rtt, args.reps)
        if env.proxy:
            stop_proc(env.proxy)
            env.proxy, env.proxy_ports = None, {}


def cli_overhead(runner: Runner, env: Env, reps: int) -> dict:
    """`fab -H bench01 ping`, `fab --list` and the deep `verify`, on one host at 0 ms."""
    write_known_hosts(env, 0)
    hosts1 = env.hosts(1, 0)
    write_inventories(env, hosts1, WORK / "scenario")
    say("bench: CLI overhead")
    cli: dict = {}
    for key in ("fo_ping1", "fo_list", "fo_deep"):
        runner.run(key, hosts1, 0, WORK / "scenario", "warmup")
        times = reps if key == "fo_deep" else max(reps, 5)
        cli[key] = [
            runner.measured(key, hosts1, 0, WORK / "scenario", "rep")[-1] for _ in range(times)
        ]
        say(f"  {key}: median {med([r.wall for r in cli[key]]):.3f} s")
    return cli


def run_profile(args, env: Env, runner: Runner, peers: Path) -> str:
    """bench/profile_fleetops.py's section; a failed profile is said in it, the measurements are
    still written."""
    say("bench: profiling fleetops")
    import profile_fleetops

    @contextlib.contextmanager
    def delayed(rtt: float, size: int):
        """hosts/bench.yaml (and known_hosts) for the first `size` nodes, through a proxy if rtt."""
        if rtt:
            env.proxy, env.proxy_ports = start_proxy(rtt, [node.port for node in env.nodes[:size]])
        try:
            write_known_hosts(env, rtt, size)
            write_inventories(env, env.hosts(size, rtt), WORK / "scenario")
            yield
        finally:
            stop_proc(env.proxy)
            env.proxy, env.proxy_ports = None, {}
            write_known_hosts(env, 0)

    pyspy = peers / "bin" / "py-spy"
    try:
        return profile_fleetops.profile(
            env.project,
            env.nodes[0],
            max(int(s) for s in args.sizes.split(",")),
            FAB,
            runner.base_env,
            WORK,
            delayed,
            max(float(r) for r in args.rtts.split(",")),
            str(pyspy) if pyspy.exists() else None,
            cgroups=cpuacct.CGROUPS,
        )
    except Exception as exc:  # the measurements above must still be written
        import traceback

        traceback.print_exc()
        return f"## Where fleetops' time goes\n\nThe profile failed: {type(exc).__name__}: {exc}\n"


def main() -> int:
    # the scale section (bench/scale.py): its own lab, its own options
    if sys.argv[1:2] == ["--scale"]:
        import scale

        scale.main(sys.argv[2:])
        return 0
    args = parse_args()
    t_start = time.perf_counter()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    WORK.mkdir(parents=True, exist_ok=True)
    peers = ensure_peers(need_peers=bool({"ansible", "pyinfra"} & set(args.tools.split(","))))
    project = make_project(WORK / "project")
    logs = WORK / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    lab = Lab(project)
    env = Env(
        project,
        lab,
        str(lab.client_key),
        project / ".lab" / "bench_known_hosts",
        WORK / "spec.json",
    )
    runs: list[Run] = []
    calib: list[dict] = []
    cli: dict = {}
    profile_md = ""
    peer_check = ""
    try:
        start_lab(env, max([int(s) for s in args.sizes.split(",")] + [args.big]))
        runner = Runner(
            env, peers, logs, args.timeout, args.quiet_cores, args.noisy_cores, args.max_wait
        )
        peer_check = steady_state(env, runner, write_spec(env.spec_file))
        set_child_subreaper()
        every_rtt(args, env, runner, runs, calib)
        if not args.no_cli:
            cli = cli_overhead(runner, env, args.reps)
        if not args.no_profile:
            profile_md = run_profile(args, env, runner, peers)
    finally:
        stop_proc(env.proxy)
        stopped = lab.down()
        say(f"bench: lab stopped ({len(stopped)} sshd)")
        if cpuacct.CGROUPS:
            cpuacct.CGROUPS.remove()
    # The numbers first: a table that fails to draw must not take them with it.
    (WORK / "runs.json").write_text(json.dumps([r.__dict__ for r in runs], indent=0, default=str))
    info = machine_info(peers)
    info["peer_check"] = peer_check
    text = render(runs, calib, cli, info, args, profile_md, time.perf_counter() - t_start)
    Path(args.out).write_text(text)
    print(text)
    say(f"bench: wrote {args.out} ({(time.perf_counter() - t_start) / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
