"""The two transports side by side at N = 1 through the delay proxy: `patch verify --kinds
grep,compile`, cold (no master connection) and warm (the master of the run before still up), wall
time and client CPU (the fab process and its children: ssh included).

    .venv/bin/python bench/transport_n1.py --rtt-ms 50 --reps 5

A one-node lab of its own in bench/.work/transport/ (stopped at the end), loopback only."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
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


def timed(root: Path, env: dict[str, str], *args: str) -> tuple[float, float, int]:
    cpu, wall = children_cpu(), time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "fabric", *args],
        cwd=root,
        env=env,
        capture_output=True,
        timeout=300,
        check=False,
    )
    return time.perf_counter() - wall, children_cpu() - cpu, done.returncode


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
        base = ("-H", "lab01", "patch", "verify", "--kinds", "grep,compile")
        subprocess.run(
            [sys.executable, "-m", "fabric", "-H", "lab01", "patch"],
            cwd=root,
            env=env,
            capture_output=True,
            check=True,
        )
        if args.then:
            subprocess.run(args.then, shell=True, cwd=root, env=env, check=False)
            return
        rows = []
        samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for transport in ("paramiko", "openssh"):
            # warm-up: caches, the agent installed
            timed(root, {**env, "FLEETOPS_TRANSPORT": transport}, *base)
        # the transports interleaved: a busy moment of the machine hits both
        for _ in range(args.reps):
            for transport in ("paramiko", "openssh"):
                run_env = {**env, "FLEETOPS_TRANSPORT": transport}
                for mode in ("cold", "warm"):
                    if mode == "cold":
                        close_masters(folder)
                    else:
                        timed(root, run_env, "-H", "lab01", "ping")  # the master is up (openssh)
                    wall, cpu, rc = timed(root, run_env, *base)
                    assert rc == 0, (transport, mode, rc)
                    samples.setdefault((transport, mode), []).append((wall, cpu))
        for (transport, mode), got in samples.items():
            walls, cpus = [w for w, _ in got], [c for _, c in got]
            rows.append(
                (
                    transport,
                    mode,
                    statistics.median(walls),
                    min(walls),
                    max(walls),
                    statistics.median(cpus),
                )
            )
        print(
            f"N = 1, RTT {args.rtt_ms:g} ms, {args.reps} "
            "runs each: patch verify --kinds grep,compile"
        )
        print("| transport | start | wall median (min-max) s | client CPU median s |")
        print("|---|---|---|---|")
        for transport, mode, med, lo, hi, cpu in rows:
            print(f"| {transport} | {mode} | {med:.3f} ({lo:.3f}-{hi:.3f}) | {cpu:.3f} |")
    finally:
        close_masters(folder)
        shutil.rmtree(folder, ignore_errors=True)
        if proxy is not None:
            proxy.terminate()
            proxy.wait()
        lab.down()


if __name__ == "__main__":
    main()
