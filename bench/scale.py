#!/usr/bin/env python3
"""The scale section: fleetops driving 256 and 1,000 hosts from one process, pyinfra and the Fabric
script beside it at 256, every host behind the delay proxy.

    .venv/bin/python bench/scale.py [--sizes 256,1000] [--rtt-ms 50] [--peers-at 256] [--ulimit 256]
    .venv/bin/python bench/run.py --scale ...          # the same, from the bench's entry point
    .venv/bin/python bench/scale.py --transport openssh --sizes 1000 --peers-at 0 --tools fleetops

With --transport openssh, fleetops reaches every host through the system `ssh` and one master per
host (FLEETOPS_MAX_MASTERS = the largest size, a private control directory): a first `ping` starts
the masters (the cold row), the commands then run warm, and after them the masters' RSS and PSS
(smaps_rollup) and descriptors are summed from /proc; `fleet disconnect` closes them all.

The hosts are the large lab's (fleetops/lab/scale.py: one venv and state dir per host on its own
loopback address, sshd processes shared), patched once directly (steady state), then reached only
through bench/delay_proxy.py (one listener per host). Each fleetops row runs `fleet` with the
open-file limit lowered to --ulimit (soft and hard, as `ulimit -n 256` does: a Mac's default) and
COLUMNS=80; the peers run with the machine's limit (pyinfra's --parallel N needs a socket per host
at once), stated in the table.

Per run: wall, client CPU (the tool's process and everything it reaped: os.wait4), peak RSS
(ru_maxrss), and the peak open files and threads of the tool's process tree (sampled from /proc
every 20 ms), the machine's CPU in the same window (every process: the lab's sshd sessions and
agents and the delay proxy share the client's cores, so a run whose machine CPU is near wall x cores
was bound by CPU, not round trips), hosts that answered (fleetops' closing summary line; a peer's
exit status), and for fleetops the rows its printed report takes on an 80-column screen. One run
per row: the machine is shared, the figures are noisy (said so).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchpaths import FAB, SNAPSHOT, WORK, need_project_venv, say, take_snapshot

COMMANDS = [
    ("ping", ["ping"]),
    ("run true", ["run", "true"]),
    ("patch --check", ["patch", "--check"]),
    ("verify --kinds grep", ["verify", "--kinds", "grep"]),
    # the chain bench/run.py measures, the same work as the peers' three commands
    ("patch verify --kinds grep,compile", ["patch", "verify", "--kinds", "grep,compile"]),
]
SUMMARY = re.compile(r"^(\d+) hosts: (\d+) ok, (\d+) changed, (\d+) failed, (\d+) unreachable")


@dataclass
class Row:
    tool: str
    what: str
    n: int
    rc: int
    wall: float
    cpu: float
    rss_mb: float
    fds: int
    threads: int
    answered: int
    screen_rows: int = 0
    limit: str = ""
    machine_cpu: float = 0.0  # every process's CPU on the machine during the run (/proc/stat)

    @property
    def ms_per_host(self) -> float:
        return self.cpu * 1000 / self.n


def machine_busy() -> float:
    """Seconds of CPU every process on this machine has used since boot (/proc/stat's first line,
    idle and iowait left out): the lab's nodes and the delay proxy share the client's cores, so a
    run's wall is read beside what all of them spent."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:8]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def sample(pid: int) -> tuple[int, int]:
    """(open files, threads) of the process tree now."""
    fds = threads = 0
    for p in tree(pid):
        try:
            fds += len(os.listdir(f"/proc/{p}/fd"))
            with open(f"/proc/{p}/status") as f:
                threads += next(int(x.split()[1]) for x in f if x.startswith("Threads:"))
        except (OSError, StopIteration, ValueError):
            continue
    return fds, threads


def measure(
    tool: str,
    what: str,
    n: int,
    argv: list[str],
    cwd: Path,
    env: dict,
    log: Path,
    nofile: int | None,
    timeout: float,
) -> Row:
    def limit() -> None:
        if nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    peak = [0, 0]
    busy0 = machine_busy()
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=limit
        )
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                fds, threads = sample(proc.pid)
                peak[0], peak[1] = max(peak[0], fds), max(peak[1], threads)
                done.wait(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.01)
        done.set()
        watcher.join()
    wall = time.perf_counter() - t0
    busy = machine_busy() - busy0
    text = log.read_text(errors="replace")
    m = next((SUMMARY.match(x) for x in text.splitlines() if SUMMARY.match(x)), None)
    rc = os.waitstatus_to_exitcode(status)
    answered = int(m.group(2)) + int(m.group(3)) + int(m.group(4)) if m else (n if rc == 0 else 0)
    rows = sum(max(1, -(-len(x) // 80)) for x in text.splitlines()) if tool == "fleetops" else 0
    return Row(
        tool,
        what,
        n,
        rc,
        wall,
        usage.ru_utime + usage.ru_stime,
        usage.ru_maxrss / 1024,
        peak[0],
        peak[1],
        answered,
        rows,
        str(nofile) if nofile else "machine's",
        busy,
    )


def start_proxy(rtt_ms: float, specs: list[str]) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("delay_proxy.py")),
            "--rtt-ms",
            str(rtt_ms),
            *specs,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        raise SystemExit("bench/scale.py: the delay proxy did not start")
    return proc, json.loads(line)["listen"]


def master_cost(control: str) -> dict:
    """The live masters in the control directory: how many, and their RSS, PSS and descriptors
    summed (fleetops.wire.masters reads /proc)."""
    from fleetops.wire import masters

    pids = list(masters.listening_pids(control))
    rss = sum(masters.proc_kib(p, "Rss", "smaps_rollup") or 0 for p in pids)
    pss = sum(masters.proc_kib(p, "Pss", "smaps_rollup") or 0 for p in pids)
    fds = sum(masters.fd_count(p) or 0 for p in pids)
    return {"count": len(pids), "rss_mb": rss / 1024, "pss_mb": pss / 1024, "fds": fds}


def render(rows: list[Row], rtt_ms: float, setup: dict) -> str:
    out = [
        f"### Scale: {', '.join(str(n) for n in sorted({r.n for r in rows}))} hosts from one "
        f"process (RTT {rtt_ms:g} ms, delay proxy)",
        "",
        f"Large lab up in {setup['up_s']:.1f} s ({setup['hosts']} hosts, {setup['sshds']} sshd "
        "processes); one run per row on a shared 2-core "
        "machine (others' tests ran meanwhile: noisy).",
        "",
        *floor_lines(setup.get("floor")),
        "| tool | command | N | open-file limit | hosts answered | wall s | client CPU s | CPU "
        "ms/host | machine CPU s | peak RSS MB | peak open files | peak threads | report rows "
        "at 80 col |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r.tool} | `{r.what}` | {r.n} | {r.limit} | {r.answered}/{r.n} | {r.wall:.1f} | "
            f"{r.cpu:.2f} | {r.ms_per_host:.1f} | {r.machine_cpu:.2f} | {r.rss_mb:.0f} | {r.fds} | "
            f"{r.threads} | "
            f"{r.screen_rows if r.tool == 'fleetops' else '-'} |"
        )
    for n, cost in sorted(setup.get("masters", {}).items()):
        out += [
            "",
            f"Masters after the N = {n} runs: {cost['count']} live, RSS {cost['rss_mb']:.0f} MB "
            f"(PSS {cost['pss_mb']:.0f} MB), {cost['fds']} descriptors, all theirs (the fleetops "
            "process's own peak RSS is in the table).",
        ]
    return "\n".join(out) + "\n"


def floor_lines(floor: dict | None) -> list[str]:
    if not floor:
        return []
    return [
        "Per-host client CPU floor (bench/scale_floor.py, one host after another, no proxy): "
        f"reading the inventory {floor['inventory_ms_per_host']} ms/host "
        f"({floor['hosts_in_inventory']} hosts); one SSH connection through fleetops' wire "
        f"running `true` {floor['ssh_exec_ms_per_host']} "
        f"ms/host ({floor['hosts_connected']} hosts).",
        "",
    ]


def bench_hosts(lab_hosts: list, mapping: dict) -> list:
    from labhosts import BenchHost

    out = []
    for h in lab_hosts:
        site = next((h.venv / "lib").glob("python3*/site-packages"))
        # Named as the lab names them: a host's paths hold its lab name, and folding masks a host's
        # own name
        out.append(
            BenchHost(
                h.name,
                h.name,
                h.port,
                mapping[f"{h.address}:{h.port}"],
                str(h.python),
                str(site),
                str(h.state_dir),
                f"{h.state_dir}/bench-diffs",
                Path("/dev/null"),
                0,
            )
        )
    return out


def run_scale(
    sizes: list[int],
    rtt_ms: float,
    peers_at: int,
    nofile: int,
    timeout: float,
    out: Path,
    tools: tuple[str, ...] = ("fleetops", "pyinfra", "fabric", "floor"),
    transport: str = "paramiko",
) -> str:
    from labhosts import Env, ensure_peers, make_project, write_inventories, write_spec

    from fleetops.lab.scale import ScaleLab

    ScaleLab(WORK / "scale-project").down()  # a run cut short left its listeners
    project = make_project(WORK / "scale-project")
    lab = ScaleLab(project)
    t0 = time.monotonic()
    lab_hosts = lab.up(max(sizes))
    setup = {"up_s": time.monotonic() - t0, "hosts": len(lab_hosts), "sshds": len(lab.pids())}
    proxy = None
    env = {**os.environ, "PYTHONPATH": str(SNAPSHOT), "COLUMNS": "80", "FLEETOPS_NO_LIVE": "1"}
    # the measured runs' own environment: the set-up (the first patch, the floor) runs on the
    # default transport, so no master of it is in the measured runs' control directory or cap
    measured = dict(env)
    control = None
    if transport == "openssh":  # short: a socket's path has ~100 bytes
        control = tempfile.mkdtemp(prefix="fo-scale-", dir="/tmp")
        measured.update(
            FLEETOPS_TRANSPORT="openssh",
            FLEETOPS_CONTROL_DIR=control,
            FLEETOPS_MAX_MASTERS=str(max(sizes)),
        )
    logs = WORK / "scale-logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        say(f"bench: patching {len(lab_hosts)} hosts once, directly (steady state)")
        subprocess.run(
            [FAB, "-H", "@scale", "patch"],
            cwd=project,
            env=env,
            stdout=subprocess.DEVNULL,
            check=True,
        )
        book = SNAPSHOT / "playbooks" / "speculators-0.3.0-vllm-0.16"
        for h in lab_hosts:  # the peers' diffs, already on the node (no tool pays an upload)
            shutil.copytree(
                book, h.state_dir / "bench-diffs", ignore=shutil.ignore_patterns("*.py")
            )
        say(
            "bench: the per-host floor (inventory, one SSH connection + exec), one host "
            "after another, directly"
        )
        floor = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).with_name("scale_floor.py")),
                str(project),
                str(min(200, len(lab_hosts))),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        setup["floor"] = json.loads(floor.stdout.strip().splitlines()[-1])
        lab.hosts_file.unlink()
        proxy, mapping = start_proxy(rtt_ms, [f"{h.address}:{h.port}" for h in lab_hosts])
        known = project / ".lab-scale" / "known_hosts.proxy"
        key = lab.host_key.with_suffix(".pub").read_text().split()[:2]
        known.write_text(
            "".join(
                f"[127.0.0.1]:{mapping[f'{h.address}:{h.port}']} {key[0]} {key[1]}\n"
                for h in lab_hosts
            )
        )
        spec_file = WORK / "scale-spec.json"
        write_spec(spec_file)
        bench = Env(project, None, str(lab.client_key), known, spec_file)  # type: ignore[arg-type]
        hosts = bench_hosts(lab_hosts, mapping)
        work = WORK / "scale-work"
        write_inventories(bench, hosts, work)
        user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        inv = project / "hosts" / "bench.yaml"
        inv.write_text(inv.read_text().replace("  user: root", f"  user: {user}"))
        rows: list[Row] = []
        for n in sorted(sizes) if "fleetops" in tools else []:
            names = f"{lab.name}[0001-{n:04d}]"
            commands = COMMANDS
            if control is not None:
                commands = [("ping (cold: masters start)", ["ping"]), *COMMANDS]
            for what, words in commands:
                say(f"bench: fleetops {what} at N = {n}")
                rows.append(
                    measure(
                        "fleetops",
                        what,
                        n,
                        [FAB, "-H", names, *words],
                        project,
                        measured,
                        logs / f"fleetops-{what.split()[0]}-{n}.log",
                        nofile,
                        timeout,
                    )
                )
            if control is not None:
                setup.setdefault("masters", {})[n] = master_cost(control)
        if peers_at in sizes:  # last: their inventories name only the first peers_at hosts
            rows += peers(peers_at, hosts, bench, work, env, logs, timeout, tools, ensure_peers)
        text = render(rows, rtt_ms, setup)
        out.write_text(text)
        return text
    finally:
        if control is not None:
            subprocess.run(
                [FAB, "disconnect"],
                cwd=project,
                env=measured,
                stdout=subprocess.DEVNULL,
                check=False,
            )
            shutil.rmtree(control, ignore_errors=True)
        if proxy is not None:
            proxy.terminate()
            proxy.wait(10)
        lab.down()


def peers(
    n: int,
    hosts: list,
    bench: object,
    work: Path,
    env: dict,
    logs: Path,
    timeout: float,
    tools: tuple[str, ...],
    ensure_peers,
) -> list[Row]:
    from labhosts import write_inventories

    write_inventories(bench, hosts[:n], work)  # type: ignore[arg-type]
    rows = []
    here = Path(__file__).resolve().parent
    venv = ensure_peers("pyinfra" in tools)
    spec = str(bench.spec_file)  # type: ignore[attr-defined]
    if "pyinfra" in tools:
        say(f"bench: pyinfra at N = {n}")
        rows.append(
            measure(
                "pyinfra",
                "deploy: 3 server.shell",
                n,
                [
                    str(venv / "bin" / "pyinfra"),
                    "--parallel",
                    str(n),
                    "-y",
                    str(work / "pyinfra_inventory.py"),
                    str(here / "peer_pyinfra_deploy.py"),
                ],
                work,
                {**env, "BENCH_SPEC": spec},
                logs / f"pyinfra-{n}.log",
                None,
                timeout,
            )
        )
    if "fabric" in tools:
        say(f"bench: Fabric script at N = {n}")
        rows.append(
            measure(
                "Fabric script",
                "ThreadingGroup: 3 group.run",
                n,
                [
                    sys.executable,
                    str(Path(__file__).with_name("peer_fabric.py")),
                    str(work / "fabric_hosts.json"),
                    spec,
                ],
                work,
                env,
                logs / f"fabric-{n}.log",
                None,
                timeout,
            )
        )
    if "floor" in tools:  # not a peer: the least a paramiko client pays per host (bench/floor.py)
        say(f"bench: the paramiko floor at N = {n}")
        rows.append(
            measure(
                "floor.py (stock paramiko)",
                "connect + 1 exec, a thread per host",
                n,
                [sys.executable, str(here / "floor.py"), str(work / "fabric_hosts.json")],
                work,
                env,
                logs / f"floor-{n}.log",
                None,
                timeout,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="256,1000")
    ap.add_argument("--rtt-ms", type=float, default=50)
    ap.add_argument(
        "--peers-at", type=int, default=256, help="the fleet size the peers run at (0: none)"
    )
    ap.add_argument(
        "--ulimit", type=int, default=256, help="fleetops' open-file limit (0: the machine's)"
    )
    ap.add_argument("--tools", default="fleetops,pyinfra,fabric,floor")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default=str(WORK / "scale.md"))
    ap.add_argument("--transport", choices=("paramiko", "openssh"), default="paramiko")
    args = ap.parse_args(argv)
    text = run_scale(
        [int(x) for x in args.sizes.split(",")],
        args.rtt_ms,
        args.peers_at,
        args.ulimit,
        args.timeout,
        Path(args.out),
        tuple(args.tools.split(",")),
        args.transport,
    )
    print(text)


if __name__ == "__main__":
    need_project_venv()
    take_snapshot()
    main()
