"""How a run walks the fleet: every host runs its own chain of steps in order on its one connection;
hosts run concurrently (bounded by forks); a failing host stops only its own chain; with `serial`, hosts go
in batches and a batch with a failure stops the roll-out. Used by the `fab`/`fleet` executor and by
fleetops.api alike (both through run.execute)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from .plans.inventory import Host
from .results import Result, Status
from .state import RunState

DEFAULT_FORKS = 32


@dataclass
class Step:
    name: str
    run: Callable[[Host], Result | None]


def run_fleet(run: RunState, hosts: list[Host], steps: list[Step], forks: int = DEFAULT_FORKS,
              serial: int = 0) -> None:
    batches = [hosts[i: i + serial] for i in range(0, len(hosts), serial)] if serial > 0 else [hosts]
    stopped_by: int | None = None
    for number, batch in enumerate(batches, 1):
        if stopped_by is not None:
            for h in batch:
                for step in steps:
                    run.record(Result(h.name, step.name, Status.SKIPPED,
                                      f"skipped: roll-out stopped after batch {stopped_by} had failures"))
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
        while not all(f.done() for f in futures):
            try:
                wait(futures, timeout=0.2)
            except KeyboardInterrupt:
                run.interrupted.set()  # tail detaches, --wait gives up; each host's chain ends cleanly
        for f in futures:
            f.result()


def _run_chain(run: RunState, host: Host, steps: list[Step]) -> None:
    failed_at: str | None = None
    for step in steps:
        if run.interrupted.is_set() and not failed_at:
            failed_at = "an interrupt (Ctrl-C)"
        if failed_at:
            run.record(Result(host.name, step.name, Status.SKIPPED, f"skipped: {failed_at} failed on this host"
                              if failed_at != "an interrupt (Ctrl-C)" else "skipped: interrupted (Ctrl-C)"))
            continue
        run.reporter.task_started(host.name, step.name)
        result = step.run(host)
        if isinstance(result, Result) and result.failed:
            failed_at = step.name
