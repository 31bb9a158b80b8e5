"""No garbage collection while the `fab` program starts (issue 16).

Starting a run builds objects that live until it exits: the modules of Fabric, Invoke, paramiko and fleetops,
the parsed command line, config, inventory and plans (37,500 tracked objects when `fab -H lab01 patch verify`
is planned). Python's collector, counting allocations, walks them again and again while they are made (about
90 collections, 17-26 ms of CPU, nearly all before the first connection) and finds almost nothing to free
(about 500 unreachable objects). So the entry points (entry.py)
hold collection off until the run is planned, then `release()` moves everything built so far into the
permanent generation (gc.freeze) and turns collection back on: the run's own garbage (connections, answers,
results) is collected as before, and no later collection walks the start-up objects again.

Only what `hold()` turned off is turned back on: a library caller (api.py) or a host program that runs with
the collector off keeps it off."""

from __future__ import annotations

import gc

_held = False


def hold() -> None:
    """Collection off until release(); called first thing by the program's entry point."""
    global _held
    if gc.isenabled():
        gc.disable()
        _held = True


def release() -> None:
    """Start-up is over (the run is planned, or a task that is not a fleet run is about to start): what was
    built so far is kept out of every later collection, and collection is back on. Idempotent."""
    global _held
    if _held:
        _held = False
        gc.freeze()
        gc.enable()
