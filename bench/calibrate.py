"""The delay proxy (bench/delay_proxy.py) as the bench drives it: started in front of the nodes'
sshd, stopped, and calibrated (an echo server behind it, then `ssh true` direct and through it).
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import threading
import time

from benchpaths import BENCH, WORK
from cpuacct import spawn
from labhosts import Env


def start_proxy(rtt_ms: float, ports: list[int]) -> tuple[subprocess.Popen, dict]:
    proc = spawn(
        [sys.executable, str(BENCH / "delay_proxy.py"), "--rtt-ms", str(rtt_ms), *map(str, ports)],
        "proxy",
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if not line:
        raise SystemExit("delay proxy did not start")
    mapping = {int(k): v for k, v in json.loads(line)["listen"].items()}
    return proc, mapping


def stop_proc(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def calibrate(rtt_ms: float, env: Env, reps: int = 5) -> dict:
    """An echo server (speaks first: one byte) behind a proxy of this RTT: connect, first byte, echo
    turns. Then `ssh true` to bench01 direct and through the proxy."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            with c:
                c.sendall(b"!")
                while True:
                    d = c.recv(1024)
                    if not d:
                        break
                    c.sendall(d)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    proxy, mapping = start_proxy(rtt_ms, [srv.getsockname()[1]])
    port = mapping[srv.getsockname()[1]]
    connects, firsts, turns = [], [], []
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            s = socket.create_connection(("127.0.0.1", port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t1 = time.perf_counter()
            s.recv(1)
            t2 = time.perf_counter()
            for _ in range(3):
                a = time.perf_counter()
                s.sendall(b"x")
                s.recv(1)
                turns.append(time.perf_counter() - a)
            s.close()
            connects.append(t1 - t0)
            firsts.append(t2 - t0)
    finally:
        stop_proc(proxy)
        stop.set()
        srv.close()
    out = {
        "rtt_ms": rtt_ms,
        "connect_ms": statistics.median(connects) * 1e3,
        "connect_first_byte_ms": statistics.median(firsts) * 1e3,
        "echo_turn_ms": statistics.median(turns) * 1e3,
    }
    # ssh true, direct vs through the proxy (the proxy in front of bench01's sshd)
    node = env.nodes[0]
    proxy, mapping = start_proxy(rtt_ms, [node.port])
    kh = WORK / "calib_known_hosts"
    keytype, key = node.host_key.with_suffix(".pub").read_text().split()[:2]
    kh.write_text(
        f"[127.0.0.1]:{node.port} {keytype} {key}\n"
        f"[127.0.0.1]:{mapping[node.port]} {keytype} {key}\n"
    )

    def ssh_true(p: int) -> float:
        t0 = time.perf_counter()
        subprocess.run(
            [
                "ssh",
                "-i",
                env.client_key,
                "-o",
                f"UserKnownHostsFile={kh}",
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                "BatchMode=yes",
                "-p",
                str(p),
                "root@127.0.0.1",
                "true",
            ],
            check=True,
            capture_output=True,
        )
        return time.perf_counter() - t0

    try:
        direct = statistics.median(ssh_true(node.port) for _ in range(reps))
        delayed = statistics.median(ssh_true(mapping[node.port]) for _ in range(reps))
    finally:
        stop_proc(proxy)
    out.update(
        {
            "ssh_true_direct_s": direct,
            "ssh_true_proxied_s": delayed,
            "ssh_true_extra_rtts": (delayed - direct) / (rtt_ms / 1e3),
        }
    )
    return out
