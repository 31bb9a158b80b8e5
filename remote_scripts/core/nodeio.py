"""Node-side plumbing shared by every operation: atomic writes, hashes, the node lock, module lookup,
installed versions and fault-injection points. Stdlib only."""

from __future__ import annotations

import errno
import fcntl
import importlib.machinery
import json
import os
import site
import stat
import sys
import time
from hashlib import sha256
from signal import SIGKILL

from .procfs import pid_alive

# typing.TYPE_CHECKING without importing typing: the agent's start-up imports only what it runs
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


class NodeError(Exception):
    """A refusal or failure with a message meant for the operator."""

    def __init__(self, message: str, kind: str = "error", **details: object) -> None:
        super().__init__(message)
        self.kind = kind
        self.details = details


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # not datetime: its import is ~3 ms per agent


def sha256_bytes(data: bytes) -> str:
    return sha256(data).hexdigest()


# ---------------------------------------------------------------- fault injection
# Failpoints exist only where the test harness asks for them: the lab's sshd sets FLEETOPS_FAILPOINTS_DIR
# (sshd_config SetEnv) to a directory outside the state dir, and tests write failpoints.json there. Nothing
# found on a node enables them: without that variable nothing is read, so a failpoints.json planted in the
# state dir is inert, and no .hit/.trace file is ever written.
#   {"patch.target.before_rename": {"action": "kill", "skip": 1}}: fire once, on the 2nd hit (the 2nd file's).
#     Actions: kill, raise, sleep ("seconds"), pause (wait until the test deletes the .hit file, at most
#     "seconds", default 120: the test cuts the connection meanwhile, with no timing window).
#   {"*": {"action": "record"}}: fire nothing; append every point reached, in order, to failpoints.trace
#     (with the file being written, if any), so a test can enumerate every (point, n-th hit) of an
#     operation and then fault each one.
FAILPOINTS_ENV = "FLEETOPS_FAILPOINTS_DIR"
_FAILPOINTS: dict = {}
_HITS: dict[str, int] = {}
_FAILPOINT_DIR = ""


def reset_failpoint_hits() -> None:
    """"Fire on the n-th hit" counts within one request, as it did when each request was a process."""
    _HITS.clear()


def load_failpoints(state_dir: str = "") -> None:
    """Arm the failpoints the test harness set (`state_dir` is ignored: kept for callers' signature)."""
    global _FAILPOINTS, _FAILPOINT_DIR
    _FAILPOINTS, _FAILPOINT_DIR = {}, os.environ.get(FAILPOINTS_ENV, "")
    if not _FAILPOINT_DIR or not os.path.isabs(_FAILPOINT_DIR):
        _FAILPOINT_DIR = ""
        return
    try:
        fd = os.open(os.path.join(_FAILPOINT_DIR, "failpoints.json"), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, encoding="utf-8") as f:
            value = json.loads(f.read())
    except (OSError, ValueError):
        return
    _FAILPOINTS = value if isinstance(value, dict) else {}


def _append_fp(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(text)


def failpoint(name: str, path: str = "") -> None:
    if not _FAILPOINTS or not _FAILPOINT_DIR:
        return
    if _FAILPOINTS.get("*", {}).get("action") == "record":
        _append_fp(os.path.join(_FAILPOINT_DIR, "failpoints.trace"), json.dumps([name, path]) + "\n")
    spec = _FAILPOINTS.get(name)
    if not spec:
        return
    _HITS[name] = _HITS.get(name, 0) + 1
    if _HITS[name] != int(spec.get("skip", 0)) + 1:
        return  # fire once, on hit skip+1 (e.g. the second file's write, or kill after the third batch)
    action = spec.get("action")
    hit = os.path.join(_FAILPOINT_DIR, f"failpoint-{name}.hit")
    tmp = f"{hit}.{os.getpid()}.tmp"
    try:  # tell a waiting test that this point was reached, and by which pid (renamed in: never read half)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, hit)
    except OSError:
        pass
    if action == "sleep":
        time.sleep(float(spec.get("seconds", 1)))
    elif action == "pause":
        deadline = time.monotonic() + float(spec.get("seconds", 120))
        while os.path.lexists(hit) and time.monotonic() < deadline:
            time.sleep(0.05)
    elif action == "kill":
        os.kill(os.getpid(), SIGKILL)
    elif action == "raise":
        raise OSError(errno.EIO, f"failpoint {name}")


# ---------------------------------------------------------------- trusting the state dir (StrictModes)
# Like OpenSSH's StrictModes for ~/.ssh: every path fleetops uses in its state dir must be owned by the
# connecting user (or root), writable by no one else, and not a symlink; otherwise the node refuses, naming
# the path, its mode and owner, and what to do. The agent's own code was already checked by the bootstrap
# (bundle.BOOTSTRAP: state dir, bin/, the agent's bytes against the sha256 the client expects).
STATE_NAMES = ("bin", "lock", "lock.json", "backups", "jobs", "cache", "drain.json")
STATE_DIRS = ("bin", "backups", "jobs", "cache")
QUARANTINABLE = ("lock.json",)
JOB_STATE_FILES = ("job.json", "exit.json", "request.json", "secret-env.json")  # jobs.py's names
JOB_LOG = "output.log"


def _untrusted(path: str, why: str, st: os.stat_result | None, fix: str) -> NodeError:
    mode = f"mode {stat.filemode(st.st_mode)} ({st.st_mode & 0o7777:04o}), owner uid {st.st_uid}" if st else ""
    return NodeError(f"refusing to use the state dir: {path} {why}{f' [{mode}]' if mode else ''}; {fix}",
                     kind="untrusted_state", path=path, mode=f"{st.st_mode & 0o7777:04o}" if st else None,
                     uid=st.st_uid if st else None)


def trusted_stat(path: str, want_dir: bool | None = None) -> os.stat_result | None:
    """lstat `path` and refuse it unless it is ours (or root's), writable by no one else, not a symlink.
    None when it does not exist."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise _untrusted(path, f"is a symlink (to {target}); fleetops never follows symlinks in its state dir",
                         st, f"remove it (rm {path}) and run again; fleetops recreates what it needs")
    judge(path, st, want_dir)
    return st


def judge(path: str, st: os.stat_result, want_dir: bool | None = None) -> None:
    """Refuse what `st` (an lstat, or the fstat of a descriptor opened with O_NOFOLLOW) says about `path`
    unless it is ours (or root's) and writable by no one else (and a directory or a regular file, as asked)."""
    uid = os.geteuid()
    if st.st_uid not in (uid, 0):
        raise _untrusted(path, f"is owned by uid {st.st_uid}, not by the connecting user (uid {uid}) or root", st,
                         f"check who changed it, then chown {uid} {path} (or remove it) and run again")
    if st.st_mode & 0o022:
        raise _untrusted(path, "is writable by group or others", st,
                         f"check who changed it, then chmod go-w {path} and run again")
    if want_dir is True and not stat.S_ISDIR(st.st_mode):
        raise _untrusted(path, "is not a directory", st, f"move it aside (mv {path} {path}.moved) and run again")
    if want_dir is False and not stat.S_ISREG(st.st_mode):
        raise _untrusted(path, "is not a regular file", st, f"move it aside (mv {path} {path}.moved) and run again")


def open_state_file(path: str, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """A descriptor of a state file fleetops reads back (or locks), never through a symlink, refused unless
    it is a regular file that is ours (or root's) and writable by no one else. FileNotFoundError when it does
    not exist (and flags do not create it)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            trusted_stat(path)  # raises, naming the symlink and its target
        raise
    try:
        judge(path, os.fstat(fd), want_dir=False)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_state_dir(state_dir: str) -> None:
    """Before any op: the state dir and every path fleetops uses in it (bin/, lock, lock.json, backups/ and
    jobs/ with what they hold) pass trusted_stat()."""
    trusted_stat(state_dir, want_dir=True)
    for name in STATE_NAMES:
        path = os.path.join(state_dir, name)
        if name in QUARANTINABLE:  # only names the lock holder: a broken one is moved aside, not fatal forever
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                quarantine(path, f"a symlink to {os.readlink(path)}" if stat.S_ISLNK(st.st_mode)
                           else "not a regular file")
                continue
            trusted_stat(path, want_dir=False)
            read_json(path, on_corrupt="quarantine")
            continue
        st = trusted_stat(path, want_dir=name in STATE_DIRS)
        if st is None or name not in ("backups", "jobs"):
            continue
        for entry in sorted(os.listdir(path)):
            sub = os.path.join(path, entry)
            sub_st = trusted_stat(sub)
            if sub_st is not None and stat.S_ISDIR(sub_st.st_mode):  # jobs/<id>/: the files fleetops reads
                for leaf in JOB_STATE_FILES:  # (the rest is the job's own: it runs there, its cwd)
                    trusted_stat(os.path.join(sub, leaf))
                _owned_not_link(os.path.join(sub, JOB_LOG))  # its mode is the job's umask's


def _owned_not_link(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or st.st_uid not in (os.geteuid(), 0):
        trusted_stat(path)


# Uploads (wire/ssh.py) write <name>.<8 hex>.tmp in bin/ and rename it; one killed midway leaves it. Its writer
# (an sftp-server) names no pid, so a temp file older than this is a dead writer's: an upload takes seconds.
STALE_UPLOAD_S = 600
_HEX = frozenset("0123456789abcdef")


def is_upload_tmp(name: str) -> bool:
    """fleetops-agent-<hex>.pyz.<8 hex>.tmp: an upload's temp file."""
    if not (name.startswith("fleetops-agent-") and name.endswith(".tmp")):
        return False
    digest, dot_pyz, tag = name[len("fleetops-agent-"):-len(".tmp")].partition(".pyz.")
    return bool(dot_pyz and digest and len(tag) == 8 and _HEX.issuperset(digest) and _HEX.issuperset(tag))


def clean_stale_uploads(state_dir: str, older_than: float = STALE_UPLOAD_S) -> list[str]:
    """Remove dead uploads' temp files from bin/ (plain files only, never through a symlink)."""
    bin_dir = os.path.join(state_dir, "bin")
    now = time.time()

    def stale(name: str) -> bool:
        if not is_upload_tmp(name):
            return False
        try:
            st = os.lstat(os.path.join(bin_dir, name))
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and now - st.st_mtime > older_than

    return remove_entries(bin_dir, stale)


def remove_entries(directory: str, wanted: Callable[[str], bool]) -> list[str]:
    """Unlink the entries of `directory` whose names `wanted` picks: the paths removed. A directory that cannot
    be listed, or an entry that cannot be removed, is left as it is (cleaning up is never fatal)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for name in names:
        if wanted(name):
            path = os.path.join(directory, name)
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed


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
                 point: str = "write", durable: bool = True) -> None:
    """Write via a temp file in the same directory, fsync, rename: readers see old or new, never half.

    `like` copies mode and ownership from an existing file (the file being replaced). `durable=False` skips
    the fsyncs (still old or new, never half, while the machine stays up): for notes a crash may lose."""
    directory = os.path.dirname(path) or "."
    st = os.stat(like) if like else None
    clean_stale_temps(path)
    tmp = os.path.join(directory, f".{os.path.basename(path)}{TMP_MARK}{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if durable:
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
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = path  # write() and fsync() name no file; "no space left on device" alone names no disk
        raise
    failpoint(f"{point}.after_rename", path)
    if durable:
        fsync_dir(directory)


def ensure_dir(path: str) -> None:
    """Make a state directory (0700) and refuse one that is a symlink or not ours alone."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(path, mode=0o700, exist_ok=True)
    trusted_stat(path, want_dir=True)


def write_json_atomic(path: str, obj: object, point: str = "json", durable: bool = True) -> None:
    atomic_write(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode(), mode=0o600, point=point,
                 durable=durable)


QUARANTINED: list[dict] = []  # corrupt state files moved aside during this op; agent.main reports them


def quarantine(path: str, why: str) -> str:
    """Move a corrupt state file (or a symlink in its place: the link itself, never its target) aside."""
    aside = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"
    os.rename(path, aside)
    QUARANTINED.append({"path": path, "moved_to": aside, "why": why})
    print(f"fleetops: quarantined corrupt state file {path} ({why}); moved to {aside}", file=sys.stderr)
    return aside


def read_json(path: str, on_corrupt: str = "raise") -> dict | None:
    """A state JSON file, never through a symlink, refused (untrusted_state) when another user owns it or may
    write it. A corrupt one (not JSON, a symlink, not a regular file): on_corrupt="raise" refuses naming it;
    "quarantine" moves it aside (reported) and returns None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        why = f"a symlink to {os.readlink(path)}"
    else:
        try:
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    why = "not a regular file"
                else:
                    judge(path, st)  # another user's, or writable by one: refused (not corrupt: planted)
                    value = json.loads(f.read().decode("utf-8"))
                    return value if isinstance(value, dict) else None
        except (ValueError, UnicodeDecodeError) as exc:
            why = f"not JSON: {exc}"
    if on_corrupt == "quarantine":
        quarantine(path, why)
        return None
    raise NodeError(f"corrupt state file {path} ({why}); move it aside (mv {path} {path}.bad) and run again",
                    kind="corrupt_state", path=path)


def os_error_message(exc: OSError, what: str) -> str:
    reason = {errno.ENOSPC: "no space left on device", errno.EROFS: "read-only file system",
              errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
              errno.EDQUOT: "disk quota exceeded"}.get(exc.errno or 0, exc.strerror or str(exc))
    if exc.errno in (errno.ENOSPC, errno.EDQUOT) and exc.filename:
        where = os.path.dirname(str(exc.filename)) or "."
        return f"{what}: {reason} writing {exc.filename}; free space on that filesystem (df -h {where})"
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
        try:  # never through a symlink: `lock` -> /somewhere must not create /somewhere
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                trusted_stat(self.path)  # raises, naming the symlink and its target
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
                trusted_stat(self.path, want_dir=False)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = read_json(self.info_path, on_corrupt="quarantine") or {}
            raise NodeError(
                f"node is locked by {holder.get('operator', '?')} ({holder.get('op', '?')}, pid "
                f"{holder.get('pid', '?')}) since {holder.get('since', '?')}; try again when it finishes",
                kind="locked", holder=holder) from None
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        previous = read_json(self.info_path, on_corrupt="quarantine")
        if previous:  # we hold the flock, so its holder is gone (its pid may name another process by now)
            self.took_over = previous  # it died mid-operation: a holder removes lock.json before it lets go
        try:  # not durable: it names the holder for a refused operator; the flock is the lock
            write_json_atomic(self.info_path, {"operator": self.operator, "op": self.op, "pid": os.getpid(),
                                               "since": now_iso()}, point="lock.info", durable=False)
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
    if "" not in _ROOTS:  # once per request (forget_resolved): a patch asks for them once per file
        roots = list(site.getsitepackages())
        try:
            roots.append(site.getusersitepackages())
        except AttributeError:
            pass
        _ROOTS[""] = [os.path.realpath(r) for r in roots]
    return list(_ROOTS[""])


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


# Resolved once per request (agent._run clears it): a verify names the same two modules in a dozen checks, and
# each resolution is ~0.6 ms of CPU (PathFinder's stats, realpath walks).
RESOLVED: dict[str, str] = {}
_DISTS: dict[str, str | None] = {}  # normalized project → version (None: an egg-info), first on sys.path
_ROOTS: dict[str, list[str]] = {}  # "" → site_roots()


def forget_resolved() -> None:
    """What module_file_in_site and installed_version found: kept for one request only."""
    RESOLVED.clear()
    _DISTS.clear()
    _ROOTS.clear()


def module_file_in_site(name: str) -> str:
    if name in RESOLVED:
        return RESOLVED[name]
    RESOLVED[name] = _module_file_in_site(name)
    return RESOLVED[name]


def _module_file_in_site(name: str) -> str:
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
    return remove_entries(os.path.join(directory, "__pycache__"),
                          lambda entry: entry.startswith(stem + ".") and entry.endswith(".pyc"))


# ---------------------------------------------------------------- versions
# The node reports installed versions; whether they satisfy a playbook's pins is the client's to decide (PEP 440,
# with `packaging`, fleetops/plans/versions.py).


def normalize_dist_name(name: str) -> str:
    """A distribution's name as wheel and dist-info file names write it: re.sub(r"[-_.]+", "_", name).lower()
    (PEP 503's normalization with "_"), without a regex: it runs for every dist-info on sys.path."""
    name = name.lower().replace("-", "_").replace(".", "_")
    while "__" in name:
        name = name.replace("__", "_")
    return name


def installed_version(dist: str) -> str | None:
    """The version of an installed distribution, as importlib.metadata would find it (first on sys.path),
    read from the *.dist-info directory name: no metadata scan, no import of importlib.metadata."""
    if not _DISTS:  # one scan of sys.path per request, however many packages it asks about
        _DISTS[""] = None
        for entry in sys.path:
            try:
                names = os.listdir(entry or ".")
            except OSError:
                continue
            for name in names:
                if name.endswith(".dist-info") and "-" in name:
                    project, _, version = name[: -len(".dist-info")].partition("-")
                    _DISTS.setdefault(normalize_dist_name(project), version)
                elif name.endswith(".egg-info"):
                    _DISTS.setdefault(normalize_dist_name(name.split("-")[0].split(".egg")[0]), None)
    want = normalize_dist_name(dist)
    if want not in _DISTS or not want:
        return None
    if _DISTS[want] is None:  # an egg-info first (editable installs, rare): let the library read it
        import importlib.metadata as md

        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None
    return _DISTS[want]


def report_versions(requires: list[dict]) -> list[dict]:
    """Each pin of a playbook's requires ({"requirement": text, "package": name}, parsed by the client) with the
    version installed here ("found": None when the package is not installed)."""
    return [{"requirement": str(r["requirement"]), "package": str(r["package"]),
             "found": installed_version(str(r["package"]))} for r in requires]
