"""Where the OpenSSH transport keeps its master connections: one directory per user, made 0700 by
fleetops and refused when anyone else could put a socket there (ssh would then talk to whatever
listens on it), with one small record per master beside its socket (which host, as whom, when
opened, when last used) for `connections`, `disconnect` and the cap on how many masters persist. No
ssh is run here."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

CONTROL_DIR_ENV = "FLEETOPS_CONTROL_DIR"
# ssh names a master's socket `%C` (40 hex characters: a hash of local host, host, port, user and
# jump) and first binds it under a 17-character temporary suffix; a Unix socket's path holds 104
# bytes on macOS (108 on Linux), so the directory's own path must stay under this or ssh cannot
# create the socket at all.
MAX_DIR_CHARS = 104 - 1 - 40 - 17 - 1
RECORD_SUFFIX = ".json"
MAX_RECORD_BYTES = 4096


class ControlDirError(Exception):
    """The control directory cannot be used safely; the message says which path, why and what to
    do."""


@dataclass(frozen=True)
class MasterRecord:
    """What fleetops knows of one master: written when it first uses it, `used` refreshed on each
    use."""

    socket: str  # the socket's name in the control directory (ssh's %C)
    host: str  # the inventory's (or the -H word's) name
    hostname: str
    user: str
    port: int
    jump: str  # "" without a jump host
    opened: float
    used: float


def candidates(environ: os._Environ[str] | dict[str, str] | None = None) -> list[str]:
    """The directories tried, in order: $FLEETOPS_CONTROL_DIR alone when set; else under
    $XDG_RUNTIME_DIR (a per-user tmpfs, gone at logout), ~/.ssh, then /tmp (short enough for a
    socket where a home path is long)."""
    env = os.environ if environ is None else environ
    chosen = env.get(CONTROL_DIR_ENV)
    if chosen:
        return [os.path.abspath(os.path.expanduser(chosen))]
    out = []
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        out.append(os.path.join(runtime, "fleetops-ssh"))
    out.append(os.path.join(os.path.expanduser("~"), ".ssh", "fleetops-cm"))
    out.append(f"/tmp/fleetops-ssh-{os.geteuid()}")
    return out


def control_dir(create: bool = True) -> str:
    """The directory for this user's masters, made 0700 when missing (`create`). Raises
    ControlDirError when the one named by $FLEETOPS_CONTROL_DIR is unsafe or too long, or when no
    candidate is usable."""
    reasons = []
    for path in candidates():
        if len(path) > MAX_DIR_CHARS:
            reasons.append(
                f"{path}: {len(path)} characters, a master's socket path would not fit "
                f"(at most {MAX_DIR_CHARS})"
            )
            continue
        try:
            if create:
                _make(path)
            check(path)
            return path
        except FileNotFoundError:
            reasons.append(f"{path}: does not exist")
        except ControlDirError as e:
            reasons.append(str(e))
        except OSError as e:
            reasons.append(f"{path}: {e.strerror or e}")
        if os.environ.get(CONTROL_DIR_ENV):
            break
    raise ControlDirError(
        "no safe directory for ssh master connections: "
        + "; ".join(reasons)
        + f"; set {CONTROL_DIR_ENV} to a directory only you can write (mode 0700), or "
        "use `persist: 0` (no master connections)"
    )


def _make(path: str) -> None:
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        os.makedirs(parent, mode=0o700, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)


def check(path: str) -> None:
    """Refuse a control directory that is a symlink, not a directory, not this user's, or writable
    by anyone else; and one whose parent others may write without the sticky bit (they could swap
    the directory)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise ControlDirError(
            f"{path} is a symlink (remove it; fleetops makes the directory itself)"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise ControlDirError(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise ControlDirError(f"{path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})")
    if st.st_mode & 0o077:
        raise ControlDirError(
            f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: others may reach sockets in it "
            f"(chmod 700 {path})"
        )
    parent = os.lstat(os.path.dirname(path) or "/")
    if (
        parent.st_mode & 0o002
        and not parent.st_mode & stat.S_ISVTX
        and parent.st_uid != os.geteuid()
    ):
        raise ControlDirError(
            f"{os.path.dirname(path)} may be written by anyone and is not sticky: "
            "the control directory could be replaced"
        )


def control_path(directory: str) -> str:
    """ssh's ControlPath for masters in `directory`: keyed on local host, host, port, user and jump
    (%C), so a master is never reused for another identity."""
    return os.path.join(directory, "%C")


def write_record(directory: str, record: MasterRecord) -> None:
    """Write (or refresh) a master's record (write_private)."""
    write_private(
        directory,
        _record_name(record.socket),
        json.dumps(asdict(record), sort_keys=True).encode(),
    )


def write_private(directory: str, name: str, data: bytes) -> None:
    """`name` in the control directory, 0600, holding `data`: a temporary file opened beside it
    through the directory's descriptor (never through a link), renamed over the old one, so a reader
    sees the old file or the whole new one."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        tmp = f".{name}.{os.getpid()}.{time.monotonic_ns()}.tmp"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd
        )
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def touch(directory: str, socket: str) -> None:
    """Mark a master used now (its record's `used`); nothing when it has no record."""
    record = read_record(directory, socket)
    if record is not None:
        write_record(directory, MasterRecord(**{**asdict(record), "used": time.time()}))


def read_record(directory: str, socket: str) -> MasterRecord | None:
    """The record of one master, None when missing or not fleetops' (a record is data: a bad one is
    ignored)."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fd = os.open(_record_name(socket), os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    try:
        raw = os.read(fd, MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    return parse_record(raw)


def parse_record(raw: bytes) -> MasterRecord | None:
    if len(raw) > MAX_RECORD_BYTES:
        return None
    try:
        data = json.loads(raw)
        return MasterRecord(
            socket=str(data["socket"]),
            host=str(data["host"]),
            hostname=str(data["hostname"]),
            user=str(data["user"]),
            port=int(data["port"]),
            jump=str(data["jump"]),
            opened=float(data["opened"]),
            used=float(data["used"]),
        )
    except (ValueError, KeyError, TypeError):
        return None


def records(directory: str) -> list[MasterRecord]:
    """Every master's record in the directory, least recently used first; a record whose socket is
    gone is left out (the master exited: ControlPersist ran out, or it was closed)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    sockets = {
        n for n in names if not n.endswith(RECORD_SUFFIX) and _is_socket(os.path.join(directory, n))
    }
    out = []
    for name in names:
        if name.endswith(RECORD_SUFFIX) and not name.startswith("."):
            socket = name[: -len(RECORD_SUFFIX)]
            if socket in sockets:
                record = read_record(directory, socket)
                if record is not None and record.socket == socket:
                    out.append(record)
    return sorted(out, key=lambda r: r.used)


LOCK_POLL_S = 0.05


@contextlib.contextmanager
def start_lock(
    directory: str, socket: str, give_up: Callable[[], bool], timeout: float
) -> Iterator[bool]:
    """Held while this process starts the master of `socket`: one start per socket at a time, across
    processes. Two `ssh -M` racing for one socket's name leave the loser running on as a plain
    connection ("disabling multiplexing") that nothing lists or closes. The lock is a 0600 file
    `.SOCKET.lock` beside it, opened through the directory's descriptor, never through a link
    (ControlDirError when it cannot be). Yields False when `give_up()` turned true or `timeout`
    seconds passed first (the caller then starts none)."""
    if not socket or "/" in socket or socket.startswith("."):
        raise ValueError(f"not a socket name: {socket!r}")
    name = f".{socket}.lock"
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        path = os.path.join(directory, name)
        raise ControlDirError(f"{path}: {exc.strerror or exc} (remove it)") from None
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if give_up() or time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(LOCK_POLL_S)
        yield True
    finally:
        os.close(fd)  # the lock goes with the descriptor


def forget(directory: str, socket: str) -> None:
    """Remove a master's record (after it was closed)."""
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(directory, _record_name(socket)))


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def _record_name(socket: str) -> str:
    if not socket or "/" in socket or socket.startswith("."):
        raise ValueError(f"not a socket name: {socket!r}")
    return socket + RECORD_SUFFIX


ASKPASS_NAME = "askpass"


def askpass_text(variable: str) -> bytes:
    """The askpass program ssh and ssh-keygen run for a key's passphrase: it prints `variable` from
    its own environment (only that ssh's carries it), so the passphrase is in no argv and no
    file."""
    return f"#!/bin/sh\nprintf '%s\\n' \"${variable}\"\n".encode()


def askpass_script(directory: str, variable: str) -> str:
    """The askpass program in the control directory, made 0700 when missing: written under a
    temporary name and linked into place (a reader never sees it half written), then checked to be
    a plain file of this user's, 0700, with exactly that text. Raises ControlDirError when what is
    there is anything else (refused, never run)."""
    text = askpass_text(variable)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        tmp = f".{ASKPASS_NAME}.{os.getpid()}.{time.monotonic_ns()}.tmp"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700, dir_fd=dir_fd
        )
        try:
            os.write(fd, text)
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
        try:
            os.link(tmp, ASKPASS_NAME, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        except FileExistsError:
            pass  # made before: checked below as any other
        finally:
            os.unlink(tmp, dir_fd=dir_fd)
        _check_askpass(directory, dir_fd, text)
    finally:
        os.close(dir_fd)
    return os.path.join(directory, ASKPASS_NAME)


def _check_askpass(directory: str, dir_fd: int, text: bytes) -> None:
    path = os.path.join(directory, ASKPASS_NAME)
    try:
        fd = os.open(ASKPASS_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        raise ControlDirError(f"{path}: {exc.strerror or exc} (remove it)") from None
    try:
        st = os.fstat(fd)
        body = os.read(fd, len(text) + 1) if stat.S_ISREG(st.st_mode) else b""
    finally:
        os.close(fd)
    if (
        not stat.S_ISREG(st.st_mode)
        or st.st_uid != os.geteuid()
        or stat.S_IMODE(st.st_mode) != 0o700
        or body != text
    ):
        raise ControlDirError(
            f"{path} is not fleetops' askpass program (another owner, mode, kind or text); "
            "remove it, fleetops makes it itself"
        )
