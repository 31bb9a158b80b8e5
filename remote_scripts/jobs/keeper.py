"""The two small processes behind a job (stdlib only): the keeper (`agent.pyz wrap <job_dir>`,
session leader and child subreaper) and the wrapper it forks (the job's parent), and the job's exit
record they write into space reserved at launch, so a full disk cannot lose it."""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time

from ..core.atomicio import atomic_write, write_json_atomic
from ..core.failpoints import failpoint, load_failpoints
from ..core.launch import relaunch
from ..core.nodeio import NodeError, now_iso
from ..core.procfs import start_ticks
from ..core.registry import node_role
from ..core.statetrust import read_json, trusted_stat
from .liveness import disk_full
from .records import LOG, SECRET_ENV, STOP_ASKED, drop_secrets, job_cause

# typing.TYPE_CHECKING without importing typing: the agent's start-up imports only what it runs
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO

RESERVE = "exit.reserve"  # space for exit.json taken at launch, overwritten in place at the end
RESERVE_BYTES = 8192


def record_end(job_dir: str, result: dict) -> None:
    """Write exit.json into the space reserved at launch (overwritten in place, then renamed: no new
    block is needed, so a full disk cannot lose the record); without a reserve, an ordinary atomic
    write."""
    data = (json.dumps(result) + "\n").encode()
    reserve = os.path.join(job_dir, RESERVE)
    final = os.path.join(job_dir, "exit.json")
    if len(data) <= RESERVE_BYTES:
        try:
            fd = os.open(reserve, os.O_WRONLY | os.O_NOFOLLOW)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                os.write(fd, data.ljust(RESERVE_BYTES, b" "))  # JSON allows trailing white space
                os.fchmod(fd, 0o600)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(reserve, final)
            return
    atomic_write(final, data, mode=0o600, point="job.exit")


# A write that failed for space, as the job's log says it: Python's OSError (with the file when the
# call names one), coreutils' `dd: error writing '/x': No space left on device`, or a bare Errno 28.
_ENOSPC = re.compile(r"No space left on device|\[Errno 28\]|ENOSPC", re.I)
_ENOSPC_PATH = (
    re.compile(r"No space left on device: '(?P<path>/[^']*)'"),
    re.compile(r"'(?P<path>/[^']*)': No space left on device"),
    re.compile(r"(?P<path>/[^\s':]+): No space left on device"),
)
LOG_TAIL_BYTES = 8192


def no_space(job_dir: str, job: dict) -> dict | None:
    """The job ended on ENOSPC, as its log's last lines say: {"path": where it could not write,
    "line": the log's line}. A line that names no file (a Python write() names none) gets the first
    full filesystem among the job's own paths: its output, its cwd, the absolute paths in its
    command. None otherwise."""
    lines = _log_tail(job_dir)
    hits = [line.strip() for line in lines[-20:] if _ENOSPC.search(line)]
    if not hits:
        return None
    line = hits[-1]
    return {"path": _enospc_path(line) or _full_job_path(job), "line": line[-300:]}


def _log_tail(job_dir: str) -> list[str]:
    """The lines of the last LOG_TAIL_BYTES of the job's log (none when it cannot be read)."""
    try:
        with open(os.path.join(job_dir, LOG), "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - LOG_TAIL_BYTES))
            return f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []


def _enospc_path(line: str) -> str | None:
    """The file an ENOSPC line names, if it names one."""
    for pattern in _ENOSPC_PATH:
        m = pattern.search(line)
        if m:
            return m.group("path")
    return None


def _full_job_path(job: dict) -> str | None:
    """The first of the job's own paths (its output, its cwd, the absolute paths in its command)
    on a full filesystem."""
    absolute = [w for w in (job.get("argv") or [])[1:] if isinstance(w, str) and w.startswith("/")]
    for path in ((job.get("extract") or {}).get("output"), job.get("cwd"), *absolute):
        if not isinstance(path, str) or not path:
            continue
        if disk_full(path if os.path.isdir(path) else os.path.dirname(path)):
            return path
    return None


def end_record(code: int | None, job_dir: str, **extra: object) -> dict:
    result: dict = {
        "exit_code": code if code is not None and code >= 0 else None,
        "signal": -code if code is not None and code < 0 else None,
        "ended": now_iso(),
        "ended_ts": time.time(),
    }
    full = disk_full(job_dir)
    if full:
        result["disk_full"] = full
    if code:  # a job that failed: did it run out of space, and where?
        result.update(_failure_evidence(job_dir))
    result.update({k: v for k, v in extra.items() if v})
    if code != 0 and os.path.exists(os.path.join(job_dir, STOP_ASKED)):
        result["by"] = "stop"  # it ended because fleetops' `stop` asked it to, not on its own
    return result


def _failure_evidence(job_dir: str) -> dict:
    """What a failed job leaves to explain itself: an ENOSPC in its log, its own one-line cause."""
    out: dict = {}
    try:
        space = no_space(job_dir, read_json(os.path.join(job_dir, "job.json")) or {})
    except (NodeError, OSError):
        space = None
    if space:
        out["no_space"] = space
    said = job_cause(job_dir)
    if said:
        out["job_cause"] = said[:500]
    return out


def _status_code(status: int) -> int:
    """A waitpid status as Popen's returncode: the exit code, or minus the signal."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _reserve(job_dir: str) -> bool:
    """Take the space exit.json will be written into (RESERVE); False, with the reason recorded
    where it can be, if it cannot be taken."""
    try:
        fd = os.open(
            os.path.join(job_dir, RESERVE),
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
            0o600,
        )
        try:
            os.write(fd, b" " * RESERVE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        reason = f"cannot reserve space for exit.json in {job_dir}: {exc.strerror or exc}"
        try:
            record_end(job_dir, end_record(127, job_dir, wrapper_error=reason))
        except OSError:
            pass
        return False
    return True


@node_role("wrap")
def wrap_main(job_dir: str) -> int:
    """The keeper: session leader and child subreaper. It reserves space for exit.json, forks the
    wrapper (the job's parent) and reaps whatever is re-parented to it. If the wrapper dies before
    recording the job's end, the job becomes the keeper's child and the keeper records its true exit
    status."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    load_failpoints()
    try:  # the job dir it was given: in the state dir the bootstrap checked, and ours alone
        trusted_stat(os.path.dirname(job_dir), want_dir=True)
        if trusted_stat(job_dir, want_dir=True) is None:
            raise NodeError(f"{job_dir} does not exist", kind="no_job")
    except NodeError as exc:
        print(f"fleetops keeper: {exc}", file=sys.stderr)
        return 2
    try:  # PR_SET_CHILD_SUBREAPER: orphans of the job come to us, not to init
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if not _reserve(job_dir):
        return 127
    wrapper = os.fork()
    if wrapper == 0:
        code = 1
        try:
            code = _wrapper(job_dir)
        finally:
            os._exit(code)
    return _reap(job_dir, wrapper)


def _reap(job_dir: str, wrapper: int) -> int:
    """The keeper's wait: until the wrapper has recorded the job's end, or the job (re-parented to
    the keeper once its wrapper died) ended and its status was recorded here."""
    job_pid: int | None = None
    exit_path = os.path.join(job_dir, "exit.json")
    wrapper_status: int | None = None
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == wrapper:
            wrapper_status = status
            if os.path.exists(exit_path):
                return 0  # the wrapper recorded the end; the job's leftovers (if any) go to init
            continue
        if job_pid is None:
            try:
                job_pid = (read_json(os.path.join(job_dir, "job.json")) or {}).get("pid")
            except NodeError:
                job_pid = None
        if pid == job_pid and not os.path.exists(exit_path):
            # The wrapper died first: the job was re-parented to us and its status is ours to
            # record.
            how = (
                f"signal {os.WTERMSIG(wrapper_status)}"
                if wrapper_status is not None and os.WIFSIGNALED(wrapper_status)
                else "an unknown cause"
                if wrapper_status is None
                else f"exit {os.WEXITSTATUS(wrapper_status)}"
            )
            record_end(
                job_dir,
                end_record(
                    _status_code(status),
                    job_dir,
                    by="keeper",
                    wrapper_killed=f"its wrapper (pid {wrapper}) died first ({how}); the "
                    f"exit status was collected by its keeper (pid {os.getpid()})",
                ),
            )
            return 0
    if not os.path.exists(exit_path):
        record_end(
            job_dir,
            end_record(
                None,
                job_dir,
                wrapper_error=f"its wrapper (pid {wrapper}) died before the "
                "job's end could be collected; exit status unknown",
            ),
        )
    return 0


def _wrapper(job_dir: str) -> int:
    job_path = os.path.join(job_dir, "job.json")
    job = read_json(job_path) or {}
    secret = _read_secret(job_dir, job)
    env = {
        **os.environ,
        **job.get("env", {}),
        **secret,
        "FLEETOPS_JOB_ID": job.get("id", ""),
        "FLEETOPS_JOB_DIR": os.path.abspath(job_dir),
        "PYTHONUNBUFFERED": "1",
    }
    try:  # held open for the job's life; never through a symlink (its mode is the job's umask's)
        log = os.fdopen(
            os.open(
                os.path.join(job_dir, LOG),
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o666,
            ),
            "ab",
            buffering=0,
        )
    except OSError as exc:
        record_end(
            job_dir, end_record(127, job_dir, wrapper_error=f"cannot open the job's log: {exc}")
        )
        return 127
    with log:
        child = _start_job(job_dir, job, env, secret, log)
        if child is None:
            return 127
        # the job's process has them now: nothing secret stays on the node's disk
        drop_secrets(job_dir)
        del secret, env
        if not _record_pid(job_path, job, child):
            return 127
        code = child.wait()
    record_end(job_dir, end_record(code, job_dir))
    return 0


def _read_secret(job_dir: str, job: dict) -> dict:
    """The job's secret environment values (SECRET_ENV), when it has any; {} if they are gone."""
    if not job.get("secret_env_keys"):
        return {}
    try:
        return read_json(os.path.join(job_dir, SECRET_ENV)) or {}
    except NodeError:
        return {}


def _start_job(
    job_dir: str, job: dict, env: dict, secret: dict, log: BinaryIO
) -> subprocess.Popen | None:
    """The job's process, its output to the log; None, its end recorded, when it cannot start."""
    try:
        if secret.keys() != set(job.get("secret_env_keys") or ()):
            raise OSError(f"the secret environment values ({SECRET_ENV}) are missing")
        # An extract runs the agent's own code: through the bootstrap, with the bytes this
        # process was verified against (job.json shows the command; it is never run from there).
        if job.get("kind") == "extract":
            argv = relaunch("extract", os.path.join(job_dir, "request.json"))
        else:
            argv = job["argv"]
        failpoint("job.wrapper.start")  # a test swaps what the job would run from here
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=job.get("cwd") or job_dir,
            preexec_fn=_default_signals,
        )
    except OSError as exc:
        drop_secrets(job_dir)
        reason = f"fleetops: cannot start {job.get('argv')}: {exc}"
        try:
            log.write((reason + "\n").encode())
        except OSError as write_exc:
            reason += f" (and the log could not be written: {write_exc.strerror or write_exc})"
        record_end(job_dir, end_record(127, job_dir, wrapper_error=reason))
        return None


def _default_signals() -> None:
    """In the job's process before exec: the signals its keeper ignores are the job's to take."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


def _record_pid(job_path: str, job: dict, child: subprocess.Popen) -> bool:
    """The job's processes on record in job.json (what `status` and `stop` follow). False, the job
    stopped and its end recorded, when the record cannot be written (e.g. ENOSPC): a job that cannot
    be followed is not left running."""
    keeper = os.getppid()
    job.update(
        pid=child.pid,
        pgid=os.getpgid(0),
        wrapper_pid=os.getpid(),
        keeper_pid=keeper,
        keeper_started=start_ticks(keeper),
        pid_started=start_ticks(child.pid),
    )
    try:
        write_json_atomic(job_path, job)
    except OSError as exc:
        child.kill()
        child.wait()
        job_dir = os.path.dirname(job_path)
        record_end(
            job_dir,
            end_record(
                127,
                job_dir,
                wrapper_error=f"cannot record the job's pid in "
                f"{job_path}: {exc.strerror or exc}; the job was stopped",
            ),
        )
        return False
    return True
