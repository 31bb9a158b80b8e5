"""Option values, checked before anything is contacted: a value that is not what its option takes is
a usage error that names the option (`--lines 'abc' is not a whole number`), never an int() message
or a failed host."""

from __future__ import annotations

import re
from collections.abc import Mapping

# Whole-number options: the least (and greatest) value each takes. The run options are every host
# task's; the others belong to the tasks that declare them (fab/tasks.py, `numbers=`).
Range = tuple[int, int | None]
RUN_NUMBERS: dict[str, Range] = {"serial": (0, None), "forks": (1, None), "port": (1, 65535)}
DEFAULT_FORKS = 32  # hosts worked on at once when neither --forks nor fabric.yaml says
# how a yes-or-no environment variable (FLEETOPS_FOLD, FLEETOPS_EARLY_AGENTS) is read, lower-cased
ON_WORDS = frozenset({"1", "yes", "on", "true"})
OFF_WORDS = frozenset({"0", "no", "off", "false"})
# Fabric's core flags that fleetops reads, and fleet's own core flags
CORE_NUMBERS: dict[str, Range] = {
    **RUN_NUMBERS,
    "connect-timeout": (1, None),
    "command-timeout": (1, None),
}
# The environment's run options (plain `fab` has no other place before a task)
ENV_NUMBERS: dict[str, tuple[str, Range]] = {
    "FLEETOPS_SERIAL": ("serial", RUN_NUMBERS["serial"]),
    "FLEETOPS_FORKS": ("forks", RUN_NUMBERS["forks"]),
}
USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")  # the inventory's rule for `user:`
# the node agent's rule (remote_scripts/jobs/records.py)
JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,120}")


class BadValue(ValueError):
    """A value its option does not take; the message names the option, the value and what it
    takes."""


def whole(option: str, value: object, least: int = 0, most: int | None = None) -> int:
    """`value` as an int within [least, most], or BadValue naming `option` (as typed: `--lines`,
    `FLEETOPS_SERIAL`)."""
    text = str(value).strip()
    try:
        number = int(text)
    except ValueError:
        raise BadValue(f"{option} {text!r} is not a whole number") from None
    if number < least or (most is not None and number > most):
        span = f"from {least} to {most}" if most is not None else f"{least} or more"
        raise BadValue(f"{option} {number} is out of range: it takes {span}")
    return number


def configured_forks(environ: Mapping[str, str], settings: Mapping[str, object]) -> int:
    """How many hosts a run works on at once when its command line does not say: FLEETOPS_FORKS,
    else fabric.yaml's fleetops.forks (`settings`), else DEFAULT_FORKS; BadValue for a bad one (the
    environment's run options are all checked: a bad FLEETOPS_SERIAL too)."""
    forks = from_environment(environ).get("forks")
    if forks is not None:
        return forks
    if settings.get("forks") is not None:
        return whole("fleetops.forks (fabric.yaml)", settings["forks"], *RUN_NUMBERS["forks"])
    return DEFAULT_FORKS


def job_id(option: str, value: object) -> str:
    """A job id as the node agent takes it, with the blanks a copy and paste adds around it dropped;
    anything else is refused here, before a host is contacted, not by the node after connecting."""
    text = str(value).strip()
    if not JOB_ID.fullmatch(text):
        raise BadValue(
            f"{option} {str(value)!r} is not a job id (letters, digits, '.', '_', '-', at most "
            "120; `jobs` lists them)"
        )
    return text


def user(option: str, value: str) -> str:
    if not USER.fullmatch(value):
        raise BadValue(
            f"{option} {value!r} is not a login name (letters, "
            "digits, '_', '.', '-'; not starting with "
            "a digit or '-')"
        )
    return value


def from_environment(environ: Mapping[str, str]) -> dict[str, int]:
    """The run options the environment sets (FLEETOPS_SERIAL, FLEETOPS_FORKS), checked; empty ones
    are unset."""
    out: dict[str, int] = {}
    for var, (name, (least, most)) in ENV_NUMBERS.items():
        raw = environ.get(var, "").strip()
        if raw:
            out[name] = whole(var, raw, least, most)
    return out
