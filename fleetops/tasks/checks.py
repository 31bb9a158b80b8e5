"""verify: every check of the playbook in one agent exec, each with its evidence."""

from __future__ import annotations

from shlex import quote
from typing import TYPE_CHECKING

from ..plans.versions import judged_checks
from ..plans.yamlsrc import ConfigError
from ..results import Item, Next, Result, Status
from ..results.checks import Verification
from .declare import HELP_PLAYBOOK, JSON, HostTask, Option
from .plan import Plan, agent_error, unmet_warnings

if TYPE_CHECKING:
    from ..state import RunState


DEEP_KINDS = ("import", "callsites", "probe")


def _verify_plan(run: RunState, kwargs: dict) -> Plan:
    book = run.playbook(kwargs.get("playbook"))
    kinds = set(kwargs["kinds"].split(",")) if kwargs.get("kinds") else None
    request = book.verify_request(kinds)
    if any(c["kind"] in DEEP_KINDS for c in request["checks"]):
        # checks that import the node's packages: say when those do not fit together
        request["dists"] = True
    if not request["checks"]:
        raise ConfigError(
            book.path,
            None,
            f"playbook {book.name!r} has no checks"
            + (f" of kinds {sorted(kinds)}" if kinds else ""),
        )
    return Plan("verify", request, 900, book, options={"playbook": kwargs.get("playbook")})


def _interpret_verify(host: str, plan: Plan, answer: dict) -> Result:
    if answer.get("error"):
        return agent_error(host, "verify", answer, with_kind=True)
    answer = judged_checks(answer, bool(plan.playbook and plan.playbook.allow_prereleases))
    items = [_check_item(raw) for raw in answer["items"]]
    passed = sum(1 for i in items if i.status is Status.OK)
    status = Status.OK if passed == len(items) else Status.FAILED
    msg = f"{passed}/{len(items)} checks passed"
    # a grep failed while callsites and the probe passed: say which is stronger
    if answer.get("disagreement"):
        msg += f"; {answer['disagreement']}"
    warnings = unmet_warnings(answer.get("dists"))
    nxt = None
    if status is Status.FAILED:
        nxt = _verify_next(host, plan, [raw for raw in answer["items"] if not raw["ok"]])
    return Result(
        host,
        "verify",
        status,
        msg,
        items,
        data={"node_warnings": warnings} if warnings else {},
        payload=Verification(plan.playbook.name if plan.playbook else None, nxt),
    )


# What a check's item carries of the node's answer; a failing one also its stderr's last lines.
_CHECK_DETAILS = ("evidence", "matches", "proves", "cannot", "file", "details", "seconds")


def _check_item(raw: dict) -> Item:
    keys = _CHECK_DETAILS if raw["ok"] else (*_CHECK_DETAILS, "stderr_tail")
    details = {k: raw[k] for k in keys if raw.get(k)}
    label = f"{raw['name']} [{raw['kind']}]"
    return Item(label, Status.OK if raw["ok"] else Status.FAILED, raw["msg"], details)


def _verify_next(host: str, plan: Plan, failing: list[dict]) -> Next:
    """Failing version pins: another speculators or vLLM is installed, which patching cannot fix;
    any other failing check: the playbook's patch is missing, partly there or edited, which patch
    --check tells apart."""
    fab = f"fab -H {quote(host)}"
    book = (
        f" --playbook {quote(str(plan.options['playbook']))}"
        if plan.options.get("playbook")
        else ""
    )
    if any(raw["kind"] == "requires" for raw in failing):
        return Next(
            "the installed versions are not the ones the playbook pins: see what is installed "
            "(runbook new-version-landed)",
            [f"{fab} facts"],
        )
    return Next(
        "see whether the playbook's patch is missing, "
        "partly there or edited; then patch and prove it",
        [f"{fab} patch --check{book}", f"{fab} patch verify{book}"],
    )


TASKS = [
    HostTask(
        "verify",
        _verify_plan,
        _interpret_verify,
        op="verify",
        playbook_set=True,
        result=Verification,
        help="Run every check of the playbook on the node in one exec, with evidence.",
        options=(
            Option("playbook", HELP_PLAYBOOK),
            Option("kinds", "only these check kinds, e.g. grep,compile"),
            JSON,
        ),
    ),
]
