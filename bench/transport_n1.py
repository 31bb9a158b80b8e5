"""The two transports side by side at N = 1 through the delay proxy: `fleet -H lab01 patch verify
--kinds grep,compile`, cold (no master connection) and warm (the master of the run before still up):
wall time, client CPU (the fleet process and its children: ssh included) and the run's round trips
on the wire (request/answer turns and new TCP connections, counted by the proxy: what a quiet
machine's wall time is made of at this RTT, whatever the load here).

    .venv/bin/python bench/transport_n1.py --rtt-ms 50 --reps 5

A one-node lab of its own in bench/.work/transport/ (stopped at the end), loopback only."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleetops.lab.lab import Lab  # noqa: E402


def project(root: Path) -> Path:
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for name in ("fabfile.py", "fabric.yaml", "playbooks"):
        (root / name).symlink_to(REPO / name)
    (root / "hosts").mkdir()
    return root


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# the installed `fleet` script's body: its argv[0] is the program's name
FLEET = "import sys\nsys.argv[0] = 'fleet'\nfrom fleetops.entry import main\nmain()\n"


class Wire:
    """The proxy's counters (delay_proxy.py prints them on SIGUSR1)."""

    def __init__(self, proxy: subprocess.Popen) -> None:
        self.proxy = proxy

    def read(self) -> tuple[int, int]:
        assert self.proxy.stdout is not None
        self.proxy.send_signal(signal.SIGUSR1)
        seen = json.loads(self.proxy.stdout.readline())
        return int(seen["connections"]), int(seen["turns"])


def timed(
    root: Path, env: dict[str, str], wire: Wire, *args: str
) -> tuple[float, float, int, int, int]:
    """(wall s, client CPU s, exit status, new TCP connections, request/answer turns) of one
    `fleet` run."""
    conns, turns = wire.read()
    cpu, wall = children_cpu(), time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", FLEET, *args],
        cwd=root,
        env=env,
        capture_output=True,
        timeout=300,
        check=False,
    )
    wall, cpu = time.perf_counter() - wall, children_cpu() - cpu
    conns_after, turns_after = wire.read()
    return wall, cpu, done.returncode, conns_after - conns, turns_after - turns


def close_masters(folder: str) -> None:
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if not name.endswith(".json"):
            subprocess.run(
                ["ssh", "-o", f"ControlPath={path}", "-O", "exit", "x"],
                capture_output=True,
                check=False,
            )
    time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rtt-ms", type=float, default=50)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--then",
        default="",
        help="a shell command run in the project with the lab and proxy up "
        "(instead of the measurement)",
    )
    ap.add_argument("--wire-log", default="", help="the proxy's --log (one line per chunk)")
    args = ap.parse_args()
    root = project(REPO / "bench" / ".work" / "transport")
    lab = Lab(root)
    proxy = None
    folder = tempfile.mkdtemp(prefix="fo-b-", dir="/tmp")
    try:
        lab.up(1)
        node = lab.node("lab01")
        proxy = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "bench" / "delay_proxy.py"),
                "--rtt-ms",
                str(args.rtt_ms),
                *(["--log", args.wire_log] if args.wire_log else []),
                str(node.port),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proxy.stdout is not None
        port = json.loads(proxy.stdout.readline())["listen"][str(node.port)]
        text = lab.hosts_file.read_text().replace(f"port: {node.port}", f"port: {port}")
        lab.hosts_file.write_text(text)
        known = Path(lab.known_hosts)  # the node's key, also under the proxy's port
        lines = known.read_text().splitlines()
        known.write_text(
            "\n".join(
                lines
                + [
                    line.replace(f"]:{node.port} ", f"]:{port} ")
                    for line in lines
                    if f"]:{node.port} " in line
                ]
            )
            + "\n"
        )
        env = {**os.environ, "PYTHONPATH": str(REPO), "FLEETOPS_CONTROL_DIR": folder}
        # byte-compiled, as pip leaves an installed fleet: this machine sets
        # PYTHONDONTWRITEBYTECODE=1, and then every run compiles ~70 modules again (~0.1 s of CPU)
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(REPO / "fleetops")],
            check=True,
            capture_output=True,
        )
        wire = Wire(proxy)
        base = ("-H", "lab01", "patch", "verify", "--kinds", "grep,compile")
        subprocess.run(
            [sys.executable, "-c", FLEET, "-H", "lab01", "patch"],
            cwd=root,
            env=env,
            capture_output=True,
            check=True,
        )
        if args.then:
            subprocess.run(args.then, shell=True, cwd=root, env=env, check=False)
            return
        samples: dict[tuple[str, str], list[tuple[float, float, int, int]]] = {}
        for transport in ("paramiko", "openssh"):
            # warm-up: caches, the agent installed
            timed(root, {**env, "FLEETOPS_TRANSPORT": transport}, wire, *base)
        # the transports interleaved: a busy moment of the machine hits both
        for _ in range(args.reps):
            for transport in ("paramiko", "openssh"):
                run_env = {**env, "FLEETOPS_TRANSPORT": transport}
                for mode in ("cold", "warm"):
                    if mode == "cold":
                        close_masters(folder)
                    else:  # the master is up (openssh)
                        timed(root, run_env, wire, "-H", "lab01", "ping")
                    wall, cpu, rc, conns, turns = timed(root, run_env, wire, *base)
                    assert rc == 0, (transport, mode, rc)
                    samples.setdefault((transport, mode), []).append((wall, cpu, conns, turns))
        print(
            f"N = 1, RTT {args.rtt_ms:g} ms, {args.reps} runs each: fleet -H lab01 patch verify "
            f"--kinds grep,compile; load average before {os.getloadavg()[0]:.1f}"
        )
        print(
            "| transport | start | wall median (min-max) s | client CPU median s "
            "| TCP connections | round trips (turns) median (min-max) |"
        )
        print("|---|---|---|---|---|---|")
        for (transport, mode), got in samples.items():
            walls, cpus = [g[0] for g in got], [g[1] for g in got]
            conns, turns = [g[2] for g in got], [g[3] for g in got]
            print(
                f"| {transport} | {mode} | {statistics.median(walls):.3f} "
                f"({min(walls):.3f}-{max(walls):.3f}) | {statistics.median(cpus):.3f} "
                f"| {statistics.median(conns):g} "
                f"| {statistics.median(turns):g} ({min(turns)}-{max(turns)}) |"
            )
    finally:
        close_masters(folder)
        shutil.rmtree(folder, ignore_errors=True)
        if proxy is not None:
            proxy.terminate()
            proxy.wait()
        lab.down()


if __name__ == "__main__":
    main()
