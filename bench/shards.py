#!/usr/bin/env python3
"""Aggregated throughput of `extract --shards` on 3 lab nodes against the same extraction on one
node.

    .venv/bin/python bench/shards.py [--nodes 3] [--keep]

Run by hand, not by CI (a benchmark, not a timed test). A throwaway project under
bench/.work/shards-project with its own lab nodes (real sshd on 127.0.0.1, the tiny CPU model the
lab builds), every node patched, then:
  1. one node: `fab -H lab01 extract tail`, the whole dataset (64 prompts) unsharded;
  2. N nodes: `fab -H @lab extract --shards` then `fab -H @lab tail`, one shard per node.
For each: wall time from launch to the end of tail, tokens extracted (summed from the output
manifests, not from log lines), and tok/s = tokens / wall time. Also the per-shard tok/s each
extraction reported in its own last progress line, summed (what `status`/`tail` show as the fleet's
tok/s while all shards run).

All lab nodes are processes on this one machine: they share its cores, so on a 2-core machine the
aggregate cannot exceed what one node gets alone (and model loads compete); on real hosts each shard
has its own GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleetops.lab import Lab  # noqa: E402

WORK = REPO / "bench" / ".work" / "shards-project"
RATE = re.compile(
    r"^(?P<host>\S+) .*?progress samples=(?P<done>\d+)/(?P<total>\d+).*?tok/s=(?P<tok_s>[0-9.]+)",
    re.M,
)


def fab(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", "FLEETOPS_NO_LIVE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", *args],
        cwd=WORK,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"fab {' '.join(args)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n"
            f"{proc.stderr[-2000:]}"
        )
    return proc


def tokens(manifest: Path) -> int:
    return sum(int(s["tokens"]) for s in json.loads(manifest.read_text())["samples"].values())


def last_rates(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in RATE.finditer(text):
        if m.group("host") != "fleet":
            out[m.group("host")] = float(m.group("tok_s"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument(
        "--keep", action="store_true", help="leave the lab running (bench/.work/shards-project)"
    )
    args = ap.parse_args()
    if WORK.exists():
        Lab(WORK).down(purge=True)
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True)
    for name in ("fabfile.py", "fabric.yaml", "playbooks"):
        (WORK / name).symlink_to(REPO / name)
    (WORK / "hosts").mkdir()
    lab = Lab(WORK)
    try:
        lab.up(args.nodes, progress=lambda m: print(m, file=sys.stderr))
        fab("-H", "@lab", "patch")
        t0 = time.monotonic()
        fab("-H", "lab01", "extract")
        single_log = fab("-H", "lab01", "tail").stdout
        single_s = time.monotonic() - t0
        single_tokens = tokens(lab.node("lab01").state_dir / "hidden-states" / "manifest.json")
        t0 = time.monotonic()
        fab("-H", "@lab", "extract", "--shards")
        shard_log = fab("-H", "@lab", "tail").stdout
        shard_s = time.monotonic() - t0
        n = args.nodes
        shard_tokens = sum(
            tokens(
                node.state_dir / "hidden-states" / "shards" / f"output-{i}-of-{n}" / "manifest.json"
            )
            for i, node in enumerate(sorted(lab.nodes(), key=lambda x: x.name))
        )
        cores = os.cpu_count()
        print(f"machine: {cores} cores shared by every lab node (and anything else running here)")
        print(
            f"single node : {single_tokens} tokens in {single_s:.1f}s wall = "
            f"{single_tokens / single_s:.1f} tok/s (extraction's own last tok/s: "
            f"{last_rates(single_log).get('lab01', 0.0):.1f})"
        )
        rates = last_rates(shard_log)
        print(
            f"{n} shards    : {shard_tokens} tokens in {shard_s:.1f}s wall = "
            f"{shard_tokens / shard_s:.1f} tok/s aggregated (shards' own last tok/s: "
            f"{', '.join(f'{h} {r:.1f}' for h, r in sorted(rates.items()))}; sum "
            f"{sum(rates.values()):.1f})"
        )
        same = "the same tokens" if single_tokens == shard_tokens else "TOKEN COUNTS DIFFER"
        print(f"speed-up    : {single_s / shard_s:.2f}x wall time ({same})")
    finally:
        if not args.keep:
            subprocess.run(
                [sys.executable, "-m", "fabric", "-H", "@lab", "stop", "--grace", "1"],
                cwd=WORK,
                capture_output=True,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
            lab.down(purge=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
