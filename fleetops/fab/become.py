"""--ask-become-pass: the sudo password for hosts with `become: sudo`, typed once per run."""

from __future__ import annotations

import getpass
import sys

from ..plans.options import BadValue
from ..redaction import register


def ask_become_pass() -> str:
    """Read at the terminal (or one line of stdin when there is none, as sudo -S reads it), never
    echoed; it is registered as a secret, so no report, evidence or audit line shows it."""
    if sys.stdin.isatty():
        password = getpass.getpass("BECOME password (sudo on the nodes): ")
    else:
        password = sys.stdin.readline().rstrip("\n")
    if not password or "\n" in password or "\r" in password:
        raise BadValue(
            "--ask-become-pass: no password was given (an empty line); type sudo's password at the "
            "prompt, or leave the flag out to run sudo with -n"
        )
    register(password)
    return password
