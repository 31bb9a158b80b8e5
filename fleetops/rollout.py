"""How a run walks the fleet: every host runs its own chain of steps in order on its one connection;
hosts run concurrently (bounded by forks); a failing host stops only its own chain; with `serial`,
hosts go in batches and a batch with a failure stops the roll-out. A step that allows it
(Step.ahead: a read-only request fixed at plan time) is handed to the connector before the step
before it runs, so its request goes out right behind that step's (pipelining); a host whose chain is
over has its link closed at once. `running` (host -> the step it runs now) is what a second Ctrl-C,
which exits at once, writes to the audit log. Used by the `fab`/`fleet` executor and by fleetops.api
alike (both through run.execute)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from .plans.host import Host
from .plans.options import DEFAULT_FORKS
from .results import Result, Status
from .state import RunState
from .wire.connector import Pending, discard_quietly, fork_bound
from .wire.transports import fds_per_host

NOT_STARTED = "skipped: not started (interrupted by Ctrl-C)"
# A skipped step whose host has work left to do (its batch never started, or Ctrl-C came first): the
# re-run line and @failed name such hosts with the failed ones, or following them would leave these
# hosts as they were.
NOT_RUN = {"not_run": True}
# After Ctrl-C, tasks that poll (tail, gpu --wait) get this long to return on their own before the
# links close (FLEETOPS_INTERRUPT_GRACE_S overrides it: a slow link, or a test that needs a wide
# window).
INTERRUPT_GRACE_S = 1.0


@dataclass
class Step:
    name: str
    # run(host), or run(host, pending) when `ahead` handed its request over
    run: Callable[..., Result | None]
    # Sends the step's request ahead of its turn and returns the answer-to-be, or None when the step
    # cannot go ahead (tasks.registry.send_ahead: read-only on the node, one request fixed at plan
    # time).
    ahead: Callable[[Host], Pending | None] | None = None


def run_fleet(
    run: RunState,
    hosts: list[Host],
    steps: list[Step],
    forks: int = DEFAULT_FORKS,
    serial: int = 0,
    running: dict[str, str] | None = None,
) -> None:
    """`running`, when given, holds host -> the step it runs right now (for the second Ctrl-C's
    audit lines)."""
    running = {} if running is None else running
    batches = _batches(hosts, serial)
    stopped_by: int | None = None
    for number, batch in enumerate(batches, 1):
        if run.interrupted.is_set():
            _skip(run, batch, steps, NOT_STARTED)
            continue
        if stopped_by is not None:
            why = f"skipped: roll-out stopped after batch {stopped_by} had failures"
            _skip(run, batch, steps, why)
            continue
        if len(batches) > 1:
            run.reporter.note(f"batch {number}/{len(batches)}: {', '.join(h.name for h in batch)}")
        _run_batch(run, batch, steps, forks, running)
        names = {h.name for h in batch}
        if len(batches) > 1 and any(r.failed for r in run.results if r.host in names):
            stopped_by = number


def _batches(hosts: list[Host], serial: int) -> list[list[Host]]:
    """--serial N: the hosts N at a time, in order; 0: all at once."""
    if serial <= 0:
        return [hosts]
    return [hosts[i : i + serial] for i in range(0, len(hosts), serial)]


def _skip(run: RunState, batch: list[Host], steps: list[Step], why: str) -> None:
    """Every step of a batch that does not start, recorded as skipped with why."""
    for h in batch:
        for step in steps:
            run.record(Result(h.name, step.name, Status.SKIPPED, why, data=dict(NOT_RUN)))


def _run_batch(
    run: RunState, batch: list[Host], steps: list[Step], forks: int, running: dict[str, str]
) -> None:
    wanted = max(1, min(forks, len(batch)))
    workers, why = fork_bound(wanted, fds_per_host(batch, run.transport))
    if why:
        run.reporter.note(why)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_run_chain, run, h, steps, running) for h in batch]
        try:
            run.prepare_while_connecting()
        except Exception:  # only a head start: a host that needs it then does it itself
            pass
        links_closed = False
        # Each turn waits on the hosts still at work only: waiting on the whole batch put a waiter
        # on every finished future too, five times a second (a thousand of them at the end of a
        # 1,000-host batch).
        left = set(futures)
        while left:
            try:
                left = wait(left, timeout=0.2).not_done
            # no handler installed (run.execute installs one): same meaning
            except KeyboardInterrupt:
                run.interrupted.set()
            if run.interrupted.is_set() and not links_closed:
                run.reporter.interrupted()
                try:
                    wait(
                        left,
                        timeout=float(
                            os.environ.get("FLEETOPS_INTERRUPT_GRACE_S") or INTERRUPT_GRACE_S
                        ),
                    )
                # a second one (no handler installed): the links close now
                except KeyboardInterrupt:
                    pass
                links_closed = True
            if links_closed:
                # Running agent calls end now (each agent then stops cleanly on the node), and so
                # does a connect or SSH handshake in progress; again on every turn, for one that
                # began meanwhile.
                _close_links(run)
        for f in futures:
            f.result()


def _close_links(run: RunState) -> None:
    pool = run.pool
    for node in list(pool.nodes.values()) if pool is not None else []:
        try:
            node.close()
        except Exception:  # closing is best effort; the step reports "interrupted"
            pass


def _run_chain(run: RunState, host: Host, steps: list[Step], running: dict[str, str]) -> None:
    try:
        _walk_chain(run, host, steps, running)
    finally:
        _release(run, host)


def _walk_chain(run: RunState, host: Host, steps: list[Step], running: dict[str, str]) -> None:
    failed_at: str | None = None
    # step index -> its request, handed to the connector ahead of its turn
    sent: dict[int, Pending] = {}
    for index, step in enumerate(steps):
        pending = sent.pop(index, None)
        if run.interrupted.is_set():  # after Ctrl-C nothing starts, whatever came before it
            discard_quietly(pending)
            run.record(
                Result(host.name, step.name, Status.SKIPPED, NOT_STARTED, data=dict(NOT_RUN))
            )
            continue
        if failed_at:  # a step sent ahead changed nothing on the node: its answer is dropped
            discard_quietly(pending)
            run.record(
                Result(
                    host.name,
                    step.name,
                    Status.SKIPPED,
                    f"skipped: {failed_at} failed on this host",
                )
            )
            continue
        _hand_ahead(host, steps, index, sent)
        run.reporter.task_started(host.name, step.name)
        running[host.name] = step.name
        try:
            result = step.run(host, pending) if pending is not None else step.run(host)
        finally:
            running.pop(host.name, None)
        if isinstance(result, Result) and result.failed:
            failed_at = step.name
    for pending in sent.values():
        discard_quietly(pending)


def _hand_ahead(host: Host, steps: list[Step], index: int, sent: dict[int, Pending]) -> None:
    """The steps after this one that may go ahead, up to the first that may not: their requests go
    out right behind this step's, in chain order (the agent answers in request order), so the node
    starts on each while the client still waits for, or reads, the answer before it."""
    following = index + 1
    while following in sent:
        following += 1
    while following < len(steps) and steps[following].ahead is not None:
        pending = steps[following].ahead(host)  # type: ignore[misc]
        if pending is None:
            return
        sent[following] = pending
        following += 1


def _release(run: RunState, host: Host) -> None:
    """This host's chain is over: its agent and connection end now, not when the slowest host
    ends."""
    pool = run.pool
    if pool is None:
        return
    try:
        pool.release(host.name)
    except Exception:  # closing is best effort; the results are already recorded
        pass
