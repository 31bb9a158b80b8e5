"""A runbook file the operator wrote that is not a runbook: one `file:line: message` error, never a
crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetops.plans.marks import ConfigError
from fleetops.plans.runbooks import parse

PATH = Path("runbooks/mine.md")


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        ("# no front matter\n", "runbooks/mine.md:1", "front matter"),
        ("---\ntitle: t\nsymptom: s\n", "runbooks/mine.md:1", "not closed"),
        (
            "---\ntitle: t\nsymptom: s\n---\n```console lab\n$ fab -H lab01 ping\n",
            "runbooks/mine.md",
            "not closed",
        ),
        (
            "---\ntitle: t\nsymptom: s\n---\n```console lab\nok\n```\n",
            "runbooks/mine.md:6",
            "before any `$ `",
        ),
    ],
)
def test_a_malformed_runbook_is_one_error_naming_file_and_line(text: str, where: str, says: str):
    with pytest.raises(ConfigError) as raised:
        parse(text, PATH)
    message = str(raised.value)
    assert message.startswith(where + ":") and says in message, message
    assert f"{PATH}:{PATH}" not in message and "\n" not in message
