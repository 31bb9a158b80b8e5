"""How a run walks the fleet: every host runs its own chain of steps in order on its one connection;
hosts run concurrently (bounded by forks); a failing host stops only its own chain; with `serial`, hosts go
in batches and a batch with a failure stops the roll-out. Used by the `fab`/`fleet` executor and by
fleetops.api alike (both through run.execute)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from .plans.inventory import Host
from .results import Result, Status
from .state import RunState

DEFAULT_FORKS = 32
NOT_STARTED = "skipped: not started (interrupted by Ctrl-C)"
# After Ctrl-C, tasks that poll (tail, gpu --wait) get this long to return on their own before the links
# close (FLEETOPS_INTERRUPT_GRACE_S overrides it: a slow link, or a test that needs a wide window).
INTERRUPT_GRACE_S = 1.0


@dataclass
class Step:
    name: str
    run: Callable[[Host], Result | None]


def run_fleet(run: RunState, hosts: list[Host], steps: list[Step], forks: int = DEFAULT_FORKS,
              serial: int = 0) -> None:
    batches = [hosts[i: i + serial] for i in range(0, len(hosts), serial)] if serial > 0 else [hosts]
    stopped_by: int | None = None
    for number, batch in enumerate(batches, 1):
        if stopped_by is not None or run.interrupted.is_set():
            why = (NOT_STARTED if run.interrupted.is_set()
                   else f"skipped: roll-out stopped after batch {stopped_by} had failures")
            for h in batch:
                for step in steps:
                    run.record(Result(h.name, step.name, Status.SKIPPED, why))
            continue
        if len(batches) > 1:
            run.reporter.note(f"batch {number}/{len(batches)}: {', '.join(h.name for h in batch)}")
        _run_batch(run, batch, steps, forks)
        names = {h.name for h in batch}
        if len(batches) > 1 and any(r.failed for r in run.results if r.host in names):
            stopped_by = number


def _run_batch(run: RunState, batch: list[Host], steps: list[Step], forks: int) -> None:
    with ThreadPoolExecutor(max_workers=max(1, min(forks, len(batch)))) as pool:
        futures = [pool.submit(_run_chain, run, h, steps) for h in batch]
        links_closed = False
        while not all(f.done() for f in futures):
            try:
                wait(futures, timeout=0.2)
            except KeyboardInterrupt:  # no handler installed (run.execute installs one): same meaning
                run.interrupted.set()
            if run.interrupted.is_set() and not links_closed:
                wait(futures, timeout=float(os.environ.get("FLEETOPS_INTERRUPT_GRACE_S") or INTERRUPT_GRACE_S))
                _close_links(run)  # running agent calls end now; each agent then stops cleanly on the node
                links_closed = True
        for f in futures:
            f.result()


def _close_links(run: RunState) -> None:
    pool = run.pool
    for node in list(pool.nodes.values()) if pool is not None else []:
        try:
            node.close()
        except Exception:  # noqa: BLE001,S110 - closing is best effort; the step reports "interrupted"
            pass


def _run_chain(run: RunState, host: Host, steps: list[Step]) -> None:
    failed_at: str | None = None
    for step in steps:
        if run.interrupted.is_set():  # after Ctrl-C nothing starts, whatever came before it
            run.record(Result(host.name, step.name, Status.SKIPPED, NOT_STARTED))
            continue
        if failed_at:
            run.record(Result(host.name, step.name, Status.SKIPPED, f"skipped: {failed_at} failed on this host"))
            continue
        run.reporter.task_started(host.name, step.name)
        result = step.run(host)
        if isinstance(result, Result) and result.failed:
            failed_at = step.name
