"""The audit log: one JSON line per task run on a host, appended on the operator's machine, and the
`history` view of it."""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
from pathlib import Path
from typing import Any

from .identity import operator
from .redaction import redact
from .results import Result


def log_path() -> Path:
    override = os.environ.get("FLEETOPS_AUDIT_LOG")
    if override:
        return Path(override)
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "fleetops" / "audit.jsonl"


def entry(result: Result, playbook: str | None, playbook_sha256: str | None) -> dict[str, Any]:
    return {"time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "operator": operator(),
            "host": result.host, "task": result.task, "playbook": playbook, "playbook_sha256": playbook_sha256,
            "result": result.status.value, "changed": result.changed, "duration_s": result.seconds,
            "exit_status": result.code, "msg": result.msg[:300]}


def append(record: dict[str, Any]) -> None:
    path = log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (redact(json.dumps(record, sort_keys=True)) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # one whole line per writer, even from parallel runs
        os.write(fd, line)
    finally:
        os.close(fd)


def read(host: str | None = None, last: int | None = None) -> list[dict[str, Any]]:
    try:
        lines = log_path().read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a torn line from a crashed writer must not hide the rest
        if host is None or rec.get("host") == host:
            out.append(rec)
    return out[-last:] if last else out
