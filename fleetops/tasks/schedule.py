"""schedule: the playbook's verification run by each node itself, every N minutes, into
node_exporter's textfile directory (docs/monitoring.md). The node installs a systemd timer, or a
crontab entry where systemd is not the init, that starts the verified agent as fleetops does
(remote_scripts/health/schedule.py): `--list` says what is installed where, by whom and since when;
`--remove` takes it away with the metrics it wrote."""

from __future__ import annotations

import re
from shlex import quote
from typing import TYPE_CHECKING

from ..plans.yamlsrc import ConfigError
from ..results import Item, Next, Result, Status
from ..wire.connector import Connector
from .checks import DEEP_KINDS
from .declare import HELP_PLAYBOOK, JSON, HostTask, Option
from .plan import Plan, UsageError, agent_error

if TYPE_CHECKING:
    from ..state import RunState

NAMES = ("verify",)
DEFAULT_EVERY = "15m"
DEFAULT_TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
_EVERY = re.compile(r"^(?P<n>[1-9][0-9]{0,4})(?P<unit>[mh]?)$")


def every_seconds(text: str) -> int:
    """`15m`, `1h`, `30` (minutes): a number of minutes dividing an hour, or of hours dividing a
    day, so that a crontab line and a systemd timer run at the same wall-clock times."""
    shape = _EVERY.match(text.strip())
    if shape is None:
        raise UsageError(f"schedule --every {text!r}: a number of minutes or hours, e.g. 15m or 1h")
    minutes = int(shape["n"]) * (60 if shape["unit"] == "h" else 1)
    if (minutes < 60 and 60 % minutes == 0) or (minutes % 60 == 0 and 24 % (minutes // 60) == 0):
        return minutes * 60
    raise UsageError(
        f"schedule --every {text}: minutes that divide "
        "an hour (1m, 5m, 10m, 15m, 30m) or hours that "
        "divide a day (1h, 2h, 3h, 6h, 12h, 24h)"
    )


def _plan(run: RunState, kwargs: dict) -> Plan:
    listing, removing, check = (
        bool(kwargs.get("list")),
        bool(kwargs.get("remove")),
        bool(kwargs.get("check")),
    )
    if listing and removing:
        raise UsageError("schedule: --list or --remove, not both")
    if listing:
        return Plan("schedule", {"action": "list"}, 60, None, options={"action": "list"})
    name = str(kwargs.get("what") or NAMES[0])
    if name not in NAMES:
        raise UsageError(f"schedule {name!r}: only {', '.join(NAMES)} can be scheduled on a node")
    if removing:
        return Plan(
            "schedule",
            {"action": "remove", "name": name, "check": check},
            120,
            None,
            check,
            options={"action": "remove", "name": name},
        )
    book = run.playbook(kwargs.get("playbook"))
    verify = book.verify_request(None)
    if not verify["checks"]:
        raise ConfigError(book.path, None, f"playbook {book.name!r} has no checks to schedule")
    if any(c["kind"] in DEEP_KINDS for c in verify["checks"]):
        verify["dists"] = True
    requests = [{"op": "patch", **book.patch_request(True)}] if book.patches else []
    requests.append({"op": "verify", **verify})
    every = every_seconds(str(kwargs.get("every") or DEFAULT_EVERY))
    folder = str(kwargs.get("textfile_dir") or DEFAULT_TEXTFILE_DIR)
    if not folder.startswith("/"):
        raise UsageError(f"schedule --textfile-dir {folder!r}: an absolute path on the nodes")
    return Plan(
        "schedule",
        {
            "action": "install",
            "name": name,
            "every_s": every,
            "textfile_dir": folder,
            "playbook": book.name,
            "requests": requests,
            "check": check,
        },
        120,
        book,
        check,
        options={"action": "install", "name": name, "playbook": kwargs.get("playbook")},
    )


def _run(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host.name
    answer, _ = node.call(plan.op, {**plan.request, "host": host}, timeout=plan.timeout)
    if answer.get("error"):
        result = agent_error(host, "schedule", answer, with_kind=True)
        if answer.get("error_kind") == "untrusted_target":
            result.data["next"] = Next(
                "the textfile directory must be root's or the login user's, writable by no "
                "one else; choose another with --textfile-dir",
                [f"fab -H {quote(host)} schedule verify --textfile-dir DIR"],
            ).to_data()
        return result
    action = plan.options["action"]
    if action == "list":
        return _listed(host, answer.get("schedules") or [])
    if action == "remove":
        return _removed(host, plan, answer)
    return _installed(host, plan, answer)


def _installed(host: str, plan: Plan, answer: dict) -> Result:
    every = f"every {int(answer['every_s']) // 60} min"
    where = (
        f"{answer['backend']} ({answer['scope']})"
        if answer.get("backend") == "systemd"
        else "crontab"
    )
    data = {
        k: answer.get(k)
        for k in (
            "backend",
            "scope",
            "textfile",
            "command",
            "every_s",
            "units",
            "cron_line",
            "since",
            "by",
        )
    }
    if not answer.get("changed"):
        return Result(host, "schedule", Status.OK, f"unchanged: {answer.get('why')}", data=data)
    verb = (
        ("would replace" if answer.get("replaced") else "would install")
        if plan.check
        else ("replaced" if answer.get("replaced") else "installed")
    )
    return Result(
        host,
        "schedule",
        Status.CHANGED,
        f"{verb} {plan.options['name']} in the {where}, {every}, writing {answer['textfile']}",
        data=data,
    )


def _removed(host: str, plan: Plan, answer: dict) -> Result:
    if not answer.get("changed"):
        return Result(host, "schedule", Status.OK, f"unchanged: {answer.get('why')}")
    removed = answer.get("removed") or []
    verb = "would remove" if plan.check else "removed"
    return Result(
        host,
        "schedule",
        Status.CHANGED,
        f"{verb} the {plan.options['name']} schedule: " + (", ".join(removed) or "its record"),
        data={"removed": removed, "record": answer.get("record")},
    )


def _listed(host: str, schedules: list[dict]) -> Result:
    items = []
    for s in schedules:
        state = (
            "installed"
            if s.get("as_installed")
            else ("edited by hand since" if s.get("installed") else "NOT installed any more")
        )
        items.append(
            Item(
                str(s.get("name")),
                Status.OK if s.get("as_installed") else Status.FAILED,
                f"{state}: every {int(s.get('every_s') or 0) // 60} min via {s.get('backend')} "
                f"({s.get('scope')}), by {s.get('by')} since {s.get('since')}, playbook "
                f"{s.get('playbook')}, writes {s.get('textfile')}",
                dict(s),
            )
        )
    status = Status.FAILED if any(i.status is Status.FAILED for i in items) else Status.OK
    msg = "; ".join(f"{i.label}: {i.msg}" for i in items) if items else "no schedule installed"
    result = Result(host, "schedule", status, msg, items, data={"schedules": schedules})
    if status is Status.FAILED:
        result.data["next"] = Next(
            "install it again as fleetops would (or remove it)",
            [f"fab -H {quote(host)} schedule verify", f"fab -H {quote(host)} schedule --remove"],
        ).to_data()
    return result


TASKS = [
    HostTask(
        "schedule",
        _plan,
        run=_run,
        writes=True,
        op="schedule",
        help="Have each node verify itself on a schedule (a systemd timer, or cron where systemd "
        "is absent): its metrics go\ninto node_exporter's textfile directory. --list: what "
        "is installed; --remove: take it away.",
        options=(
            Option(
                "what",
                "what to schedule: verify (the playbook's patch --check and checks)",
                "verify",
                positional=True,
            ),
            Option(
                "every",
                "how often: minutes dividing an hour or hours dividing a day (15m, 1h)",
                DEFAULT_EVERY,
            ),
            Option(
                "textfile_dir",
                "node_exporter's textfile directory on the nodes",
                DEFAULT_TEXTFILE_DIR,
            ),
            Option("list", "what is installed on each host, by whom, since when", False),
            Option("remove", "remove the schedule and the metrics it wrote", False),
            Option("check", "say what would be installed or removed; change nothing", False),
            Option("playbook", HELP_PLAYBOOK),
            JSON,
        ),
    ),
]
