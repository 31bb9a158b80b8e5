"""The client's cost of drawing a big `verify`: folding on and off.

    .venv/bin/python bench/fold_render.py                 # 128 hosts, 2 odd ones, 20 repetitions
    .venv/bin/python bench/fold_render.py --hosts 800 --odd 5 --reps 10

No network and no lab: the reporter is fed `verify` results shaped like a real run's (the playbook's
14 checks per host, the host's own paths in the messages, a drifted host and a failed one with
evidence) and draws them to an in-memory non-terminal console at 130 columns, as `fab ... | less`
would. What is timed is everything the operator waits for after the last host answered:
Reporter.result for each host and Reporter.finish (folded groups, recap, summary line). CPU is this
process's (time.process_time), wall is time.perf_counter; the table gives the median and the worst
of the repetitions, and the output's size.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console

from fleetops.report.console import Reporter
from fleetops.report.fold import identities
from fleetops.results import Evidence, Item, Result, Status

CHECKS = (
    [("requires", "speculators==0.3.0", "installed 0.3.0")]
    + [
        (
            "grep",
            f"data_generation/vllm_hidden_states_generator.py has marker {n}",
            "found at line {line}",
        )
        for n in range(11)
    ]
    + [("compile", f"compile {m}", "compiled") for m in ("generator", "worker")]
)


def verify_result(host: str, odd: str | None) -> Result:
    items = []
    for n, (kind, label, msg) in enumerate(CHECKS):
        status = Status.OK
        text = msg.format(line=100 + n)
        details = {"proves": f"what a {kind} check proves", "cannot": "runtime behaviour"}
        if odd == "drift" and n == 3:
            status, text = Status.FAILED, "not found"
            details["evidence"] = [
                {"line": 140, "text": f"/srv/{host}/venv/.../generator.py: import  os"}
            ]
        items.append(Item(label, status, text, details))
    failed = any(i.status is Status.FAILED for i in items) or odd == "down"
    if odd == "down":
        return Result(
            host,
            "verify",
            Status.UNREACHABLE,
            f"{host}: connection refused; is sshd running?",
            evidence=Evidence(f"ssh {host}", None, ["Connection refused"], 0.01),
        )
    return Result(
        host,
        "verify",
        Status.FAILED if failed else Status.OK,
        f"{len(items)} checks on {host}: {'1 failed' if failed else 'all passed'}",
        items=items,
        evidence=Evidence("agent verify", 1, ["AssertionError"], 0.4) if failed else None,
    )


def one(hosts: int, odd: int, fold_on: bool) -> tuple[float, float, int]:
    names = [f"gpu{i:03d}" for i in range(1, hosts + 1)]
    odd_kinds = {names[(k * 37) % hosts]: ("drift" if k % 2 == 0 else "down") for k in range(odd)}
    results = [verify_result(h, odd_kinds.get(h)) for h in names]
    out = io.StringIO()
    rep = Reporter(console=Console(file=out, width=130, highlight=False, soft_wrap=True))
    rep.who = identities((h, f"10.1.{i // 250}.{i % 250 + 1}", 22) for i, h in enumerate(names))
    rep.fold = fold_on
    rep.started = time.monotonic()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for r in results:
        rep.result(r)
    rep.finish(results, 1, rerun="fab -H ... verify")
    return time.process_time() - cpu0, time.perf_counter() - wall0, len(out.getvalue().splitlines())


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument(
        "--odd", type=int, default=2, help="hosts that answer differently (drifted / unreachable)"
    )
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    one(8, 1, True)  # warm up imports and rich's caches
    print(
        f"printing a {args.hosts}-host verify ({args.odd} odd hosts), {args.reps} repetitions, "
        f"python {sys.version.split()[0]}"
    )
    print()
    print("| folding | CPU median ms | CPU max ms | wall median ms | wall max ms | lines printed |")
    print("|---|---:|---:|---:|---:|---:|")
    for fold_on in (False, True):
        runs = [one(args.hosts, args.odd, fold_on) for _ in range(args.reps)]
        cpu = [r[0] * 1000 for r in runs]
        wall = [r[1] * 1000 for r in runs]
        print(
            f"| {'on' if fold_on else 'off (--no-fold)'} | {statistics.median(cpu):.1f} | "
            f"{max(cpu):.1f} | {statistics.median(wall):.1f} | {max(wall):.1f} | {runs[0][2]} |"
        )


if __name__ == "__main__":
    main()
