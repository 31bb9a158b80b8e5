"""The one job interface: launch, status, tail, logs, stop and list a host's jobs, whatever runs
them (the node itself over SSH, or a scheduler behind a login node). A host's backend is chosen
once, by `backend_for`; a job record the node lists names the backend that made it, read by
`backend_of_record`. Each backend registers itself when its module is imported (the package's
__init__ imports the built-in ones); a later registration is asked first, so a backend added at run
time needs no table edited."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from ...plans.host import Host
    from ...results import Item, Result
    from ...state import RunState
    from ...wire.connector import Connector
    from ..plan import Plan


class TailFollower(Protocol):
    """What a tail tells whoever follows along besides the reporter (the shard plan's fleet
    line)."""

    def attached(self, job_id: str) -> None: ...

    def line(self, progress: dict | None) -> None: ...


class JobBackend(ABC):
    """How one kind of host runs fleetops' jobs. Every method is one task on one host and returns
    its Result; node trouble is a Result, never raised."""

    # The inventory's `scheduler:` word for the hosts this backend serves, and the `scheduler` a job
    # record it made carries (None: plain SSH, no scheduler).
    scheduler: ClassVar[str | None] = None
    # Whether `extract --shards` splits the dataset across hosts (one shard per host, the fleet
    # manifest) rather than inside one host (a scheduler's job array of --shards N tasks).
    shards_by_host: ClassVar[bool] = True
    # Whether the host hands the job GPUs of other nodes (a scheduler's allocation): then `gpu` and
    # `diagnose` look there, and the host's own kernel log says nothing about the job's processes.
    allocates: ClassVar[bool] = False
    # The host in a message's words ("--shards all on a Slurm login node needs the number of
    # shards").
    host_words: ClassVar[str] = "an SSH node"

    def handles(self, host: Host) -> bool:
        """Whether this backend runs `host`'s jobs."""
        return host.scheduler == self.scheduler

    @abstractmethod
    def launch(self, run: RunState, plan: Plan, node: Connector) -> Result: ...

    @abstractmethod
    def status(self, run: RunState, plan: Plan, node: Connector) -> Result: ...

    @abstractmethod
    def tail(
        self, run: RunState, plan: Plan, node: Connector, follow: TailFollower | None = None
    ) -> Result: ...

    @abstractmethod
    def logs(self, run: RunState, plan: Plan, node: Connector) -> Result: ...

    @abstractmethod
    def stop(self, run: RunState, plan: Plan, node: Connector) -> Result: ...

    def list(self, run: RunState, plan: Plan, node: Connector) -> Result:
        """`jobs`: the node's job store lists every kind of job in one call (each row read by its
        own backend, `read_record`); a SLURM_* value of the inventory's env goes with it, for
        squeue/sacct."""
        env = {k: v for k, v in node.host.env_values if k.startswith("SLURM_")}
        request = {**plan.request, "scheduler_env": env} if env else plan.request
        answer, evidence = node.call(plan.op, request, timeout=plan.timeout)
        result = interpret_jobs_list(node.host.name, plan, answer)
        if result.failed:
            result.evidence = evidence
        return result

    def running_job(self, node: Connector) -> dict | None:
        """The job running (or starting) on the host now, as its record says, or None; a shard's
        extract leaves its own running job alone. A backend that does not shard by host is never
        asked."""
        return None

    def read_record(self, job: dict, now_ts: object) -> dict:
        """A job of the node's store with its state as `status` reads it (the node's own for an SSH
        job)."""
        return job

    def who(self, job: dict) -> str:
        """What runs the job, in the words of a diagnose line."""
        return f"pid {job.get('pid')}"

    def allocation_gpus(self, run: RunState, plan: Plan, node: Connector) -> Result | None:
        """`gpu` on an allocating host: the GPUs of its job's allocation (None: the host's own
        GPUs)."""
        return None

    def allocation_note(self, node: Connector) -> Item | None:
        """For `diagnose` on an allocating host: where fleetops' latest job runs, or None."""
        return None


_LOCK = threading.Lock()
_BACKENDS: list[JobBackend] = []


def register(backend: JobBackend) -> JobBackend:
    """Add `backend`, asked before every one registered earlier."""
    with _LOCK:
        _BACKENDS.insert(0, backend)
    return backend


def unregister(backend: JobBackend) -> None:
    with _LOCK:
        _BACKENDS[:] = [b for b in _BACKENDS if b is not backend]


def _registered() -> list[JobBackend]:
    """The backends registered so far, the shipped ones certainly among them. Hosts are worked on in
    threads: one may ask while another is still running this package's __init__ (which imports the
    backends' modules, and so registers them); importing the package here waits for that thread to
    finish it, so no thread sees the list before they are in it."""
    from .. import jobs  # noqa: F401

    with _LOCK:
        return list(_BACKENDS)


def backend_for(host: Host) -> JobBackend:
    """The one place a host's backend is chosen: the newest registered backend that handles it."""
    known = _registered()
    for backend in known:
        if backend.handles(host):
            return backend
    raise LookupError(f"host {host.name!r}: no job backend for scheduler {host.scheduler!r}")


def read_record(job: dict, now_ts: object) -> dict:
    """A job of the node's store as the backend that made it reads it."""
    return backend_of_record(job).read_record(job, now_ts)


def interpret_jobs_list(host: str, plan: Plan, answer: dict) -> Result:
    """The node's `jobs_list` answer as the `jobs` table, each row read by the backend that made its
    job."""
    from .listing import interpret

    return interpret(host, plan, answer, read_record)


def backend_of_record(job: dict) -> JobBackend:
    """The backend that made a job of the node's store (its `scheduler`), else the plain SSH one: a
    record whose kind no backend knows is shown as the node wrote it."""
    known = _registered()
    kind = job.get("scheduler")
    for backend in known:
        if backend.scheduler == kind:
            return backend
    return next(b for b in reversed(known) if b.scheduler is None)
