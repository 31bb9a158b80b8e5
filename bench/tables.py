"""RESULTS.md from a bench run's numbers: the machine, the delay calibration, the results table, per
host and the projection for a real fleet, the probe runs, the CLI overhead, then the targets and the
profile."""

from __future__ import annotations

from benchpaths import NCPU, TOOLS
from measure import Run, cpu_methods, med, medians_of, per_host, rows_for, scenarios
from verdicts import analysis, targets


def retried(runs: list[Run], tool: str, n: int, rtt: float, rs: list[Run]) -> str:
    noisy = sum(
        1 for r in runs if r.kind == "noisy" and r.tool == tool and r.n == n and r.rtt == rtt
    )
    still = sum(1 for r in rs if r.noisy)
    parts = ([f"{noisy} noisy re-run"] if noisy else []) + (
        [f"{still} still noisy"] if still else []
    )
    return f" ({', '.join(parts)})" if parts else ""


def bytes_cell(r: Run) -> str:
    if any(t < c for t, c in zip(r.transferred, r.conns)):
        return (
            "- (not logged: ssh -O exit)"
            if r.tool == "ansible"
            else "- (sshd logged no Transferred: line)"
        )
    return f"{med(r.bytes):.0f}"


def projection(runs: list[Run], medians: dict, tool: str, n: int, rtt: float) -> float | None:
    """Model for a real fleet (each node has its own CPUs, so the lab's node CPU leaves the client's
    cores): the critical path of one host (this run's N = 1 wall at the same RTT) plus the client
    CPU that the other N − 1 hosts add (this run's client CPU at N minus at N = 1), spread over the
    client's cores."""
    one, rs, rs1 = (
        medians.get((tool, 1, rtt)),
        rows_for(runs, tool, n, rtt),
        rows_for(runs, tool, 1, rtt),
    )
    if one is None or not rs or not rs1:
        return None
    extra = med([r.client_cpu for r in rs]) - med([r.client_cpu for r in rs1])
    return one + max(0.0, extra) / NCPU


def per_host_section(runs: list[Run], medians: dict) -> list[str]:
    L = ["### Per host, and a projection for a real fleet", ""]
    L.append(
        "Client and node CPU per host = the run's median "
        "CPU / N. **Projection for a real fleet** (model): "
        "on real nodes each node's work runs on its own CPUs, "
        "so what remains on the critical path is one host's "
        "chain (this run's N = 1 median wall at the same RTT) plus the client CPU the other "
        "hosts add (client CPU "
        "at N − client CPU at N = 1), spread over the client's "
        f"{NCPU} cores. It is a model, not a measurement: "
        "it ignores the client's network stack and assumes "
        "the nodes answer as fast as an idle lab node."
    )
    L.append("")
    L.append(
        "| tool / scenario | N | RTT ms | median wall s | client CPU ms/host | node CPU ms/host "
        "| peak RSS MB | projection for a real fleet s |"
    )
    L.append("|---|---|---|---|---|---|---|---|")
    for rtt, n in scenarios(runs):
        for tool, label in TOOLS:
            rs = rows_for(runs, tool, n, rtt)
            if not rs:
                continue
            proj = projection(runs, medians, tool, n, rtt)
            L.append(
                f"| {label} | {n} | {rtt:g} | {medians[(tool, n, rtt)]:.3f} | "
                f"{med([r.client_cpu for r in rs]) / n * 1e3:.1f} | "
                f"{med([r.node_cpu for r in rs]) / n * 1e3:.1f} | "
                f"{max(r.maxrss_kb for r in rs) / 1024:.0f} | "
                f"{'-' if proj is None else f'{proj:.3f}'} |"
            )
    L.append("")
    return L


def render(
    runs: list[Run],
    calib: list[dict],
    cli: dict,
    info: dict,
    args,
    profile_md: str,
    wall_total: float,
) -> str:
    medians = medians_of(runs)
    L = (
        _title(info, args, wall_total)
        + _machine(info)
        + _calibration(calib)
        + _results(runs, medians, args)
    )
    L += (
        per_host_section(runs, medians)
        + _probes(runs)
        + _cli_overhead(cli)
        + _verdicts(runs, cli, medians)
    )
    if profile_md:
        L.append(analysis(runs, medians, args))
        L.append(profile_md)
    return "\n".join(L) + "\n"


def command_line(args) -> str:
    """The bench/run.py command that reproduces this run's rows."""
    line = (
        f"python3 bench/run.py --sizes {args.sizes} --rtts {args.rtts} --big {args.big} --big-rtt "
        f"{args.big_rtt:g} --reps {args.reps}"
    )
    if args.tools != ",".join(key for key, _ in TOOLS):
        line += f" --tools {args.tools}"
    return line + (" --no-cli" if args.no_cli else "")


def _title(info: dict, args, wall_total: float) -> list[str]:
    return [
        "# fleetops vs Ansible, pyinfra and a Fabric ThreadingGroup script",
        "",
        f"Written by `{command_line(args)}` on {info['date']} "
        f"({wall_total / 60:.1f} min). Every number below "
        "comes from this one run."
        + (
            ""
            if args.reps >= 3
            else f" **Reduced run: {args.reps} repetition(s) per row, not 3**: the medians are "
            "less robust than the published bench's."
        ),
        "",
    ]


def _machine(info: dict) -> list[str]:
    keys = (
        "cpu",
        "ram",
        "kernel",
        "os",
        "python",
        "fabric",
        "paramiko",
        "invoke",
        "peers",
        "openssh",
        "fleetops",
        "agent",
    )
    return [
        "## Machine",
        "",
        *(f"- {k}: {info[k]}" for k in keys),
        "",
        "The lab nodes are real OpenSSH sshd processes on "
        "this same machine (fleetops.lab), so every node's "
        "remote work (sshd, the login shell, the commands) competes with the client for the same "
        f"{NCPU} cores: see the CPU columns.",
        "",
        "The peers do fleetops' steady-state work as 3 "
        "shell commands (bench/peer_work.py); before the "
        f"timed runs the bench ran them once and checked the output: {info.get('peer_check', '')}.",
        "",
    ]


def _calibration(calib: list[dict]) -> list[str]:
    L = [
        "## Delay calibration (bench/delay_proxy.py)",
        "",
        "| RTT set | TCP connect | connect + first byte (server speaks first) | echo turn | `ssh "
        "true` direct | `ssh true` proxied | extra RTTs per `ssh true` |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in calib:
        L.append(
            f"| {c['rtt_ms']:g} ms | {c['connect_ms']:.1f} ms | {c['connect_first_byte_ms']:.1f} "
            f"ms (model: 1.5 RTT) | {c['echo_turn_ms']:.1f} ms | {c['ssh_true_direct_s']:.3f} s "
            f"| {c['ssh_true_proxied_s']:.3f} s | {c['ssh_true_extra_rtts']:.1f} |"
        )
    L += [
        "",
        "connect() returns at once (the proxy accepts locally); the handshake's RTT shows up as "
        "the first byte arriving 1 RTT + RTT/2 late. The proxy delays data, not TCP segments: on "
        "loopback every segment is ACKed at once, so Nagle's algorithm and delayed ACKs never "
        "cost a round trip here. The reference lab (NFQUEUE on every packet, the shared "
        "reference notes beside the project) measured 12.6 extra RTTs for `ssh true`: read the "
        "delayed rows as a lower bound on what the RTT costs.",
        "",
    ]
    return L


def _results(runs: list[Run], medians: dict, args) -> list[str]:
    L = [
        "## Results",
        "",
        f"Median of {args.reps} timed runs per row "
        "(min–max), tools alternating within each repetition "
        "(a warm-up and a probe run per tool and scenario are not timed). Before each run the "
        "bench waits for the "
        "machine to be idle (others' tests share it); a run during which others used more than "
        "--noisy-cores is run again and the noisy one left out (counted in 'runs ok'). Ratio = "
        "this row's median / "
        "fleetops `patch verify` median in the same scenario "
        "(> 1: slower than fleetops). conns/execs/sftp "
        "per host: from the sshd logs, every timed run "
        "(a range if they varied). Peak RSS: the largest "
        "single client process (wait4 ru_maxrss; Ansible "
        "includes its forked workers, its ssh clients and "
        "the adopted ControlPersist masters). CPU: median "
        "seconds per run on the client (the tool and its "
        "children), on the nodes (sshd + shell + commands, "
        "all on this machine), in the delay proxy, "
        f"measured by {cpu_methods(runs)}; machine busy = "
        "the whole machine's busy CPU over the same span "
        "(/proc/stat), a cross-check; others = busy − client − node − proxy (the kernel's "
        "loopback networking "
        "outside any process, this bench process, other "
        "users: large 'others' means the three columns "
        "missed something or the machine was not quiet); "
        f"CPU bound = (client + node + proxy CPU) / {NCPU} "
        "cores: no run can be faster than that here (a "
        "lower bound: it counts neither 'others' nor waits).",
        "",
        "| tool / scenario | N | RTT ms | median wall s (min–max) | ratio to fleetops patch "
        "verify | conns/host | execs/host | sftp/host | peak RSS MB | client CPU s | node CPU s "
        "| proxy CPU s | machine busy CPU s | others CPU s | CPU bound s | runs ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rtt, n in scenarios(runs):
        base = medians.get(("fo_pv", n, rtt))
        for tool, label in TOOLS:
            rs = rows_for(runs, tool, n, rtt)
            if not rs:
                continue
            walls = [r.wall for r in rs]
            m = med(walls)
            ratio = f"{m / base:.2f}×" if base else "-"
            cpu_c, cpu_n, cpu_p = (
                med([r.client_cpu for r in rs]),
                med([r.node_cpu for r in rs]),
                med([r.proxy_cpu for r in rs]),
            )
            bound = (cpu_c + cpu_n + cpu_p) / NCPU
            L.append(
                f"| {label} | {n} | {rtt:g} | {m:.3f} ({min(walls):.3f}–{max(walls):.3f}) | "
                f"{ratio} | {per_host([r.conns for r in rs])} | "
                f"{per_host([r.execs for r in rs])} | {per_host([r.sftp for r in rs])} | "
                f"{max(r.maxrss_kb for r in rs) / 1024:.0f} | {cpu_c:.2f} | {cpu_n:.2f} | "
                f"{cpu_p:.2f} | {med([r.busy_cpu for r in rs]):.2f} | "
                f"{med([r.others_cpu for r in rs]):.2f} | {bound:.2f} | "
                f"{sum(r.ok for r in rs)}/{len(rs)}{retried(runs, tool, n, rtt, rs)} |"
            )
    L.append("")
    return L


def _trace_cell(r: Run) -> str:
    if not (r.trace and r.trace.get("counters")):
        return "-"
    rows = list(r.trace["counters"].values())
    return "/".join(
        per_host([[row[k] for row in rows]]) for k in ("connections", "execs", "uploads")
    )


def _probes(runs: list[Run]) -> list[str]:
    L = [
        "### Probe runs (one per tool and scenario, not timed)",
        "",
        "Client process tree sampled every 50 ms: peak of the summed RSS and PSS over every "
        "process of the tool (PSS shares pages between forked workers fairly), most processes at "
        "once; bytes per host from sshd's `Transferred:` lines; fleetops' own counters "
        "(FLEETOPS_TRACE=1, --json).",
        "",
        "| tool | N | RTT ms | wall s | tree peak RSS MB | tree peak PSS MB | processes | "
        "bytes/host | fleetops trace per host (conns/execs/uploads) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rtt, n in scenarios(runs):
        for tool, label in TOOLS:
            for r in runs:
                if r.kind == "probe" and r.tool == tool and r.n == n and r.rtt == rtt:
                    L.append(
                        f"| {label} | {n} | {rtt:g} | {r.wall:.3f} | {r.tree_rss_kb / 1024:.0f} "
                        f"| {r.tree_pss_kb / 1024:.0f} | {r.tree_procs} "
                        f"| {bytes_cell(r)} | {_trace_cell(r)} |"
                    )
    L.append("")
    return L


def _cli_overhead(cli: dict) -> list[str]:
    L = [
        "### CLI overhead (1 host, 0 ms)",
        "",
        "| command | median wall s (min–max) | client CPU s | node CPU s | peak RSS MB | runs ok |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in (
        ("fo_ping1", "`fab -H bench01 ping`"),
        ("fo_list", "`fab --list` (no network)"),
        ("fo_deep", "`fab -H bench01 verify` (deep: vLLM import, callsites, probe)"),
    ):
        rs = cli.get(key, [])
        if rs:
            walls = [r.wall for r in rs]
            L.append(
                f"| {label} | {med(walls):.3f} ({min(walls):.3f}–{max(walls):.3f}) | "
                f"{med([r.client_cpu for r in rs]):.2f} | {med([r.node_cpu for r in rs]):.2f} | "
                f"{max(r.maxrss_kb for r in rs) / 1024:.0f} | {sum(r.ok for r in rs)}/{len(rs)} |"
            )
    L.append("")
    return L


def _verdicts(runs: list[Run], cli: dict, medians: dict) -> list[str]:
    rep_runs = [r for r in runs if r.kind == "rep"]
    rates = [r.foreign_cpu / (r.span or r.wall) for r in rep_runs if r.wall > 0]
    return [
        *targets(runs, cli, medians),
        "",
        "Noise: CPU used on this machine by others during the timed runs (busy − client − node "
        f"− proxy − this bench process), median {med(rates):.2f} cores (max "
        f"{max(rates, default=0):.2f})."
        + (
            ""
            if all(r.settled for r in rep_runs)
            else f" In {sum(not r.settled for r in rep_runs)} timed run(s) the nodes' sessions "
            "had not all ended 20 s "
            "after the tool exited (their node CPU may be short)."
        ),
        "",
    ]
