"""Every host task by name, and the one way a task runs on a host: plan (no network, once per run),
then the agent call(s), then a Result, recorded. Node trouble never raises out of here: it becomes a
result."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..agent.core.protocol import READ_ONLY_OPS
from ..plans.host import Host, MissingSecret
from ..plans.playbookset import PlaybookSet
from ..plans.yamlsrc import ConfigError
from ..results import EXIT_FAILED, EXIT_INTERRUPTED, Evidence, Result, Status
from ..wire.connector import Connector, Pending, TransportError, discard_quietly
from . import adhoc, authoring, checks, deferred, drain, gpu, node, oncall, patching, schedule
from .declare import HostTask
from .plan import Plan, TaskSpec, UsageError, agent_error

if TYPE_CHECKING:
    from ..state import RunState

# The task families: each of their tasks is one HostTask in the family's module (tasks/declare.py),
# and everything else (fab's task, --help, the API's options) is read from it. Adding a task to one
# of these modules is the whole of adding it. The jobs and diagnose are declared in deferred.py,
# which imports what they run on only when one of them runs: `patch verify` has no use for the jobs,
# Slurm, shards, diagnose modules and the plans behind them, ~20 ms of every start-up.
DECLARED_FAMILIES = (
    node,
    gpu,
    patching,
    checks,
    adhoc,
    drain,
    oncall,
    authoring,
    schedule,
    deferred,
)


@functools.cache
def declared_tasks() -> dict[str, HostTask]:
    """Every declared host task by name, in their families' order."""
    tasks: dict[str, HostTask] = {}
    for family in DECLARED_FAMILIES:
        for spec in family.TASKS:
            if spec.name in tasks:
                raise ValueError(f"host task {spec.name} is declared twice ({family.__name__})")
            tasks[spec.name] = spec
    return tasks


class _Tasks(Mapping[str, TaskSpec]):
    """Every host task by name, as a read-only mapping (the declarations, read on first use)."""

    def __getitem__(self, name: str) -> TaskSpec:
        return declared_tasks()[name]  # KeyError for a name that is no task, as a dict says it

    def __iter__(self) -> Iterator[str]:
        return iter(declared_tasks())

    def __len__(self) -> int:
        return len(declared_tasks())


TASKS: Mapping[str, TaskSpec] = _Tasks()

UNREACHABLE_KINDS = ("unreachable", "hostkey", "auth", "refused")


def plan_for(run: RunState, name: str, kwargs: dict[str, Any], *, dry: bool = False) -> Plan:
    """Raises ConfigError for a bad playbook or option, UsageError for --dry on a task without a
    check mode: before anything connects."""
    spec = TASKS[name]
    # a deferred family's result type is named, not imported (declare.ResultClass): read here, it
    # is imported and its payload kind registered (results.declare) for shape_of before any
    # result of the task exists
    getattr(spec, "result", None)
    if dry:
        if spec.dry is None:
            raise UsageError(
                f"{name} has no check mode, so --dry cannot be honoured; nothing was run"
            )
        if spec.dry == "check":
            kwargs = {**kwargs, "check": True}
    takes_set = name in SET_TASKS or getattr(spec, "playbook_set", False)
    book_set = run.playbook_set(kwargs.get("playbook")) if takes_set else None
    return spec.plan(run, kwargs) if book_set is None else _set_plan(run, spec, kwargs, book_set)


# The tasks that take a playbook set (-p DIR): each host runs them with the playbook its versions
# fit.
SET_TASKS = frozenset({"diagnose", "extract", "tail", "status"})


def _set_plan(run: RunState, spec: TaskSpec, kwargs: dict[str, Any], book_set: PlaybookSet) -> Plan:
    """The task planned once per playbook of the set (a playbook it cannot run keeps the reason
    instead)."""
    by: dict[str, Plan | str] = {}
    for book in book_set.books:
        try:
            by[book.name] = spec.plan(run, {**kwargs, "playbook": str(book.path)})
        except ConfigError as exc:
            by[book.name] = str(exc)
    plans = [p for p in by.values() if isinstance(p, Plan)]
    if not plans:
        raise ConfigError(
            book_set.path,
            None,
            f"no playbook of this set can {spec.name}: "
            + "; ".join(str(why) for why in by.values()),
        )
    first = plans[0]
    return Plan(first.op, {}, first.timeout, None, first.check, book_set=book_set, by_playbook=by)


def _choice(name: str, plan: Plan, host: str, installed: dict[str, str | None]) -> Plan | Result:
    """The plan of the one playbook whose requires the host's versions fit, or the host's
    refusal."""
    book_set = plan.book_set
    assert book_set is not None
    fits = book_set.fitting(installed)
    have = ", ".join(f"{p} {v or 'not installed'}" for p, v in installed.items())
    data = {"error_kind": "no_playbook", "installed": installed}
    if not fits:
        return Result(
            host,
            name,
            Status.FAILED,
            book_set.refusal(host, installed),
            code=EXIT_FAILED,
            data=data,
        )
    if len(fits) > 1:
        return Result(
            host,
            name,
            Status.FAILED,
            f"{len(fits)} playbooks in {book_set.path.name}/ fit {host} ({have}): "
            f"{', '.join(b.name for b in fits)}; their "
            "requires overlap: narrow them so that one fits",
            code=EXIT_FAILED,
            data=data,
        )
    chosen = plan.by_playbook[fits[0].name]
    if isinstance(chosen, str):
        return Result(
            host,
            name,
            Status.FAILED,
            f"{fits[0].name} fits {host} ({have}) but cannot {name}: {chosen}",
            code=EXIT_FAILED,
            data=data,
        )
    return chosen


def for_host(run: RunState, name: str, plan: Plan, node: Connector) -> Plan | Result:
    """A playbook set's plan made this host's: its installed versions asked once per run on its
    connection (the `facts` op, versions only), then the playbook they fit. Any other plan is its
    own."""
    book_set = plan.book_set
    if book_set is None:
        return plan
    host = node.host.name
    with book_set.lock:
        installed = book_set.installed.get(host)
    if installed is None:
        asked = [{"requirement": p, "package": p} for p in book_set.packages]
        answer, _ = node.call("facts", {"packages_only": True, "requires": asked}, timeout=60)
        if answer.get("error"):
            return agent_error(host, name, answer)
        found = {
            r.get("package"): r.get("found")
            for r in answer.get("requirements") or []
            if isinstance(r, dict)
        }
        installed = {
            p: str(found[p])[:64] if isinstance(found.get(p), str) else None
            for p in book_set.packages
        }
        with book_set.lock:
            book_set.installed[host] = installed
    return _choice(name, plan, host, installed)


def _known(name: str, plan: Plan, host: Host) -> Plan | None:
    """for_host without asking the node: the plan when this host's choice is already known (or there
    is none)."""
    if plan.book_set is None:
        return plan
    with plan.book_set.lock:
        installed = plan.book_set.installed.get(host.name)
    chosen = _choice(name, plan, host.name, installed) if installed is not None else None
    return chosen if isinstance(chosen, Plan) else None


def ahead_request(name: str, plan: Plan, host: Host) -> dict | None:
    """The request this step may send before the previous step's answer is in, or None: its op
    changes nothing on the node (protocol.READ_ONLY_OPS: if the step before fails, it ran for
    nothing and its answer is dropped), and the step is that one request, fixed at plan time (no
    polling loop, no request built from an earlier answer). gpu runs its own loop: one call of {}
    unless --wait polls or Slurm answers instead."""
    if plan.op not in READ_ONLY_OPS:
        return None
    spec = TASKS[name]
    if spec.run is None:
        return plan.request
    if name == "gpu" and not plan.options.get("wait"):
        # an allocating host answers gpu from its job's allocation instead
        from .jobs import backend_for

        return None if backend_for(host).allocates else {}
    if name == "jobs" and not any(k.startswith("SLURM_") for k, _ in host.env_values):
        return plan.request  # as run_jobs_list sends it: no SLURM_* value to add
    return None


def send_ahead(run: RunState, name: str, plan: Plan, host: Host) -> Pending | None:
    """Hand this step's request to the host's connector ahead of time (pipelining), when the step
    allows it (ahead_request); run_task(..., pending=) then reads its answer. Never raises: a step
    that cannot go ahead simply runs in its turn."""
    # a playbook set's step goes ahead once the host's playbook is known
    known = _known(name, plan, host)
    request = ahead_request(name, known, host) if known is not None else None
    if request is None:
        return None
    try:
        node = run.connections().get(host)
        # a connector without pipelining: every step in its turn
        submit = getattr(node, "submit", None)
        return submit(plan.op, request, timeout=plan.timeout) if submit is not None else None
    except Exception:  # the step then runs in its turn and reports whatever fails
        return None


class _SentAhead:
    """The host's connector as a task's own run() sees it when its one request was sent ahead: that
    call returns the answer already on its way; any other call goes to the connector as usual."""

    def __init__(self, node: Connector, op: str, request: dict, pending: Pending | None) -> None:
        self._node, self._op, self._request, self._pending = node, op, request, pending

    def call(self, op: str, request: dict, timeout: float = 300) -> tuple[dict, Evidence]:
        pending, self._pending = self._pending, None
        if pending is not None and op == self._op and request == self._request:
            return pending.result()
        if pending is not None:
            pending.discard()
        return self._node.call(op, request, timeout=timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)


class _NodeNotes:
    """What the node tidied on the way, kept from every answer a task receives: the agent adds
    `quarantined` (corrupt state files moved aside) and `removed_temp_files` (dead uploads' temp
    files) to any answer, whatever the op (remote_scripts/core/agent.py), so no task has to copy
    them itself."""

    def __init__(self) -> None:
        self.quarantined: list[dict] = []
        self.removed_temp_files: list[str] = []
        self.answers = 0
        # what the node let pass because the operator said so (--allow-insecure-venv)
        self.warnings: list[str] = []

    def seen(self, answer: object) -> None:
        self.answers += 1
        if not isinstance(answer, dict):
            return
        for moved in answer.get("quarantined") or ():
            if isinstance(moved, dict) and moved not in self.quarantined:
                self.quarantined.append(moved)
        for path in answer.get("removed_temp_files") or ():
            if isinstance(path, str) and path not in self.removed_temp_files:
                self.removed_temp_files.append(path)
        for text in answer.get("warnings") or ():
            if isinstance(text, str) and text not in self.warnings:
                self.warnings.append(text)

    def into(self, result: Result) -> None:
        if self.quarantined:
            result.data["quarantined"] = self.quarantined
        if self.removed_temp_files:
            result.data["removed_temp_files"] = self.removed_temp_files
        if self.warnings:  # after any the task itself found
            result.data["node_warnings"] = [*result.data.get("node_warnings", []), *self.warnings]


class _ObservedPending:
    def __init__(self, pending: Pending, notes: _NodeNotes) -> None:
        self._pending, self._notes = pending, notes

    def result(self) -> tuple[dict, Evidence]:
        answer, evidence = self._pending.result()
        self._notes.seen(answer)
        return answer, evidence

    def discard(self) -> None:
        self._pending.discard()


class _Observed:
    """The host's connector as a task's run() sees it: calls and submits go through, their answers
    pass by _NodeNotes on the way back."""

    def __init__(self, node: Connector, notes: _NodeNotes) -> None:
        self._node, self._notes = node, notes

    def call(self, op: str, request: dict, timeout: float = 300) -> tuple[dict, Evidence]:
        answer, evidence = self._node.call(op, request, timeout=timeout)
        self._notes.seen(answer)
        return answer, evidence

    def __getattr__(self, name: str) -> Any:
        # a connector without submit stays without it (getattr(node, "submit"))
        attr = getattr(self._node, name)
        if name != "submit":
            return attr

        def submit(op: str, request: dict, timeout: float = 300) -> _ObservedPending:
            return _ObservedPending(attr(op, request, timeout=timeout), self._notes)

        return submit


def run_on_host(
    run: RunState, name: str, plan: Plan, node: Connector, pending: Pending | None = None
) -> Result:
    """One task on one host; never raises for node trouble: it becomes a failed/unreachable Result.
    `pending`: its request, already sent ahead (send_ahead)."""
    started = time.monotonic()
    host = node.host.name
    spec = TASKS[name]
    notes = _NodeNotes()
    book_set = plan.book_set
    try:
        chosen = for_host(run, name, plan, node)
        if isinstance(chosen, Result):
            discard_quietly(pending)
            chosen.seconds = round(time.monotonic() - started, 3)
            return chosen
        plan = chosen
        if spec.run is not None:
            ahead = ahead_request(name, plan, node.host) if pending is not None else None
            if pending is not None and ahead is not None:
                node = _SentAhead(node, plan.op, ahead, pending)  # type: ignore[assignment]
            elif pending is not None:
                pending.discard()
            result = spec.run(run, plan, _Observed(node, notes))  # type: ignore[arg-type]
        else:
            answer, evidence = (
                pending.result()
                if pending is not None
                else node.call(plan.op, plan.request, timeout=plan.timeout)
            )
            notes.seen(answer)
            assert spec.interpret is not None, f"{name}: a task declares run or interpret"
            result = spec.interpret(host, plan, answer)
            if result.failed:
                result.evidence = evidence
    except Exception as exc:  # a bug for one host must not take the fleet down
        result = _failure(run, host, name, exc, answered=notes.answers > 0)
    notes.into(result)
    result.seconds = round(time.monotonic() - started, 3)
    if plan.playbook is not None:
        result.data.setdefault("playbook", plan.playbook.name)
        result.data.setdefault("playbook_sha256", plan.playbook.sha256)
    # chosen by the host's versions: the report says which
    if book_set is not None and plan.playbook is not None:
        have = ", ".join(f"{p} {v}" for p, v in book_set.installed.get(host, {}).items())
        result.data["chosen_playbook"] = (
            f"{plan.playbook.name} (from {book_set.path.name}/, for {have})"
        )
    return result


def _failure(run: RunState, host: str, name: str, exc: Exception, answered: bool = False) -> Result:
    """`answered`: the node had answered when exc was raised (an answer the task could not read: the
    node's python is not running the fleetops agent, or a fleetops bug)."""
    if run.interrupted.is_set() and isinstance(exc, TransportError) and exc.kind == "interrupted":
        return Result(
            host,
            name,
            Status.FAILED,
            "interrupted (Ctrl-C) while connecting to it: nothing ran there",
            code=EXIT_INTERRUPTED,
            data={"error_kind": "interrupted", "connected": False},
        )
    # our own Ctrl-C closed the link under the call: say so, not "lost"
    if run.interrupted.is_set():
        return Result(
            host,
            name,
            Status.FAILED,
            "interrupted (Ctrl-C) while running: the node's agent stops the "
            "step where the interrupt finds it and releases its lock (a job it had launched keeps "
            "running)",
            evidence=getattr(exc, "evidence", None),
            code=EXIT_INTERRUPTED,
            data={"error_kind": "interrupted"},
        )
    if isinstance(exc, TransportError):
        status = Status.UNREACHABLE if exc.kind in UNREACHABLE_KINDS else Status.FAILED
        return Result(
            host,
            name,
            status,
            str(exc),
            evidence=exc.evidence,
            code=EXIT_FAILED,
            data={"error_kind": exc.kind},
        )
    # this host's secret_from_env is unset: only its tasks that need it fail
    if isinstance(exc, MissingSecret):
        return Result(
            host, name, Status.FAILED, str(exc), code=EXIT_FAILED, data={"error_kind": "secret"}
        )
    if answered and isinstance(exc, (KeyError, TypeError, ValueError, AttributeError, IndexError)):
        return Result(
            host,
            name,
            Status.FAILED,
            f"{host}'s answer to {name} is malformed ({type(exc).__name__}: "
            f"{exc}); is the fleetops agent what runs there? "
            "Check the host's python in the inventory "
            "(if it is, this is a fleetops bug: please report it)",
            evidence=Evidence("(client)", None, []),
            code=EXIT_FAILED,
            data={"error_kind": "malformed"},
        )
    return Result(
        host,
        name,
        Status.FAILED,
        f"internal error: {type(exc).__name__}: {exc}",
        evidence=Evidence("(client)", None, []),
        code=EXIT_FAILED,
    )


def run_task(
    run: RunState, name: str, plan: Plan, host: Host, pending: Pending | None = None
) -> Result:
    """The step of a host chain: the host's one connection, the task, the result recorded (and
    shown). `pending`: its request, sent ahead by send_ahead while the step before it ran."""
    try:
        node = run.connections().get(host)
    except Exception as exc:  # e.g. a bad ssh_config for this host: its result, not a crash
        result = _failure(run, host.name, name, exc)
    else:
        result = run_on_host(run, name, plan, node, pending)
    run.record(result)
    return result
