"""Node-side plumbing shared by every operation: atomic writes, hashes, the node lock, module lookup,
version requirements and fault-injection points. Stdlib only."""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import hashlib
import importlib.machinery
import json
import os
import re
import signal
import site
import sys
import time

from .procfs import pid_alive
from .protocol import parse_requirement, version_matches  # noqa: F401 - nodeio's users import them here


class NodeError(Exception):
    """A refusal or failure with a message meant for the operator."""

    def __init__(self, message: str, kind: str = "error", **details: object) -> None:
        super().__init__(message)
        self.kind = kind
        self.details = details


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- fault injection
# Tests arm these by writing <state_dir>/failpoints.json on a lab node. Operators never create that file.
#   {"patch.target.before_rename": {"action": "kill", "skip": 1}}: fire once, on the 2nd hit (the 2nd file's).
#     Actions: kill, raise, sleep ("seconds"), pause (wait until the test deletes the .hit file, at most
#     "seconds", default 120: the test cuts the connection meanwhile, with no timing window).
#   {"*": {"action": "record"}}: fire nothing; append every point reached, in order, to failpoints.trace
#     (with the file being written, if any), so a test can enumerate every (point, n-th hit) of an
#     operation and then fault each one.
_FAILPOINTS: dict = {}
_HITS: dict[str, int] = {}
_FAILPOINT_DIR = ""


def load_failpoints(state_dir: str) -> None:
    global _FAILPOINTS, _FAILPOINT_DIR
    _FAILPOINT_DIR = state_dir
    try:
        with open(os.path.join(state_dir, "failpoints.json"), encoding="utf-8") as f:
            _FAILPOINTS = json.load(f)
    except (OSError, ValueError):
        _FAILPOINTS = {}


def failpoint(name: str, path: str = "") -> None:
    if not _FAILPOINTS:
        return
    if _FAILPOINTS.get("*", {}).get("action") == "record":
        with open(os.path.join(_FAILPOINT_DIR, "failpoints.trace"), "a", encoding="utf-8") as f:
            f.write(json.dumps([name, path]) + "\n")
    spec = _FAILPOINTS.get(name)
    if not spec:
        return
    _HITS[name] = _HITS.get(name, 0) + 1
    if _HITS[name] != int(spec.get("skip", 0)) + 1:
        return  # fire once, on hit skip+1 (e.g. the second file's write, or kill after the third batch)
    action = spec.get("action")
    hit = os.path.join(_FAILPOINT_DIR, f"failpoint-{name}.hit")
    try:  # tell a waiting test that this point was reached, and by which pid (renamed in: never read half)
        with open(hit + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(hit + ".tmp", hit)
    except OSError:
        pass
    if action == "sleep":
        time.sleep(float(spec.get("seconds", 1)))
    elif action == "pause":
        deadline = time.monotonic() + float(spec.get("seconds", 120))
        while os.path.exists(hit) and time.monotonic() < deadline:
            time.sleep(0.05)
    elif action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "raise":
        raise OSError(errno.EIO, f"failpoint {name}")


# ---------------------------------------------------------------- atomic files
def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


TMP_MARK = ".fleetops-tmp-"


def clean_stale_temps(path: str) -> list[str]:
    """Temp files a killed writer left beside `path` (its pid is gone): remove them."""
    directory, base = os.path.split(path)
    prefix = f".{base}{TMP_MARK}"
    removed = []
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return removed
    for name in names:
        if name.startswith(prefix) and name[len(prefix):].isdigit() and not pid_alive(int(name[len(prefix):])):
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(name)
            except OSError:
                pass
    return removed


def atomic_write(path: str, data: bytes, mode: int | None = None, like: str | None = None,
                 point: str = "write") -> None:
    """Write via a temp file in the same directory, fsync, rename: readers see old or new, never half.

    `like` copies mode and ownership from an existing file (the file being replaced)."""
    directory = os.path.dirname(path) or "."
    st = os.stat(like) if like else None
    clean_stale_temps(path)
    tmp = os.path.join(directory, f".{os.path.basename(path)}{TMP_MARK}{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        if st is not None:
            os.chmod(tmp, st.st_mode & 0o7777)
            if os.geteuid() == 0:
                os.chown(tmp, st.st_uid, st.st_gid)
        elif mode is not None:
            os.chmod(tmp, mode)
        failpoint(f"{point}.before_rename", path)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    failpoint(f"{point}.after_rename", path)
    fsync_dir(directory)


def ensure_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)


def write_json_atomic(path: str, obj: object, point: str = "json") -> None:
    atomic_write(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode(), mode=0o600, point=point)


def read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise NodeError(f"corrupt state file {path}: {exc}") from None
    return value if isinstance(value, dict) else None


def os_error_message(exc: OSError, what: str) -> str:
    reason = {errno.ENOSPC: "no space left on device", errno.EROFS: "read-only file system",
              errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
              errno.EDQUOT: "disk quota exceeded"}.get(exc.errno or 0, exc.strerror or str(exc))
    target = f" ({exc.filename})" if exc.filename else ""
    return f"{what}: {reason}{target}"


# ---------------------------------------------------------------- the node lock


class NodeLock:
    """One operator at a time per node. flock makes a dead holder's lock free by itself; the JSON beside
    it names the holder so the refused operator knows whom to ask."""

    def __init__(self, state_dir: str, operator: str, op: str) -> None:
        self.path = os.path.join(state_dir, "lock")
        self.info_path = os.path.join(state_dir, "lock.json")
        self.operator, self.op = operator, op
        self.fd: int | None = None
        self.took_over: dict | None = None

    def __enter__(self) -> NodeLock:
        ensure_dir(os.path.dirname(self.path))
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = read_json(self.info_path) or {}
            raise NodeError(
                f"node is locked by {holder.get('operator', '?')} ({holder.get('op', '?')}, pid "
                f"{holder.get('pid', '?')}) since {holder.get('since', '?')}; try again when it finishes",
                kind="locked", holder=holder) from None
        self.fd = fd
        previous = read_json(self.info_path)
        if previous and previous.get("pid") and not pid_alive(int(previous["pid"])):
            self.took_over = previous  # its holder died mid-operation; flock was already released
        try:
            write_json_atomic(self.info_path, {"operator": self.operator, "op": self.op, "pid": os.getpid(),
                                               "since": now_iso()}, point="lock.info")
            failpoint("lock.acquired")
        except BaseException:  # an interrupt here: `with` calls no __exit__ for a failed __enter__
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            os.unlink(self.info_path)
        except OSError:
            pass
        if self.fd is not None:
            os.close(self.fd)  # releases the flock


# ---------------------------------------------------------------- modules and site-packages
def site_roots() -> list[str]:
    roots = list(site.getsitepackages())
    try:
        roots.append(site.getusersitepackages())
    except AttributeError:
        pass
    return [os.path.realpath(r) for r in roots]


def module_file(name: str) -> str:
    """The file a dotted module name would load from, found without running any package __init__."""
    parts = name.split(".")
    spec = importlib.machinery.PathFinder.find_spec(parts[0])
    for i in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            break
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]),
                                                        list(spec.submodule_search_locations))
    else:
        if spec is not None and spec.origin and os.path.isfile(spec.origin):
            return spec.origin
    raise NodeError(f"module {name!r} not found for {sys.executable}", kind="missing_module")


def module_file_in_site(name: str) -> str:
    path = module_file(name)
    real = os.path.realpath(path)
    roots = site_roots()
    if not any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots):
        raise NodeError(f"module {name!r} resolves to {real}, outside this interpreter's site-packages "
                        f"({', '.join(roots)}); refusing to touch it", kind="outside_site")
    if not real.endswith(".py"):
        raise NodeError(f"module {name!r} resolves to {real}, not a .py source file", kind="not_source")
    return real


def remove_stale_bytecode(path: str) -> list[str]:
    directory, base = os.path.split(path)
    stem = base[:-3] if base.endswith(".py") else base
    cache = os.path.join(directory, "__pycache__")
    removed = []
    try:
        names = os.listdir(cache)
    except OSError:
        return removed
    for entry in names:
        if entry.startswith(stem + ".") and entry.endswith(".pyc"):
            try:
                os.unlink(os.path.join(cache, entry))
                removed.append(os.path.join(cache, entry))
            except OSError:
                pass
    return removed


# ---------------------------------------------------------------- versions
# parse_requirement/version_matches live in protocol.py: the client validates playbooks with the same code.


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def installed_version(dist: str) -> str | None:
    """The version of an installed distribution, as importlib.metadata would find it (first on sys.path),
    read from the *.dist-info directory name: no metadata scan, no import of importlib.metadata."""
    want = _normalize(dist)
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info") and "-" in name:
                project, _, version = name[: -len(".dist-info")].partition("-")
                if _normalize(project) == want:
                    return version
            elif name.endswith(".egg-info") and _normalize(name.split("-")[0].split(".egg")[0]) == want:
                import importlib.metadata as md  # rare (editable installs): let the library read it

                try:
                    return md.version(dist)
                except md.PackageNotFoundError:
                    return None
    return None


def check_requirements(requirements: list[str]) -> list[dict]:
    out = []
    for text in requirements:
        name, clauses = parse_requirement(text)
        found = installed_version(name)
        ok = found is not None and version_matches(found, clauses)
        out.append({"requirement": text, "package": name, "found": found, "ok": ok})
    return out
