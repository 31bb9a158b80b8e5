"""What a bench run says: the targets, met or missed, the other checks, and "where the time goes"
(generated from the run's numbers and the profile's facts).

The targets (N = 32 at 50 ms: fleetops at least 1.5x faster than the Fabric script and pyinfra; N =
1 at 50 ms: at most 0.70 s) need only TARGET_TOOLS at those two sizes: `bench/run.py --targets` runs
just them. Node CPU per host is information, not a target: the floor row (one connection and one
exec of the node's Python, no work) is the least any tool of this shape can cost there.
"""

from __future__ import annotations

from benchpaths import LABEL, NCPU, TOOLS
from measure import Run, cpu_methods, med, per_host, rows_for


def analysis(runs: list[Run], medians: dict, args) -> str:
    """Where the time goes, from this run's numbers (the profile below has the detail)."""
    try:
        import profile_fleetops

        F = profile_fleetops.FACTS
    except ImportError:
        F = {}
    n, rtt = max(r.n for r in runs), max(r.rtt for r in runs)

    def rows(tool: str, nn: int = n, rr: float = rtt) -> list[Run]:
        return [r for r in runs if r.kind == "rep" and r.tool == tool and r.n == nn and r.rtt == rr]

    def cpu(tool: str, what: str, nn: int = n, rr: float = rtt) -> float:
        return med([getattr(r, what) for r in rows(tool, nn, rr)])

    if not rows("fo_pv") or not F:
        return ""
    L = [f"## Where the time goes (N = {n}, {rtt:g} ms; generated from this run's numbers)", ""]
    wall = medians[("fo_pv", n, rtt)]
    totals = {  # CPU of the tool's median run: client + nodes + proxy
        t: cpu(t, "client_cpu") + cpu(t, "node_cpu") + cpu(t, "proxy_cpu")
        for t, _ in TOOLS
        if (t, n, rtt) in medians
    }
    bound = totals["fo_pv"] / NCPU
    share = bound / wall if wall else 0.0
    verdict = (
        "**The wall time is mostly CPU time**"
        if share >= 0.8
        else "**The wall time is partly CPU time**"
        if share >= 0.4
        else "**The wall time is not CPU-bound**"
    )
    order = sorted(totals, key=totals.get)
    L.append(
        f"1. {verdict} (measured by {cpu_methods(rows('fo_pv'))}). fleetops `patch verify` took "
        f"{wall:.2f} s; that run used {cpu('fo_pv', 'client_cpu'):.2f} s of client CPU, "
        f"{cpu('fo_pv', 'node_cpu'):.2f} s of node CPU and {cpu('fo_pv', 'proxy_cpu'):.2f} s in "
        f"the delay proxy: {bound:.2f} s of work for {NCPU} cores ({share:.0%} of the wall time; "
        f"the machine as a whole was busy {cpu('fo_pv', 'busy_cpu'):.2f} "
        "CPU-s). Per tool, wall / CPU bound: "
        + "; ".join(
            (
                f"{LABEL[t].split(' (')[0]} {medians[(t, n, rtt)]:.2f} s wall / "
                f"{totals[t] / NCPU:.2f} s bound"
            )
            for t in totals
        )
        + ". Total CPU (client + nodes + proxy), least first: "
        + ", ".join(f"{LABEL[t].split(' (')[0]} {totals[t]:.2f} s" for t in order)
        + (
            f". The lab's {n} nodes run their sshd, login shells "
            f"and commands on the client's own {NCPU} cores"
        )
        + (
            f"; at 0 ms fleetops took {medians[('fo_pv', n, 0.0)]:.2f} s, so the {rtt:g} ms RTT "
            f"added {wall - medians[('fo_pv', n, 0.0)]:.2f} s."
            if rtt and ("fo_pv", n, 0.0) in medians
            else "."
        )
    )
    per_host = {t: cpu(t, "node_cpu") / n for t, _ in TOOLS if rows(t)}
    L.append(
        "2. **Node CPU per host:** "
        + ", ".join(f"{LABEL[t].split(' (')[0]} {v:.2f} s" for t, v in per_host.items())
        + f". fleetops' = one SSH connection ({F['connect_node_cpu']:.3f} s on an idle node) + 1 "
        "exec (the agent, serving every request of the chain), "
        + (
            (
                "paying once the login shell's rc files "
                f"({F['shell_rc']:.3f} s here: root's ~/.bashrc), "
            )
            if F["exec_true_node_cpu"] >= F["shell_rc"] / 2
            else "the login shell without its rc files (an exec of `true` costs "
            f"{F['exec_true_node_cpu']:.3f} s of node CPU, so the lab's sessions do not "
            f"source root's ~/.bashrc, {F['shell_rc']:.3f} s locally), "
        )
        + f"the node python's start ({F['python_startup']:.3f} s) and the agent "
        f"({F['agent_patch_own']:.3f} s for "
        f"patch, {F['agent_verify_own']:.3f} s for verify "
        "as the agent reports it; `-X importtime` counts "
        f"{F['agent_imports']:.3f} s of imports in a verify call). On an idle node one agent exec "
        f"costs {F['agent_patch_node_cpu']:.3f}/{F['agent_verify_node_cpu']:.3f} "
        "s of node CPU against "
        f"{F['exec_true_node_cpu']:.3f} s for `true`; with "
        f"{n} nodes sharing {NCPU} cores each costs more. "
        "The peers run 3 execs per host but only "
        "grep/patch/py_compile in them; Ansible runs a Python module "
        "(AnsiballZ) per task."
    )
    fo1 = medians.get(("fo_pv", 1, rtt))
    tl = F.get("timelines", {}).get(f"{rtt:g}/1")
    if fo1 and tl:
        L.append(
            f"3. **One host at {rtt:g} ms takes {fo1:.2f} "
            "s** (median above; the N = 1 target at 50 ms is "
            f"0.70 s): start-up {tl['imports']:.2f} s "
            "to the end of the imports (plus ~0.04 s interpreter start), connect "
            f"{tl['connect_med']:.2f} s, "
            f"the agent's calls {tl['exec_med']:.2f} s (one "
            "exec; patch and verify pipelined on it, node time "
            f"included), exit at {tl['exit']:.2f} s. What is "
            "left on this path is the client's start-up (mostly "
            "importing Fabric, Invoke, paramiko and rich) and the SSH handshake's round trips."
        )
    if F.get("pyspy"):
        top = sorted(F["pyspy"].items(), key=lambda kv: -kv[1])[:4]
        L.append(
            f"4. **Client side** (fleetops at N = {n}: {cpu('fo_pv', 'client_cpu'):.2f} s CPU, "
            f"peak RSS {max(r.maxrss_kb for r in rows('fo_pv')) / 1024:.0f} "
            "MB): Python-level CPU by area "
            + ", ".join(f"{a} {v:.2f} s" for a, v in top)
            + " (py-spy, section 3 below)."
        )
    L.append("")
    return "\n".join(L)


def _row(out: list[str], name: str, ok: bool | None, detail: str) -> None:
    word = {True: "**met**", False: "**missed**", None: "n/a"}[ok]
    out.append(f"| {name} | {word} | {detail} |")


def targets(runs: list[Run], cli: dict, medians: dict) -> list[str]:
    """The targets table, the node CPU per host (information), then the other checks."""
    out = ["## Targets (RTT 50 ms)", "", "| target | result | numbers |", "|---|---|---|"]
    fo = medians.get(("fo_pv", 32, 50.0))
    for tool, factor in (("fabric", 1.5), ("pyinfra", 1.5)):
        other = medians.get((tool, 32, 50.0))
        name = f"N = 32, 50 ms: ≥ {factor:g}× faster than {LABEL[tool].split(' (')[0]}"
        if fo is None or other is None:
            _row(out, name, None, "not measured")
        else:
            _row(
                out,
                name,
                other / fo >= factor,
                f"{other:.3f} s / fleetops {fo:.3f} s = {other / fo:.2f}×",
            )
    one = medians.get(("fo_pv", 1, 50.0))
    least = medians.get(("floor", 1, 50.0))
    _row(
        out,
        "N = 1, 50 ms: ≤ 0.70 s",
        None if one is None else one <= 0.70,
        "not measured"
        if one is None
        else f"{one:.3f} s"
        + (
            ""
            if least is None
            else f"; the floor script (stock paramiko, one exec of `python -c pass`) took "
            f"{least:.3f} s"
        ),
    )
    out.append("")
    out += node_cpu_note(runs)
    return out + checks(runs, cli, medians)


def node_cpu_note(runs: list[Run]) -> list[str]:
    """fleetops' node CPU per host at N = 32 / 50 ms against the floor's: information, not a
    target."""
    pv = rows_for(runs, "fo_pv", 32, 50.0)
    if not pv:
        return []
    node = med([r.node_cpu for r in pv]) / 32
    text = (
        "Node CPU per host (information, not a target), `patch verify --kinds grep,compile` at "
        f"N = 32, 50 ms: {node * 1e3:.1f} ms (median node CPU "
        f"{med([r.node_cpu for r in pv]):.2f} s / 32)"
    )
    floor = rows_for(runs, "floor", 32, 50.0)
    if floor:
        least = med([r.node_cpu for r in floor]) / 32
        text += (
            "; the floor in this run, 1 connection + 1 exec of the node's `python -c pass` and "
            f"no work: {least * 1e3:.1f} ms, so fleetops' own work (the agent's checks, imports "
            f"and both ops) costs {(node - least) * 1e3:.1f} ms"
        )
    return [text + ".", ""]


def checks(runs: list[Run], cli: dict, medians: dict) -> list[str]:
    """What else the run shows against a threshold (not targets): one exec and one connection per
    host, the Ansible ratio, the big fleet's client memory and CPU, the deep verify's time."""
    out = ["### Other checks", "", "| check | result | numbers |", "|---|---|---|"]
    fo_runs = [r for r in runs if r.tool in ("fo_pv", "fo_check") and r.kind in ("rep", "probe")]
    execs = [e for r in fo_runs for e in r.execs]
    _row(
        out,
        "execs per host for any task chain: 1 (`patch verify`, `patch --check`; sshd logs)",
        bool(execs) and set(execs) == {1} if execs else None,
        f"{per_host([execs])} per host over {len(execs)} host-runs",
    )
    conns = [c for r in fo_runs for c in r.conns]
    _row(
        out,
        "1 SSH connection per host",
        bool(conns) and set(conns) == {1} if conns else None,
        f"{per_host([conns])} per host over {len(conns)} host-runs",
    )
    fo, ansible = medians.get(("fo_pv", 32, 50.0)), medians.get(("ansible", 32, 50.0))
    name = f"N = 32, 50 ms: ≥ 10× faster than {LABEL['ansible'].split(' (')[0]}"
    if fo is None or ansible is None:
        _row(out, name, None, "not measured")
    else:
        _row(
            out,
            name,
            ansible / fo >= 10,
            f"{ansible:.3f} s / fleetops {fo:.3f} s = {ansible / fo:.2f}×",
        )
    big = [
        r for r in runs if r.kind == "rep" and r.tool == "fo_pv" and r.n >= 128 and r.rtt == 50.0
    ]
    if big:
        n = big[0].n
        rss = max(r.maxrss_kb for r in big) / 1024
        cpu = med([r.client_cpu for r in big]) / n
        _row(
            out,
            f"N = {n}, 50 ms: client peak RSS < 150 MB",
            rss < 150,
            f"max {rss:.0f} MB over {len(big)} runs",
        )
        _row(
            out,
            f"N = {n}, 50 ms: client CPU per host ≤ 15 ms",
            cpu <= 0.015,
            (
                f"{cpu * 1e3:.1f} ms (median client CPU "
                f"{med([r.client_cpu for r in big]):.2f} s / {n})"
            ),
        )
    else:
        _row(
            out,
            "N = 128, 50 ms: client peak RSS < 150 MB, client CPU per host ≤ 15 ms",
            None,
            "not in this run",
        )
    deep = [r.wall for r in cli.get("fo_deep", [])]
    _row(
        out,
        "deep `verify` on one node no slower than before (about 12 s)",
        med(deep) <= 12.5 if deep else None,
        f"{med(deep):.2f} s median of {len(deep)}" if deep else "not measured",
    )
    return out
