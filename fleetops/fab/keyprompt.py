"""--prompt-for-passphrase, per key: Fabric asks once, up front, and offers that one passphrase to
every key, which breaks every host whose key is not encrypted. For a command that runs fleetops'
tasks the flag is taken from Fabric at parse time (take()), and the executor asks once for each key
file of the run that is encrypted (and not in ssh-agent, and without an identity_passphrase of its
own), after the hosts are known."""

from __future__ import annotations

import getpass
import sys
from typing import Any

from ..plans.options import BadValue
from ..redaction import register

_requested = False


def take(program: Any) -> None:
    """Called once the command line is parsed and checked: the flag becomes fleetops' (Fabric then
    asks nothing)."""
    global _requested
    args = program.args
    if "prompt-for-passphrase" in args and args["prompt-for-passphrase"].value:
        _requested = True
        args["prompt-for-passphrase"].value = False


def requested() -> bool:
    return _requested


def ask_key_passphrase(path: str, hosts: list[str]) -> str:
    """Read at the terminal (or one line of stdin when there is none, one per key in path order),
    never echoed; registered as a secret, so no report, evidence or audit line shows it."""
    shown = ", ".join(hosts[:3]) + (f" and {len(hosts) - 3} more" if len(hosts) > 3 else "")
    if sys.stdin.isatty():
        value = getpass.getpass(f"Passphrase for {path} (used by {shown}): ")
    else:
        sys.stderr.write(f"reading the passphrase for {path} (used by {shown}) from stdin\n")
        value = sys.stdin.readline().rstrip("\n")
    if not value:
        raise BadValue(
            f"--prompt-for-passphrase: no passphrase was given for {path}; type it at the "
            f"prompt, or load the key into ssh-agent (ssh-add {path})"
        )
    register(value)
    return value
