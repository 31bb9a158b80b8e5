"""Patterns for values that later travel to a node as argv words or environment entries: one
definition for the inventory and the playbook's jobs, so both refuse the same things."""

from __future__ import annotations

import re

ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# No '..' path segment; only characters no shell or ssh treats specially.
_NO_DOTDOT = r"(?!.*(?:^|/)\.\.(?:/|$))"
REMOTE_PATH = re.compile(_NO_DOTDOT + r"[A-Za-z0-9._/+@-]{1,4096}")
# Job paths may also hold {placeholders}.
JOB_PATH = re.compile(_NO_DOTDOT + r"[A-Za-z0-9._/+@{}-]{1,4096}")


def one_line(text: str) -> bool:
    """An environment value must stay one line: a NUL or newline would split the node's env file."""
    return "\0" not in text and "\n" not in text
