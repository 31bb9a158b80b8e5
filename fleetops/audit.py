"""The audit log: one JSON line per task run on a host, appended on the operator's machine.

One log per project, never one per laptop: two checkouts (two fleets, or a lab beside the real fleet) must not
see each other's runs. It lives outside the checkout, keyed by the project's path:

    $XDG_STATE_HOME/fleetops/projects/<project dir name>-<12 hex of sha256(project path)>/audit.jsonl

($XDG_STATE_HOME defaults to ~/.local/state.) Outside the checkout because an audit log must survive
`git clean -xdf`, never be committed by accident, and be writable when the checkout is not; the directory name
starts with the project's own name and holds a `project` file naming its path, so an operator can find it
with `ls`. Moving the checkout starts a new log (the old one stays where it was). FLEETOPS_AUDIT_LOG=FILE
overrides the location (the tests use it; so can a team that wants one shared file)."""

from __future__ import annotations

import datetime as dt
import fcntl
import functools
import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .identity import operator
from .redaction import dumps, redact
from .results import Result, exit_status

if TYPE_CHECKING:  # only its fields are read; `history` need not load the YAML parsers
    from .plans.inventory import Host

LOG_NAME = "audit.jsonl"
_SOURCE = re.compile(r"(?P<path>.+):(?P<line>\d+)")


def project_root(start: Path | None = None) -> Path:
    """The project a local command works on, found as Fabric finds its fabfile: the nearest directory at or
    above `start` (the working directory) that holds fabfile.py; the working directory itself if none does."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "fabfile.py").exists() or (candidate / "fabfile" / "__init__.py").exists():
            return candidate
    return here


def project_dir(root: Path) -> Path:
    """This project's directory under the operator's state directory (see the module docstring)."""
    return _project_dir(str(root.absolute()), str(state_home()))


@functools.lru_cache(maxsize=64)
def _resolved(root_text: str) -> Path:
    # Cached: every result's audit line asks, and resolving a path walks it with one lstat per part
    # (~0.05 ms, twice per result: 512 times for `patch verify` at N=128; issue 16).
    return Path(root_text).resolve()


@functools.lru_cache(maxsize=64)
def _project_dir(root_text: str, home: str) -> Path:
    root = _resolved(root_text)
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", root.name) or "root"
    return Path(home) / "fleetops" / "projects" / f"{name}-{digest}"


def state_home() -> Path:
    """$XDG_STATE_HOME, or ~/.local/state; a relative value is ignored, as the XDG spec says."""
    value = os.environ.get("XDG_STATE_HOME", "")
    return Path(value) if os.path.isabs(value) else Path.home() / ".local" / "state"


def legacy_log() -> Path:
    """Where every checkout wrote before the log was per project: no longer written; `history` names it
    when this project's log is empty."""
    return state_home() / "fleetops" / LOG_NAME


def log_path(root: Path | None = None) -> Path:
    """The audit log of the project at `root` (found from the working directory when None), or
    FLEETOPS_AUDIT_LOG when it is set."""
    override = os.environ.get("FLEETOPS_AUDIT_LOG")
    if override:
        return Path(override).expanduser()
    return project_dir(root or project_root()) / LOG_NAME


def address(host: Host) -> str:
    """user@address:port, as the connection used it. No user when the inventory names none: then ssh_config
    (or the local user name) decides, and guessing here would put a wrong name into an audit record."""
    return f"{host.user + '@' if host.user else ''}{host.address}:{host.port}"


def inventory_file(host: Host) -> str | None:
    """The inventory file that defined the host; None for a -H address that is in no inventory."""
    match = _SOURCE.fullmatch(host.source or "")
    return match["path"] if match and not host.plain else None


def entry(result: Result, playbook: str | None, playbook_sha256: str | None, host: Host | None = None,
          root: Path | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "operator": operator(),
        "host": result.host, "address": address(host) if host else None,
        "inventory": inventory_file(host) if host else None,
        "project": str(_resolved(str(root.absolute()))) if root else None,
        "task": result.task, "playbook": playbook, "playbook_sha256": playbook_sha256,
        "result": result.status.value, "changed": result.changed, "duration_s": result.seconds,
        # What this task run returned, by the same rule that makes the process's exit status (a failed result
        # with no code of its own is 1), so that a failed verify is never logged as 0.
        # Masked before it is cut: a secret cut in half at character 300 would no longer match.
        "exit_status": exit_status([result]), "msg": redact(result.msg)[:300]}
    if host is not None and host.jump:
        record["jump"] = host.jump
    return record


_MADE: set[Path] = set()


def append(record: dict[str, Any], root: Path | None = None) -> None:
    path = log_path(root)
    if path.parent not in _MADE:  # once per process and directory, not once per result
        _make_log_dir(path, record)
    line = (dumps(record, sort_keys=True) + "\n").encode()  # masked as values, before JSON escapes them
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except FileNotFoundError:  # the directory went away since (removed by hand): make it again
        _make_log_dir(path, record)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # one whole line per writer, even from parallel runs
        os.write(fd, line)
    finally:
        os.close(fd)


def _make_log_dir(path: Path, record: dict[str, Any]) -> None:
    fresh = not path.parent.exists()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if fresh and not os.environ.get("FLEETOPS_AUDIT_LOG") and record.get("project"):
        # Names the project beside its log: the directory name alone is a hash.
        (path.parent / "project").write_text(record["project"] + "\n", encoding="utf-8")
    _MADE.add(path.parent)


def read(host: str | None = None, last: int | None = None, root: Path | None = None) -> list[dict[str, Any]]:
    try:
        lines = log_path(root).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a torn line from a crashed writer must not hide the rest
        if isinstance(rec, dict) and (host is None or rec.get("host") == host):
            out.append(rec)
    return out[-last:] if last else out
