"""The one way a run is made and carried out, for `fab`, `fleet` (fab/executor.py) and the library
(api.py) alike:

    # connects nothing:
    run = assemble(RunState(root, settings), ["@lab"], [("patch", {}), ("verify", {})])
    # walks the fleet:
    code = execute(run, forks=32, serial=0)

assemble() checks the hosts and builds each task's plan exactly once, before any connection;
execute() runs every host's chain (rollout.py), each step a direct call of tasks.registry.run_task.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from . import audit, startup
from .plans.host import Host, UnknownHost
from .plans.hostrange import expand as expand_range
from .plans.hostrange import fold as fold_names
from .plans.hostrange import is_range, natural_key, split_words
from .plans.options import OFF_WORDS, ON_WORDS
from .report.fold import FOLD_MIN_HOSTS, identities
from .report.rows import fleet_sections
from .results import EXIT_AUDIT, EXIT_FAILED, EXIT_INTERRUPTED, Result, Status, exit_status
from .rollout import DEFAULT_FORKS, Step, run_fleet
from .state import RunState
from .tasks.plan import UsageError
from .tasks.registry import plan_for, run_task, send_ahead
from .wire.connector import COUNTERS

__all__ = ["Run", "UsageError", "assemble", "execute", "rerun_command", "rerun_hosts"]

# in the project: the failed hosts of the last run, for @failed
LAST_FAILED = Path(".fleetops") / "last-failed"


@dataclass
class Run:
    state: RunState
    hosts: list[Host]
    steps: list[Step] = field(default_factory=list)


def assemble(
    state: RunState,
    hosts: list[str],
    tasks: list[tuple[str, dict[str, Any]]],
    *,
    limit: str = "",
    dry: bool = False,
) -> Run:
    """Hosts expanded (names, @groups, user@host, ranges such as lab[01-12], @failed: the hosts the
    last failed run named in .fleetops/last-failed), every task planned once, --limit applied;
    `dry`: every task in its check mode, or UsageError for one that has none. Raises ConfigError,
    UnknownHost or UsageError: then nothing has connected anywhere."""
    hosts = _with_failed(state.root, [w for chunk in hosts for w in split_words(chunk)])
    limit = ",".join(_with_failed(state.root, split_words(limit)))
    selected = state.inventory.expand(hosts)
    plans = [
        (name, plan_for(state, name, kwargs, dry=dry)) for name, kwargs in chain_options(tasks)
    ]
    steps = [
        Step(
            name, partial(run_task, state, name, plan), ahead=partial(send_ahead, state, name, plan)
        )
        for name, plan in plans
    ]
    if limit:  # names, globs, @group, !host (plans/inventory.py); UnknownHost when nothing is left
        selected = state.inventory.limit(selected, limit)
    state.selected = [h.name for h in selected]
    return Run(state, selected, steps)


# Options that name what the whole chain works on: given to any task of the command, every task uses
# it (`patch verify -p NEW.yaml` patches and verifies with NEW; Invoke parses an option into the
# task it follows).
CHAIN_OPTIONS = ("playbook",)


def chain_options(tasks: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """`tasks` with each CHAIN_OPTIONS value given to one task given to all; UsageError when two
    tasks give different values (which one would the chain use?)."""
    out = [(name, dict(kwargs)) for name, kwargs in tasks]
    for option in CHAIN_OPTIONS:
        given = list(dict.fromkeys(str(kw[option]) for _, kw in out if kw.get(option)))
        if len(given) > 1:
            flag = "--" + option.replace("_", "-")
            raise UsageError(
                f"{flag} given with different values ({', '.join(given)}): give it once, it "
                "applies to every task of the command"
            )
        for _, kw in out:
            if given and not kw.get(option):
                kw[option] = given[0]
    return out


def execute(
    run: Run,
    forks: int = DEFAULT_FORKS,
    serial: int = 0,
    *,
    view: bool = True,
    fold: bool | None = None,
    odd: bool = False,
    command: list[str] | None = None,
    reports: dict[str, str] | None = None,
) -> int:
    """Run every host's chain and return the exit status. `view`: the live view and, at the end, the
    recap (or the JSON document), as `fab` shows them; the library (api.py) returns the results
    instead. `fold`: hosts that answered the same shown once (None: when FOLD_MIN_HOSTS or more
    hosts run; the environment's FLEETOPS_FOLD=0/1 decides before that); `odd`: each minority group
    as a diff against the majority. `command`: the command line as typed (argv); when given, a run
    with failures ends with the command that re-runs only the failed hosts, also written to
    .fleetops/last-failed (`-H @failed`). `reports`: files to write the results to as well, by kind
    (`metrics`: Prometheus text, `junit`: JUnit XML)."""
    state = run.state
    reporter = state.reporter
    startup.release()  # planned: the program's start-up is over (startup.py)
    if view:
        _start_view(run, fold, odd)
    running: dict[str, str] = {}  # host -> the step it runs now (rollout.py)
    try:
        # The program's own Ctrl-C handling; a library caller's process keeps its handler (Python's
        # raises KeyboardInterrupt, which rollout.py takes as the same stop), and never exits from
        # under it.
        reporter.owns_ctrl_c = view
        with _interrupts(state, running) if view else nullcontext():
            run_fleet(state, run.hosts, run.steps, forks, serial, running)
        if state.interrupted.is_set():
            reporter.interrupted()
        reporter.live_stop()
        code = _exit_code(state, view, reports)
        if view:
            _finish_view(run, code, command)
    finally:
        reporter.live_stop()
        state.close()
    return code


_FOLD_WORDS = {**dict.fromkeys(ON_WORDS, True), **dict.fromkeys(OFF_WORDS, False)}


def _start_view(run: Run, fold: bool | None, odd: bool) -> None:
    """The live view's settings, then the view itself. A `fold` not given comes from
    FLEETOPS_FOLD, else from the number of hosts."""
    reporter = run.state.reporter
    if fold is None:
        fold = _FOLD_WORDS.get(os.environ.get("FLEETOPS_FOLD", "").strip().lower())
    if fold is None:
        fold = len(run.hosts) >= FOLD_MIN_HOSTS
    reporter.fold = fold
    reporter.odd = odd
    reporter.who = identities((h.name, h.address, h.port) for h in run.hosts)
    reporter.live_start([h.name for h in run.hosts])


def _exit_code(state: RunState, view: bool, reports: dict[str, str] | None) -> int:
    """The run's exit status: the results', then a missing audit line, a Ctrl-C, a report file not
    written, each overriding what it must."""
    code = exit_status(state.results)
    if state.audit_errors and not audit.optional():
        code = EXIT_AUDIT
    if state.interrupted.is_set():
        code = EXIT_INTERRUPTED
        if view:
            _say_what_was_done(state)
    if reports and not _write_reports(state, reports) and code == 0:
        # a timer's run whose file was not written must not look like a good one
        code = EXIT_FAILED
    return code


def _finish_view(run: Run, code: int, command: list[str] | None) -> None:
    """The recap (or the JSON document), the re-run command, the trace and audit notes."""
    state = run.state
    reporter = state.reporter
    tracing = bool(os.environ.get("FLEETOPS_TRACE"))
    extra: dict[str, Any] = {}
    if tracing or reporter.json_mode:
        extra["counters"] = COUNTERS.per_host
    if state.audit_errors:
        extra["audit_errors"] = state.audit_errors
    again, not_run = rerun_hosts(state.results)
    if not_run:
        extra["not_run_hosts"] = not_run
    rerun = rerun_command(command, again) if command and again else None
    if command is not None:
        _write_last_failed(state.root, again, rerun, code, [h.name for h in run.hosts])
    reporter.finish(
        state.results,
        code,
        extra or None,
        fleet_sections(state.results, fold=reporter.fold),
        rerun=rerun,
        rerun_label="re-run the failed and not-run hosts" if not_run else None,
    )
    if tracing and not reporter.json_mode:
        _trace_notes(state)
    if state.audit_errors:
        _audit_errors_line(state, code)


def _trace_notes(state: RunState) -> None:
    """FLEETOPS_TRACE: what each host cost in connections, execs and uploads, and whose agent was
    started before the program's start-up (wire/warmstart.py)."""
    for name, row in COUNTERS.per_host.items():
        state.reporter.note(
            f"trace {name}: {row['connections']} connections, {row['execs']} execs, "
            f"{row['uploads']} uploads"
        )
    for name in sorted(COUNTERS.early):
        state.reporter.note(f"trace {name}: its agent was started while the program started")


def _audit_errors_line(state: RunState, code: int) -> None:
    """Results the audit log did not take, and what that does to the exit status."""
    n, total = len(state.audit_errors), len(state.results)
    if audit.optional():
        then = f"the run keeps exit status {code} ({audit.OPTIONAL_ENV}=1)"
    else:
        then = f"exit status {code}; {audit.OPTIONAL_ENV}=1 runs on without the log"
    state.reporter.error(
        f"{n} of {total} results not recorded in the audit log {audit.log_path(state.root)}: {then}"
    )


def _write_reports(state: RunState, reports: dict[str, str]) -> bool:
    """The run's results written to each report file asked for; False (said on stderr) if one could
    not be."""
    import time

    from .report.files import write_atomically
    from .report.junit import junit_xml
    from .report.metrics import exposition

    written = True
    for kind, name in reports.items():
        if not name:
            continue
        path = Path(name).expanduser()
        text = (
            exposition(state.results, now=time.time())
            if kind == "metrics"
            else junit_xml(state.results)
        )
        try:
            write_atomically(path, text)
        except OSError as exc:
            written = False
            state.reporter.error(
                f"--{kind} {path}: not written ({exc.strerror or exc}); the results above stand. "
                f"Check that {path.parent} exists and this user may write it"
            )
    return written


@contextmanager
def _interrupts(state: RunState, running: dict[str, str] | None = None) -> Iterator[None]:
    """Ctrl-C: the first stops starting new work and interrupts the running agent calls (rollout.py
    closes the links; each agent on a node then unwinds cleanly); the second exits at once, after an
    audit line for each step still running (`running`: host -> step)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread can set a handler
        return

    def handler(signum: int, frame: object) -> None:
        if state.interrupted.is_set():
            os.write(
                2,
                b"\nsecond Ctrl-C: exiting now, without waiting for the nodes; each node's agent "
                b"stops its step on its own (one in the middle of a patch set puts back what it "
                b"wrote); the audit log has a line for each step left running\n",
            )
            _audit_left_running(state, dict(running or {}))
            os._exit(EXIT_INTERRUPTED)
        # the main thread says so (rollout.py), through the report's console
        state.interrupted.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _audit_left_running(state: RunState, running: dict[str, str]) -> None:
    """The second Ctrl-C's audit lines: the client leaves without the steps' results, and says
    so."""
    for host, task in sorted(running.items()):
        node = state.pool.nodes.get(host) if state.pool is not None else None
        see = (
            (
                "its agent puts back a set it had half-written; "
                f"fab -H {host} {task} --check shows each file"
            )
            if task in ("patch", "rollback")
            else "its agent stops the step where the interrupt finds it"
        )
        result = Result(
            host,
            task,
            Status.FAILED,
            f"second Ctrl-C: the client exited while {task} ran on {host}, "
            f"without its result; {see}",
            code=EXIT_INTERRUPTED,
            data={"error_kind": "interrupted"},
        )
        try:
            audit.append(
                audit.entry(result, None, None, getattr(node, "host", None), state.root), state.root
            )
        except OSError:
            pass  # exiting now: the intent line (patch, rollback) is already in the log


def _say_what_was_done(state: RunState) -> None:
    done = [
        r
        for r in state.results
        if r.data.get("error_kind") != "interrupted" and r.status is not Status.SKIPPED
    ]
    cut = [r for r in state.results if r.data.get("error_kind") == "interrupted"]
    never = [r for r in state.results if r.status is Status.SKIPPED]

    def names(rs: list) -> str:
        return ", ".join(f"{r.host}:{r.task}" for r in rs) or "none"

    print(
        f"interrupted (Ctrl-C): done: {names(done)}; interrupted while running: {names(cut)}; "
        f"not started: {names(never)}",
        file=sys.stderr,
    )


# ---------------------------------------------------------------- re-running the failed hosts
def rerun_hosts(results: list[Result]) -> tuple[list[str], list[str]]:
    """The hosts a re-run must cover: those that failed, and those with a step never run (a roll-out
    stopped by a failing batch, Ctrl-C), so following the re-run line leaves no host behind; and the
    latter alone."""
    failed = {r.host for r in results if r.failed}
    not_run = {r.host for r in results if r.data.get("not_run")} - failed
    return sorted(failed | not_run, key=natural_key), sorted(not_run, key=natural_key)


_HOST_FLAGS = ("-H", "--hosts")
# the failed hosts are named exactly; an old --limit would only narrow them
_DROPPED_FLAGS = ("--limit",)


def rerun_command(argv: list[str], failed: list[str]) -> str:
    """The command line `argv` (program name first) with its hosts replaced by the failed ones, as
    one range (`fab -H 'lab[07,19]' patch verify`), and its --limit dropped: pasted into a shell it
    re-runs every task of the command on those hosts only. Options and the ad-hoc `-- command` stay
    as they were."""
    hosts = fold_names(failed)
    # `python -m fabric` is fab too
    out = ["fleet" if argv and Path(argv[0]).name == "fleet" else "fab"]
    args = list(argv[1:])
    replaced = False
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":  # the ad-hoc command: nothing after it is an option of ours
            out.extend(args[i:])
            break
        flag, eq, value = word.partition("=")
        if flag in _HOST_FLAGS or (word.startswith("-H") and len(word) > 2):
            out += ["-H", hosts]
            replaced = True
            i += 1 if eq or (word.startswith("-H") and len(word) > 2) else 2
            continue
        if flag in _DROPPED_FLAGS:
            i += 1 if eq else 2
            continue
        out.append(word)
        i += 1
    if not replaced:
        out[1:1] = ["-H", hosts]
    return shlex.join(out)


def _write_last_failed(
    root: Path, failed: list[str], rerun: str | None, code: int, ran: list[str]
) -> None:
    """.fleetops/last-failed: the hosts of the last run that had failures (and those it left not
    run), as one range on the first line (what `-H @failed` reads), its re-run command as a comment.
    A run without failures takes the hosts it ran on out of the file (all of them gone: the file
    goes), so `fab -H @failed patch verify` that now succeeds empties it, and an unrelated run on
    other hosts leaves it as it was."""
    path = root / LAST_FAILED
    try:
        if not failed:
            if not path.exists():
                return
            lines = path.read_text().splitlines()
            first = next((x.strip() for x in lines if x.strip() and not x.startswith("#")), "")
            old = [n for w in split_words(first) for n in (expand_range(w) if is_range(w) else [w])]
            left = [n for n in old if n not in set(ran)]
            if not left:
                path.unlink(missing_ok=True)
            elif len(left) < len(old):
                path.write_text(
                    f"{fold_names(left)}\n# still failed in an "
                    "earlier run (the others succeeded since)\n"
                )
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{fold_names(failed)}\n# exit status {code}; re-run: {rerun or ''}\n")
    # the run's own outcome stands; the operator learns why @failed will not work
    except OSError as exc:
        print(
            f"note: {path} not written ({exc}); -H @failed will not name this run's failed hosts",
            file=sys.stderr,
        )


def _with_failed(root: Path, words: list[str]) -> list[str]:
    """`@failed` (or `!@failed` in --limit) → the hosts .fleetops/last-failed names."""
    out = []
    for word in words:
        bare = word.lstrip("!")
        if bare != "@failed":
            out.append(word)
            continue
        path = root / LAST_FAILED
        try:
            lines = [x.strip() for x in path.read_text().splitlines()]
        except FileNotFoundError:
            raise UnknownHost(
                f"@failed: {path} does not exist: the last run in this project had no failed "
                "hosts (or none has run yet); name the hosts with -H"
            ) from None
        except OSError as exc:
            raise UnknownHost(
                f"@failed: cannot read {path} ({exc}); name the hosts with -H"
            ) from None
        first = next((x for x in lines if x and not x.startswith("#")), "")
        if not first:
            raise UnknownHost(f"@failed: {path} names no hosts; name the hosts with -H")
        prefix = "!" if word.startswith("!") else ""
        out.extend(prefix + name for name in split_words(first))
    return out
