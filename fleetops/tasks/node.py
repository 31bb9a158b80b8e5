"""ping (is the agent there, under which python) and trust (add a host key the operator
verified)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..results import EXIT_FAILED, Result, Status
from ..results.node import Ping
from ..wire.connector import Connector
from .declare import JSON, HostTask, Option
from .plan import Plan

if TYPE_CHECKING:
    from ..state import RunState


def _ping_plan(run: RunState, kwargs: dict) -> Plan:
    return Plan("ping", {"modules": _imported_modules(run)}, 60, None)


def _imported_modules(run: RunState) -> list[str]:
    """The modules verify's importing checks name in the run's playbook: ping says (a warning) when
    verify would refuse to import them. No playbook, or a set of them: none (ping needs no
    playbook)."""
    from ..plans.yamlsrc import ConfigError

    try:
        checks = run.playbook().checks
    except (ConfigError, OSError):
        return []
    names: list[str] = []
    for check in checks:
        if check.get("kind") == "import":
            names.append(str(check.get("module")))
        elif check.get("kind") in ("callsites", "probe"):
            names += [*(check.get("modules") or []), *(check.get("packages") or [])]
    return [n for n in names if isinstance(n, str)]


def _interpret_ping(host: str, plan: Plan, answer: dict) -> Result:
    return Result(
        host,
        "ping",
        Status.OK,
        f"agent answers: python {answer['version']} at {answer['python']}",
        payload=Ping(answer["python"], answer["version"]),
    )


def _trust_plan(run: RunState, kwargs: dict) -> Plan:
    return Plan(
        "trust",
        {},
        30,
        None,
        options={"fingerprint": kwargs.get("fingerprint"), "replace": bool(kwargs.get("replace"))},
    )


def _run_trust(run: RunState, plan: Plan, node: Connector) -> Result:
    # Trusting is about the SSH host key itself, so it goes to the SSH connector, not through an
    # agent call.
    from ..wire.ssh import trust_host

    outcome, msg = trust_host(
        node.host, run.inventory, plan.options["fingerprint"], plan.options["replace"]
    )
    status = {"trusted": Status.CHANGED, "already": Status.OK}.get(outcome, Status.FAILED)
    return Result(
        node.host.name, "trust", status, msg, code=EXIT_FAILED if status is Status.FAILED else 0
    )


TASKS = [
    HostTask(
        "ping",
        _ping_plan,
        _interpret_ping,
        op="ping",
        result=Ping,
        help="Connect, run the node agent under the target python, report its version.",
    ),
    HostTask(
        "trust",
        _trust_plan,
        run=_run_trust,
        writes=True,
        help="Add a host's SSH key to known_hosts, only if it matches the fingerprint you name.",
        options=(
            Option("fingerprint", "the SHA256:... fingerprint you verified out of band"),
            Option(
                "replace",
                "the host's key changed (reimaged node): replace the old entry with the named one",
                False,
            ),
            JSON,
        ),
    ),
]
