"""The floor: what any tool that runs the node's Python once per host costs when that Python does
nothing.

    python3 bench/floor.py HOSTS.json

HOSTS.json as bench/peer_fabric.py reads it. Per host, in parallel threads: one paramiko connection
(strict known_hosts, the bench's key), one exec of `<node python> -c pass`, close. Its node CPU is
the SSH connection, the exec's session and login shell, and the node's Python starting and exiting,
nothing else: a lower bound for fleetops' one agent exec per host, which runs under the same
interpreter. Its wall time at N = 1 is what stock paramiko takes to get that far (Python start,
paramiko's import, the handshake, one exec). Exit 0 only if every host's exec exited 0.
"""

from __future__ import annotations

import json
import shlex
import sys
import threading
from pathlib import Path

import paramiko


def one(host: dict, failures: list[str]) -> None:
    client = paramiko.SSHClient()
    client.load_host_keys(host["known_hosts"])
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            host["address"],
            port=host["port"],
            username=host["user"],
            key_filename=host["identity_file"],
            look_for_keys=False,
            allow_agent=False,
            timeout=10,
        )
        stdin, out, err = client.exec_command(shlex.join([host["python"], "-c", "pass"]))
        stdin.close()
        out.read()  # to EOF, as a peer reads its command's output
        problem = err.read().decode(errors="replace")
        code = out.channel.recv_exit_status()
        out.channel.close()
        if code != 0:
            failures.append(f"{host['name']}: exit {code}: {problem}")
    except Exception as exc:  # reported per host, like the peers do
        failures.append(f"{host['name']}: {type(exc).__name__}: {exc}")
    finally:
        client.close()


def main() -> int:
    hosts = json.loads(Path(sys.argv[1]).read_text())
    failures: list[str] = []
    threads = [threading.Thread(target=one, args=(h, failures)) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for line in failures:
        print(line, file=sys.stderr)
    print(f"{len(hosts)} hosts, 1 exec each, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
