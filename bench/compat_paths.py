"""What each private-name fast path of fleetops.compat buys, against a running lab (docs/perf.md has
the figures).

    python bench/compat_paths.py PROJECT [--rtt-ms 0 50] [--connections 15]

PROJECT is a lab project (`fab lab.up`). For every RTT (through bench/delay_proxy.py, loopback only)
one interpreter opens lab01's connection and sends one `ping` to a fresh agent, --connections times
in every mode (all fast paths on; FLEETOPS_PUBLIC_ONLY=1; each connection fast path off alone), the
modes in turn so that each sees the same load: wall and client CPU per connection, median. Then,
in-process: known_hosts of a 128- and an 800-host fleet (per connection: the strict client and
paramiko's three lookups), building a Connection on the shared config, parsing `fab -H lab01 patch
verify`, and loading the shipped YAML with libyaml's events and with PyYAML's pure-Python parser.
Prints one JSON document."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODES = {
    "all on": "",
    "public only": "1",
    "pipelined_auth off": "pipelined_auth",
    "session_ahead off": "session_ahead",
}

CONNECT = r"""
import json, os, statistics, sys, time
from dataclasses import replace
from fleetops import compat
from fleetops.plans.inventory import load_inventory
from fleetops.wire.ssh import NodeConnection
project, port, known = sys.argv[1], int(sys.argv[2]), sys.argv[3]
n, modes = int(sys.argv[4]), json.loads(sys.argv[5])
inventory = load_inventory(os.path.join(project, "hosts"))
host = replace(inventory.resolve("lab01"), port=port, known_hosts=known, connect_timeout=30)
NodeConnection(host, inventory).prepare()
walls = {m: [] for m in modes}
cpus = {m: [] for m in modes}
for i in range(n + 1):
    for mode, switch in modes.items():  # round robin: every mode sees the same load on the machine
        os.environ["FLEETOPS_PUBLIC_ONLY"] = switch
        compat.recheck()
        conn = NodeConnection(host, inventory)
        w, c = time.perf_counter(), time.process_time()
        conn.call("ping", {})
        w, c = time.perf_counter() - w, time.process_time() - c
        conn.close()
        if i:  # the first round warms imports and caches
            walls[mode].append(w * 1e3)
            cpus[mode].append(c * 1e3)
print(json.dumps({m: {"wall_ms": round(statistics.median(walls[m]), 1),
                      "cpu_ms": round(statistics.median(cpus[m]), 2)}
                  for m in modes}))
"""


def _proxy(rtt: float, port: int) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "delay_proxy.py"), "--rtt-ms", str(rtt), str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, int(json.loads(proc.stdout.readline())["listen"][str(port)])


def connections(project: Path, rtts: list[float], n: int) -> dict:
    lab = (project / "hosts" / "lab.yaml").read_text()
    port = int(lab.split("lab01:", 1)[1].split("port:", 1)[1].split()[0])
    known = (project / ".lab" / "known_hosts").read_text().splitlines()
    line = next(x for x in known if x.startswith(f"[127.0.0.1]:{port} "))
    out: dict = {}
    for rtt in rtts:
        proxy, listen = _proxy(rtt, port) if rtt else (None, port)
        try:
            with tempfile.NamedTemporaryFile("w", suffix="known_hosts", delete=False) as f:
                f.write(line.replace(f":{port} ", f":{listen} ", 1) + "\n")
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            proc = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    CONNECT,
                    str(project),
                    str(listen),
                    f.name,
                    str(n),
                    json.dumps(MODES),
                ],
                capture_output=True,
                text=True,
                env=env,
                timeout=1800,
                check=True,
            )
            for mode, figures in json.loads(proc.stdout.splitlines()[-1]).items():
                out[f"{rtt:g} ms RTT, {mode}"] = figures
        finally:
            if proxy is not None:
                proxy.terminate()
                proxy.wait()
    return out


def _median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(times), 3)


def known_hosts(tmp: Path) -> dict:
    import paramiko

    from fleetops import compat
    from fleetops.wire import hostkeys

    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "k")], check=True
    )
    key = paramiko.Ed25519Key.from_private_key_file(str(tmp / "k"))
    out = {}
    for hosts in (128, 800):
        path = tmp / f"known_hosts_{hosts}"
        path.write_text(
            "".join(
                f"[10.0.{i // 250}.{i % 250}]:22 {key.get_name()} {key.get_base64()}\n"
                for i in range(hosts)
            )
        )
        for mode, switch in (("on", ""), ("off", "indexed_host_keys,shared_host_keys")):
            os.environ["FLEETOPS_PUBLIC_ONLY"] = switch
            compat.recheck()
            hostkeys._HOST_KEYS.clear()
            hostkeys._MERGED_KEYS.clear()
            # parses the file
            first = _median_ms(lambda p=path: hostkeys.strict_client([str(p)]), 1)

            def connection(p: Path = path, h: int = hosts) -> None:
                keys = hostkeys.strict_client([str(p)]).get_host_keys()
                for _ in range(3):  # paramiko's SSHClient.connect looks the host up three times
                    keys.lookup(f"[10.0.{(h - 1) // 250}.{(h - 1) % 250}]:22")

            out[f"{hosts} hosts, {mode}"] = {
                "first_ms": first,
                "per_connection_ms": _median_ms(connection, 30),
            }
    os.environ["FLEETOPS_PUBLIC_ONLY"] = ""
    compat.recheck()
    return out


def shared_config() -> dict:
    from fleetops import compat
    from fleetops.plans.inventory import plain_host
    from fleetops.wire import fabconfig, hops

    out = {}
    for mode, switch in (("on", ""), ("off", "shared_config")):
        os.environ["FLEETOPS_PUBLIC_ONLY"] = switch
        compat.recheck()
        fabconfig._CONFIG = None
        host = plain_host("ops@10.0.0.1:22")
        out[mode] = {
            "connection_build_ms": _median_ms(lambda h=host: hops.fabric_connection(h, None), 200)
        }
    os.environ["FLEETOPS_PUBLIC_ONLY"] = ""
    compat.recheck()
    return out


def task_parser() -> dict:
    from fabric import Config

    from fleetops import compat
    from fleetops.cli import Fleet
    from fleetops.fab.executor import FleetExecutor

    argv = ["fab", "-H", "lab01", "patch", "verify"]
    os.chdir(REPO)

    def parse() -> None:
        prog = Fleet(
            name="fleetops",
            executor_class=FleetExecutor,
            config_class=Config,
            binary="fab",
            binary_names=["fab"],
        )
        prog.create_config()
        prog.parse_core(argv)
        prog.parse_collection()
        prog.parse_tasks()

    out = {}
    for mode, switch in (("on", ""), ("off", "task_parser")):
        os.environ["FLEETOPS_PUBLIC_ONLY"] = switch
        compat.recheck()
        parse()
        out[mode] = {"parse_ms": _median_ms(parse, 30)}
    os.environ["FLEETOPS_PUBLIC_ONLY"] = ""
    compat.recheck()
    return out


def yaml_loads(project: Path) -> dict:
    from fleetops.plans import yamlload
    from fleetops.plans.yamlsrc import load_text

    files = sorted(
        [
            *REPO.glob("playbooks/*.yaml"),
            REPO / "hosts" / "example.yaml",
            project / "hosts" / "lab.yaml",
        ]
    )
    inventory = "defaults:\n  user: ops\nhosts:\n" + "".join(
        f"  gpu{i:03d}:\n    address: 10.0.{i // 250}.{i % 250}\n    groups: [gpus, rack{i % 8}]\n"
        for i in range(128)
    )
    texts = {
        str(p.relative_to(REPO) if REPO in p.parents else p.name): p.read_text() for p in files
    }
    texts["a 128-host inventory"] = inventory
    c_loader = yamlload.StrictCLoader
    out = {}
    for name, text in texts.items():
        fast = _median_ms(lambda t=text, n=name: load_text(t, n), 20)
        yamlload.StrictCLoader = None
        try:
            slow = _median_ms(lambda t=text, n=name: load_text(t, n), 20)
        finally:
            yamlload.StrictCLoader = c_loader
        out[name] = {"libyaml_ms": fast, "python_ms": slow}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("project", type=Path)
    ap.add_argument("--rtt-ms", type=float, nargs="+", default=[0.0, 50.0])
    ap.add_argument("--connections", type=int, default=15)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        result = {
            "connection (open + one ping to a fresh agent)": connections(
                args.project, args.rtt_ms, args.connections
            ),
            "known_hosts": known_hosts(Path(tmp)),
            "shared config": shared_config(),
            "task parser": task_parser(),
            "yaml": yaml_loads(args.project),
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
