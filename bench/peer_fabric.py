"""The hand-written Fabric peer: one ThreadingGroup, three `group.run(...)` calls
(bench/peer_work.py).

    python3 bench/peer_fabric.py HOSTS.json SPEC.json [--show]

HOSTS.json: [{"name", "address", "port", "user", "identity_file", "known_hosts", "python", "site",
"diffs"}]. Strict host keys as fleetops does them (known_hosts loaded, RejectPolicy). The per-host
paths reach the commands through each connection's environment (Fabric inlines `export VAR=... &&`),
so the three commands are the same string on every host, as a group.run wants. Exit 0 only if every
command passed on every host.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import paramiko
from fabric import Config, Connection, ThreadingGroup
from fabric.exceptions import GroupException

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_work import commands, load_spec


def strict_client(known_hosts: str) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(known_hosts)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


def main() -> int:
    hosts = json.loads(Path(sys.argv[1]).read_text())
    spec = load_spec(sys.argv[2])
    conns = []
    for h in hosts:
        config = Config(
            overrides={
                "run": {
                    "env": {
                        "BENCH_PY": h["python"],
                        "BENCH_SITE": h["site"],
                        "BENCH_DIFFS": h["diffs"],
                    }
                }
            }
        )
        cxn = Connection(
            h["address"],
            user=h["user"],
            port=h["port"],
            config=config,
            connect_timeout=10,
            connect_kwargs={
                "key_filename": h["identity_file"],
                "look_for_keys": False,
                "allow_agent": False,
            },
        )
        cxn.client = strict_client(h["known_hosts"])
        conns.append(cxn)
    group = ThreadingGroup.from_connections(conns)
    failed = 0
    try:
        for name, cmd in commands(spec, '"$BENCH_PY"', '"$BENCH_SITE"', '"$BENCH_DIFFS"'):
            results = group.run(cmd, hide=True, warn=True)
            if "--show" in sys.argv:
                for cxn, res in results.items():
                    print(
                        f"--- {cxn.host}:{cxn.port} {name} (exit {res.exited})\n{res.stdout}",
                        end="",
                    )
            for cxn, res in results.items():
                if res.exited != 0:
                    failed += 1
                    print(
                        f"{cxn.host}:{cxn.port} {name}: exit {res.exited}\n"
                        f"{res.stdout}{res.stderr}",
                        file=sys.stderr,
                    )
    except GroupException as exc:
        for cxn, res in exc.result.items():
            print(f"{cxn.host}:{cxn.port}: {res!r}", file=sys.stderr)
        return 4
    finally:
        group.close()
    print(f"{len(conns)} hosts, 3 commands each, {failed} failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
