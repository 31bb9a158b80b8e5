"""What an OpenSSH master connection costs the client: RSS, PSS (smaps_rollup) and open descriptors
of one `ssh -M` master and of 32 at once against a lab's nodes, and what the nodes' sshd spend on
them. Each master is real (`ssh -M -fN`, ControlPersist, socket in a private control directory),
closed with `ssh -O exit` at the end (fleetops.wire.masters), none left.

    fab lab.up 2                                       # in a project (any: a `fleet init` one)
    .venv/bin/python bench/master_cost.py --project PROJECT [--counts 1,32]

Linux only (/proc). Figures in docs/perf.md ("What a master connection costs")."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from fleetops.lab import Lab
from fleetops.wire import masters


def kib(pid: int, field: str = "VmRSS", source: str = "status") -> int:
    return masters.proc_kib(pid, field, source) or 0  # a process gone since: nothing it costs


def children(pid: int) -> list[int]:
    """Every descendant of `pid` (the per-connection sshd processes under a node's listener)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in os.listdir(f"/proc/{parent}/task"):
            try:
                kids = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except OSError:
                continue
            out += [int(k) for k in kids]
            todo += [int(k) for k in kids]
    return out


def start(lab: Lab, directory: Path, count: int) -> dict[int, str]:
    nodes = lab.nodes()
    for i in range(count):
        node = nodes[i % len(nodes)]
        masters.open_master(
            str(directory / f"m{i:03d}"),
            f"{lab.user}@127.0.0.1",
            node.port,
            str(lab.client_key),
            str(lab.known_hosts),
            persist_s=600,
            timeout=60,
        )
    found = {m.pid: m.socket for m in masters.masters(str(directory)) if m.pid}
    if len(found) != count:
        raise SystemExit(f"asked for {count} masters, {len(found)} answer `ssh -O check`")
    return found


def measure(lab: Lab, count: int) -> dict[str, float]:
    directory = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp"))
    listeners = [n.pid() for n in lab.nodes()]
    before = {pid: set(children(pid)) for pid in listeners if pid}
    try:
        pids = start(lab, directory, count)
        rss = [kib(p) for p in pids]
        pss = [kib(p, "Pss", "smaps_rollup") for p in pids]
        open_fds = [masters.fd_count(p) or 0 for p in pids]
        served = [c for pid, old in before.items() for c in children(pid) if c not in old]
        node_rss = sum(kib(c) for c in served)
        node_pss = sum(kib(c, "Pss", "smaps_rollup") for c in served)
    finally:
        closed = masters.close_all(str(directory), masters.masters(str(directory)))
        left = masters.listening_pids(str(directory))
        shutil.rmtree(directory, ignore_errors=True)
    if left or any(c.outcome != "closed" for c in closed):
        raise SystemExit(f"masters left running: {left or closed}")
    return {
        "count": count,
        "rss_kib": statistics.mean(rss),
        "rss_total_kib": sum(rss),
        "pss_kib": statistics.mean(pss),
        "pss_total_kib": sum(pss),
        "fds": statistics.mean(open_fds),
        "fds_total": sum(open_fds),
        "node_procs": len(served),
        "node_rss_kib": node_rss,
        "node_pss_kib": node_pss,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--project", required=True, help="a project whose lab is up (fab lab.up)")
    ap.add_argument("--counts", default="1,32")
    args = ap.parse_args()
    lab = Lab(Path(args.project))
    if not lab.nodes():
        print(f"no lab in {args.project}: run `fab lab.up` there first", file=sys.stderr)
        return 2
    print(
        f"{'masters':>7} {'RSS/master':>11} {'PSS/master':>11} {'fds/master':>10} {'PSS, all':>10} "
        f"{'fds, all':>8} {'node sshd procs':>15} {'node PSS':>9}"
    )
    for count in (int(c) for c in args.counts.split(",")):
        r = measure(lab, count)
        print(
            f"{r['count']:>7} {r['rss_kib'] / 1024:>8.1f} MB {r['pss_kib'] / 1024:>8.2f} MB "
            f"{r['fds']:>10.1f} {r['pss_total_kib'] / 1024:>7.1f} MB {r['fds_total']:>8} "
            f"{r['node_procs']:>15} {r['node_pss_kib'] / 1024:>6.1f} MB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
