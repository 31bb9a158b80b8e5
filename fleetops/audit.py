"""The audit log: one JSON line per task run on a host, appended on the operator's machine.

One log per project, never one per laptop: two checkouts (two fleets, or a lab beside the real
fleet) must not see each other's runs. It lives outside the checkout, keyed by the project's path:

    $XDG_STATE_HOME/fleetops/projects/<project dir name>-<HASH>/audit.jsonl

(HASH: the first 12 hex digits of the sha256 of the project's path.)

($XDG_STATE_HOME defaults to ~/.local/state.) Outside the checkout because an audit log must survive
`git clean -xdf`, never be committed by accident, and be writable when the checkout is not; the
directory name starts with the project's own name and holds a `project` file naming its path, so an
operator can find it with `ls`. Moving the checkout starts a new log (the old one stays where it
was). FLEETOPS_AUDIT_LOG=FILE overrides the location (the tests use it; so can a team that wants one
shared file).

A log that cannot lie: each record is one whole line or nothing. The file is opened without
following a symlink (O_NOFOLLOW) and used only when it is a regular file with one link, owned by the
operator or root and not writable by others, so a log in a shared directory cannot be swapped for a
link to a file root must not append to. Each record starts on a fresh line (a line torn by an older
writer or a crash gets its newline first), the write is looped until every byte is out, and a write
that fails part way (a full disk) is cut back to the size the file had, so every earlier line stays
parseable. A record that could not be written raises AuditError; the run then exits EXIT_AUDIT
(results.py) unless FLEETOPS_AUDIT_OPTIONAL=1."""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import functools
import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .identity import login, operator
from .redaction import dumps, shown, shown_value
from .results import Result, exit_status

if TYPE_CHECKING:  # only its fields are read; `history` need not load the YAML parsers
    from .plans.host import Host

LOG_NAME = "audit.jsonl"
# =1: a run whose audit line could not be written keeps its own status
OPTIONAL_ENV = "FLEETOPS_AUDIT_OPTIONAL"
# O_RDWR: the last byte is read to know whether the file ends a line (and a FIFO put in the log's
# place opens without waiting for a reader, then is refused as not a regular file). O_NONBLOCK: nor
# does a device wait.
_OPEN_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class AuditError(OSError):
    """The audit line was not written (refused file, full disk, ...): the message says why and what
    to do."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def optional() -> bool:
    """The operator chose to run on when the audit log cannot be written
    (FLEETOPS_AUDIT_OPTIONAL=1)."""
    return os.environ.get(OPTIONAL_ENV, "").strip().lower() in ("1", "yes", "true", "on")


_SOURCE = re.compile(r"(?P<path>.+):(?P<line>\d+)")


def project_root(start: Path | None = None) -> Path:
    """The project a local command works on, found as Fabric finds its fabfile: the nearest
    directory at or above `start` (the working directory) that holds fabfile.py; the working
    directory itself if none does."""
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
    # (~0.05 ms, twice per result: 512 times for `patch verify` at N=128).
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
    """Where every checkout wrote before the log was per project: no longer written; `history` names
    it when this project's log is empty."""
    return state_home() / "fleetops" / LOG_NAME


def log_path(root: Path | None = None) -> Path:
    """The audit log of the project at `root` (found from the working directory when None), or
    FLEETOPS_AUDIT_LOG when it is set."""
    override = os.environ.get("FLEETOPS_AUDIT_LOG")
    if override:
        return Path(override).expanduser()
    return project_dir(root or project_root()) / LOG_NAME


def address(host: Host) -> str:
    """user@address:port, as the connection used it. No user when the inventory names none: then
    ssh_config (or the local user name) decides, and guessing here would put a wrong name into an
    audit record."""
    return f"{host.user + '@' if host.user else ''}{host.address}:{host.port}"


def inventory_file(host: Host) -> str | None:
    """The inventory file that defined the host; None for a -H address that is in no inventory."""
    match = _SOURCE.fullmatch(host.source or "")
    return match["path"] if match and not host.plain else None


def entry(
    result: Result,
    playbook: str | None,
    playbook_sha256: str | None,
    host: Host | None = None,
    root: Path | None = None,
) -> dict[str, Any]:
    uid, name = login()
    record: dict[str, Any] = {
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "operator": operator(),
        "uid": uid,
        "login": name,  # from the OS (the password database), never from $USER
        "host": result.host,
        "address": address(host) if host else None,
        "inventory": inventory_file(host) if host else None,
        "project": str(_resolved(str(root.absolute()))) if root else None,
        "task": result.task,
        "playbook": playbook,
        "playbook_sha256": playbook_sha256,
        "result": result.status.value,
        "changed": result.changed,
        "duration_s": result.seconds,
        # What this task run returned, by the same rule that makes the process's exit status (a
        # failed result with no code of its own is 1), so that a failed verify is never logged as 0.
        # Masked and cleaned before it is cut: a secret cut in half at character 300 would no longer
        # match.
        "exit_status": exit_status([result]),
        "msg": shown(result.msg)[:300],
    }
    if host is not None and host.jump:
        record["jump"] = host.jump
    return record


_MADE: set[Path] = set()


def append(record: dict[str, Any], root: Path | None = None) -> None:
    """Append one record as one whole line, or raise AuditError and leave the file as it was."""
    path = log_path(root)
    if path.parent not in _MADE:  # once per process and directory, not once per result
        _make_log_dir(path, record)
    # Node text in any field is made inert (redaction.shown) and secrets masked as values, before
    # JSON escapes them: `jq -r .msg` on the log must not drive a terminal either.
    line = (dumps(shown_value(record), sort_keys=True) + "\n").encode()
    try:
        fd = _open(path)
    except FileNotFoundError:  # the directory went away since (removed by hand): make it again
        _make_log_dir(path, record)
        fd = _open(path)
    try:
        _check(fd, path)
        fcntl.flock(fd, fcntl.LOCK_EX)  # one whole line per writer, even from parallel runs
        _write_whole(fd, path, line)
    finally:
        os.close(fd)


def _open(path: Path) -> int:
    try:
        return os.open(path, _OPEN_FLAGS, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW's answer for a symlink
            raise AuditError(
                exc.errno,
                f"{path} is a symbolic link; the audit log is never written through one "
                "(someone may have replaced the file): check where it points, then remove it or "
                "set FLEETOPS_AUDIT_LOG to the real file",
            ) from None
        raise


def _check(fd: int, path: Path) -> None:
    """The open file is a log fleetops may append to: a regular file, one link, owned by the
    operator or root, not writable by others (a team's shared log may be group-writable)."""
    st = os.fstat(fd)
    why = fix = ""
    if not stat.S_ISREG(st.st_mode):
        why, fix = "is not a regular file", f"move it aside (mv {path} {path}.moved)"
    elif st.st_uid not in (os.geteuid(), 0):
        why, fix = (
            f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}) or root",
            "check who made it, then chown it to yourself or root (or remove it)",
        )
    elif st.st_mode & stat.S_IWOTH:
        why, fix = "is writable by everyone", f"check who changed it, then chmod o-w {path}"
    elif st.st_nlink != 1:
        why, fix = (
            f"has {st.st_nlink} hard links (another name may be a file that must not grow)",
            "check the other names (find / -samefile), then copy the log to a file of its own",
        )
    if why:
        mode = stat.filemode(st.st_mode)
        raise AuditError(
            errno.EPERM,
            f"refusing to append to {path}: it {why} [{mode}, uid {st.st_uid}]; {fix} "
            "and run again",
        )


def _write_whole(fd: int, path: Path, line: bytes) -> None:
    """`line` appended whole, on a line of its own; on any failure the file is cut back to its old
    size."""
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        # the last line was torn (a crash, an older writer): this record starts afresh
        line = b"\n" + line
    done = 0
    try:
        while done < len(line):
            n = os.write(fd, line[done:])
            if n <= 0:
                raise OSError(errno.EIO, "the file system took no bytes")
            done += n
    except OSError as exc:
        try:
            if done:
                os.ftruncate(fd, size)
        except OSError as cut:
            raise AuditError(
                exc.errno,
                f"{path}: the record was cut short ({exc.strerror or exc}) and the "
                f"torn line could not be removed ({cut.strerror or cut}); `fab history` skips it",
            ) from None
        raise AuditError(
            exc.errno,
            f"{path}: {exc.strerror or exc} (the record was not written; earlier "
            "records are intact)",
        ) from None


def _make_log_dir(path: Path, record: dict[str, Any]) -> None:
    fresh = not path.parent.exists()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if fresh and not os.environ.get("FLEETOPS_AUDIT_LOG") and record.get("project"):
        # Names the project beside its log: the directory name alone is a hash.
        (path.parent / "project").write_text(record["project"] + "\n", encoding="utf-8")
    _MADE.add(path.parent)


def read(
    host: str | None = None, last: int | None = None, root: Path | None = None
) -> list[dict[str, Any]]:
    try:
        lines = log_path(root).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        rec = _parse(line)
        if isinstance(rec, dict) and (host is None or rec.get("host") == host):
            out.append(rec)
    return out[-last:] if last else out


def _parse(line: str) -> Any:
    """One line's record. A torn line from a crashed writer must not hide the rest; an older writer
    glued the next record onto it, which is recovered: the line's last part that parses as a whole
    record."""
    try:
        return json.loads(line)
    except ValueError:
        pass
    start = line.find('{"', 1)
    for _ in range(16):  # bounded: a long garbage line costs at most a few tries
        if start == -1:
            return None
        try:
            return json.loads(line[start:])
        except ValueError:
            start = line.find('{"', start + 1)
    return None
