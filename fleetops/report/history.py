"""`fab history`: the local audit log as a table, or as one JSON document."""

from __future__ import annotations

import json
import sys

from .. import audit
from ..redaction import redact
from .console import Reporter, render_table

HISTORY_COLUMNS = ["time", "operator", "host", "task", "playbook", "result", "changed", "duration_s", "msg"]


def show_history(host: str | None, last: int | None, as_json: bool) -> None:
    records = audit.read(host, last)
    if as_json:
        sys.stdout.write(redact(json.dumps(records, indent=1)) + "\n")
        return
    rows = [[str(r.get(c, "")) if c != "msg" else str(r.get(c, ""))[:60] for c in HISTORY_COLUMNS] for r in records]
    title = f"audit log {audit.log_path()}" + (f" (host {host})" if host else "")
    Reporter().console.print(render_table({"title": title, "columns": HISTORY_COLUMNS, "rows": rows}))
