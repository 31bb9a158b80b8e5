"""No garbage collection while the `fab` program starts.

Starting a run builds objects that live until it exits: the modules of Fabric, Invoke, paramiko and
fleetops, the parsed command line, config, inventory and plans (37,500 tracked objects when `fab -H
lab01 patch verify` is planned). Python's collector, counting allocations, walks them again and
again while they are made (about 90 collections, 17-26 ms of CPU, nearly all before the first
connection) and finds almost nothing to free (about 500 unreachable objects). So the entry points
(entry.py) hold collection off until the run is planned, then `release()` moves everything built so
far into the permanent generation (gc.freeze) and turns collection back on: the run's own garbage
(connections, answers, results) is collected as before, and no later collection walks the start-up
objects again.

Only what `hold()` turned off is turned back on: a library caller (api.py) or a host program that
runs with the collector off keeps it off.

Ctrl-C while the program starts (guard_interrupts) is one line and exit 130: no task has sent a
request before the run is planned (an agent started early on a live master, wire/warmstart.py, has
none and ends with this process), so there is nothing to wait for or put back. Python's own
handling would print a KeyboardInterrupt traceback from whichever import it lands in, or let Invoke
turn it into exit 1. From release() on, the run installs its own handler (run.py), and a local task
has Python's."""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Sequence

_held = False
EXIT_INTERRUPTED = 130  # results.py's; this module sits below it and imports nothing of fleetops
EXIT_READER_GONE = 141  # results.py's
VERSION_WORDS = (["--version"], ["-V"])  # the whole command line of a version question
_STARTING = b"\ninterrupted (Ctrl-C) while starting: no task ran on any host\n"


def _interrupted_while_starting(signum: int, frame: object) -> None:
    os.write(2, _STARTING)
    os._exit(EXIT_INTERRUPTED)


def guard_interrupts() -> None:
    """Ctrl-C from now until release(): one line on stderr, exit 130. Only the main thread can set a
    handler; a handler someone else set (a host program, a test runner) is left alone."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        _set(_interrupted_while_starting)


def _unguard_interrupts() -> None:
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        _set(signal.default_int_handler)


def _set(handler: object) -> None:
    try:
        signal.signal(signal.SIGINT, handler)  # type: ignore[arg-type]
    except ValueError:  # not the main thread: only the main thread sets handlers; it keeps its own
        pass


def hold() -> None:
    """Collection off until release(); called first thing by the program's entry point."""
    global _held
    if gc.isenabled():
        gc.disable()
        _held = True


def release() -> None:
    """Start-up is over (the run is planned, or a task that is not a fleet run is about to start):
    what was built so far is kept out of every later collection, and collection is back on; Ctrl-C
    is the run's or the task's again. Idempotent."""
    global _held
    _unguard_interrupts()
    if _held:
        _held = False
        gc.freeze()
        gc.enable()


def versions() -> list[str]:
    """What `fleet --version` prints: fleetops' version and those of Fabric, Paramiko and Invoke,
    read from the installed metadata (none of them imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("fleetops")
    except PackageNotFoundError:
        ours = "unknown (not installed: run scripts/setup, or pip install the wheel)"
    return [
        f"fleetops {ours}",
        *(
            f"{name} {version(dist)}"
            for name, dist in (("Fabric", "fabric"), ("Paramiko", "paramiko"), ("Invoke", "invoke"))
        ),
    ]


def asks_only_version(words: Sequence[str]) -> bool:
    """Whether the command line (after the program's name) is `--version` or `-V` and nothing
    else."""
    return list(words) in VERSION_WORDS


def print_versions() -> int:
    """versions() on stdout; the exit status (EXIT_READER_GONE when the reader left before reading
    them)."""
    data = "".join(f"{line}\n" for line in versions()).encode()
    try:
        while data:
            data = data[os.write(1, data) :]
    except BrokenPipeError:
        return EXIT_READER_GONE
    return 0
