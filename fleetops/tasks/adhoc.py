"""run: an ad-hoc shell command on every selected host (`fab -H @lab run "uname -a"`, and Fabric's
own `fleet -H lab01 -- uname -a`), through the same inventory, host keys, agent and audit log as
every task.

The command is the operator's own text; it travels inside the agent's JSON request (never on the SSH
command line) and the node runs it with /bin/sh -c (remote_scripts/jobs/adhoc.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..results import EXIT_FAILED, Result, Status
from ..results.adhoc import CommandOutput
from .declare import JSON, HostTask, Option
from .plan import Plan, UsageError, agent_error

if TYPE_CHECKING:
    from ..state import RunState

DEFAULT_TIMEOUT = 300


def _run_plan(run: RunState, kwargs: dict) -> Plan:
    command = kwargs.get("command")
    if not isinstance(command, str) or not command.strip():
        raise UsageError(
            'run needs a command: fab -H lab01 run "uname -a" (or: fleet -H lab01 -- uname -a)'
        )
    try:
        timeout = float(kwargs.get("timeout") or DEFAULT_TIMEOUT)
    except ValueError:
        raise UsageError(
            f"run --timeout {kwargs.get('timeout')!r}: not a number of seconds"
        ) from None
    # The client waits a little longer than the node, so a timeout is the node's clear answer, not a
    # lost link.
    return Plan(
        "run",
        {"command": command, "timeout": timeout},
        timeout + 60,
        None,
        options={"command": command},
    )


def _joined(answer: dict, stream: str) -> str:
    """A stream as the node kept it: its head, then (when the middle was dropped) one line saying
    how much, then its tail (remote_scripts/jobs/adhoc.py keeps both ends, never all of it)."""
    head, dropped = str(answer.get(stream) or ""), int(answer.get(f"{stream}_dropped_bytes") or 0)
    if not dropped:
        return head
    tail = str(answer.get(f"{stream}_tail") or "")
    sep = "" if not head or head.endswith("\n") else "\n"
    return f"{head}{sep}… {dropped:,} bytes dropped …\n{tail}"


def _interpret_run(host: str, plan: Plan, answer: dict) -> Result:
    if answer.get("error"):
        return agent_error(host, "run", answer)
    code = answer["exit_code"]
    command = plan.options["command"]
    output = CommandOutput(
        command,
        code,
        _joined(answer, "stdout"),
        _joined(answer, "stderr"),
        answer["timed_out"],
        answer["stdout_dropped_bytes"],
        answer["stderr_dropped_bytes"],
    )
    if answer["timed_out"]:
        return Result(
            host,
            "run",
            Status.FAILED,
            f"{command!r}: timed out after {answer['timeout']:g}s "
            "(killed); raise --timeout if it needs longer",
            code=EXIT_FAILED,
            payload=output,
        )
    if code != 0:
        return Result(
            host,
            "run",
            Status.FAILED,
            f"{command!r}: exit {code}",
            code=EXIT_FAILED,
            payload=output,
        )
    return Result(host, "run", Status.OK, f"{command!r}: exit 0", payload=output)


TASKS = [
    # a shell command has no check mode
    HostTask(
        "run",
        _run_plan,
        _interpret_run,
        writes=True,
        op="run",
        result=CommandOutput,
        help="Run a shell command on every host (/bin/sh -c on the node), output prefixed by host, "
        "exit code each.",
        options=(
            Option(
                "command",
                "the shell command, as you would type it on the node (quote it)",
                required=True,
            ),
            Option(
                "timeout",
                "seconds before the command is killed (default 300; -T N sets it for the run)",
                numbers=(1, None),
            ),
            JSON,
        ),
    ),
]
