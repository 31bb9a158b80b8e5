"""The per-host client CPU floor under fleetops at scale: what a run pays per host before any task's
work, one host after another in one thread (no fan-out, no contention), against the large lab's
hosts directly.

    .venv/bin/python bench/scale_floor.py PROJECT [N]

PROJECT holds hosts/*.yaml naming N or more hosts. Printed, per host, in ms of this process's CPU
(time.process_time): reading the inventory (YAML to Host), and one SSH connection through fleetops'
own wire (wire/node.py: tuned paramiko transport, the login key loaded once, strict known_hosts)
that runs `true` and closes: connect, key exchange, host-key check, login, one session channel. What
a `ping` costs per host beyond these two is fleetops' own: the agent's request and answer, the
result, the report, the audit line.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetops.plans.inventory import load_inventory
from fleetops.wire.ssh import NodeConnection


def main() -> None:
    project = Path(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    load_inventory(project / "hosts")  # warm: imports
    c0 = time.process_time()
    inventory = load_inventory(project / "hosts")
    hosts = list(inventory.hosts.values())
    inv_ms = (time.process_time() - c0) * 1000 / len(hosts)
    hosts = hosts[:n] if n else hosts
    first = NodeConnection(hosts[0], inventory)
    first.exec(["true"])  # warm: paramiko's imports, the key
    first.close()
    c0 = time.process_time()
    for host in hosts:
        node = NodeConnection(host, inventory)
        result = node.exec(["true"])
        node.close()
        if result.exit_code != 0:
            raise SystemExit(f"{host.name}: `true` exited {result.exit_code}")
    ssh_ms = (time.process_time() - c0) * 1000 / len(hosts)
    print(
        json.dumps(
            {
                "hosts_in_inventory": len(inventory.hosts),
                "inventory_ms_per_host": round(inv_ms, 2),
                "hosts_connected": len(hosts),
                "ssh_exec_ms_per_host": round(ssh_ms, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
