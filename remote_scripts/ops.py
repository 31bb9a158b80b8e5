"""The node agent's entry and its manifest: which module implements each op and each role. The
bootstrap (core/bootstrap.py) starts the agent here; core/agent.py serves the session.

Each module declares its own ops and roles (core/registry.py: `@node_op(name, writes=...)`,
`@node_role(name)`); this module only says where each lives, with plain imports the import contracts
see (pyproject.toml, agent-layers: this manifest is the top floor, core the bottom one). A module is
imported the first time a request needs it, once per session, so an agent start loads only what it
serves."""

from __future__ import annotations

from .core import agent
from .core.registry import OPS, ROLES, Op

# typing.TYPE_CHECKING without importing typing: the agent's start-up imports only what it runs
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any


def _guard() -> ModuleType:
    from .health import guard

    return guard


def _verify() -> ModuleType:
    from .checks import checks

    return checks


def _gpu() -> ModuleType:
    from .health import gpu

    return gpu


def _preflight() -> ModuleType:
    from .health import preflight

    return preflight


def _start() -> ModuleType:
    from .jobs import start

    return start


def _status() -> ModuleType:
    from .jobs import status

    return status


def _tail() -> ModuleType:
    from .jobs import tail

    return tail


def _stop() -> ModuleType:
    from .jobs import stop

    return stop


def _adhoc() -> ModuleType:
    from .jobs import adhoc

    return adhoc


def _fetch() -> ModuleType:
    from .jobs import fetch

    return fetch


def _diagnose() -> ModuleType:
    from .health import diagnose

    return diagnose


def _capture() -> ModuleType:
    from .patch import capture

    return capture


def _slurm() -> ModuleType:
    from .jobs import slurm

    return slurm


def _shards() -> ModuleType:
    from .jobs import shards

    return shards


def _drain() -> ModuleType:
    from .health import drain

    return drain


def _keeper() -> ModuleType:
    from .jobs import keeper

    return keeper


def _extract() -> ModuleType:
    from .jobs import extract_hidden_states

    return extract_hidden_states


def _slurm_step() -> ModuleType:
    from .jobs import slurmstep

    return slurmstep


def _schedule() -> ModuleType:
    from .health import schedule

    return schedule


def _probe() -> ModuleType:
    from .checks import probe_fork

    return probe_fork


# op -> the module that declares it (ping is built into core/agent.py)
OP_MODULES: dict[str, Callable[[], ModuleType]] = {
    "patch": _guard,
    "rollback": _guard,
    "verify": _verify,
    "gpu": _gpu,
    "facts": _gpu,
    "preflight": _preflight,
    "job_start": _start,
    "job_status": _status,
    "jobs_list": _status,
    "job_tail": _tail,
    "job_logs": _tail,
    "job_stop": _stop,
    "run": _adhoc,
    "fetch_plan": _fetch,
    "diagnose": _diagnose,
    "capture": _capture,
    "slurm": _slurm,
    "shards": _shards,
    "drain": _drain,
    "undrain": _drain,
    "schedule": _schedule,
}
# role -> the module that declares it: the job keeper, the hidden-state extraction driver, the Slurm
# batch step, verify's probe, a scheduled verification (each a process of the same verified bytes,
# started through the bootstrap)
ROLE_MODULES: dict[str, Callable[[], ModuleType]] = {
    "wrap": _keeper,
    "extract": _extract,
    "slurm-step": _slurm_step,
    "probe": _probe,
    "scheduled": _schedule,
}


def _declared(
    name: str, modules: dict[str, Callable[[], ModuleType]], declared: dict, kind: str
) -> Any:
    """What the module named for `name` declares under that name, once it is imported; None for an
    unknown name."""
    load = modules.get(name)
    if load is None:
        return None
    module = load()
    if name not in declared:
        raise RuntimeError(f"{module.__name__} does not declare the {kind} {name!r}")
    return declared[name]


def find_op(name: str) -> Op | None:
    op: Op | None = _declared(name, OP_MODULES, OPS, "op")
    return op


def find_role(name: str) -> Callable[..., int] | None:
    role: Callable[..., int] | None = _declared(name, ROLE_MODULES, ROLES, "role")
    return role


def main() -> int:
    return agent.main(find_op, find_role)


def serve_and_exit() -> None:
    agent.serve_and_exit(find_op, find_role)
