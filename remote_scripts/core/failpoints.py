"""Fault injection: named points where the test harness may kill, stall or fail an operation, armed
only through the harness's environment. A module of its own so that the writers, the lock and the
job keeper name points without importing one another. Stdlib only."""

from __future__ import annotations

import errno
import json
import os
import time
from signal import SIGKILL

# Failpoints exist only where the test harness asks for them: the lab's sshd sets
# FLEETOPS_FAILPOINTS_DIR (sshd_config SetEnv) to a directory outside the state dir, and tests write
# failpoints.json there. Nothing found on a node enables them: without that variable nothing is
# read, so a failpoints.json planted in the state dir is inert, and no .hit/.trace file is ever
# written.
#   {"patch.target.before_rename": {"action": "kill", "skip": 1}}: fire once, on the 2nd hit (the
#     2nd file's). Actions: kill, raise, sleep ("seconds"), pause (wait until the test deletes the
#     .hit file, at most "seconds", default 120: the test cuts the connection meanwhile, with no
#     timing window).
#   {"*": {"action": "record"}}: fire nothing; append every point reached, in order, to
#     failpoints.trace (with the file being written, if any), so a test can enumerate every (point,
#     n-th hit) of an operation and then fault each one.
FAILPOINTS_ENV = "FLEETOPS_FAILPOINTS_DIR"
_FAILPOINTS: dict = {}
_HITS: dict[str, int] = {}
_FAILPOINT_DIR = ""


def reset_failpoint_hits() -> None:
    """ "Fire on the n-th hit" counts within one request, as it did when each request was a
    process."""
    _HITS.clear()


def load_failpoints(state_dir: str = "") -> None:
    """Arm the failpoints the test harness set (`state_dir` is ignored: kept for callers'
    signature)."""
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
        _append_fp(
            os.path.join(_FAILPOINT_DIR, "failpoints.trace"), json.dumps([name, path]) + "\n"
        )
    spec = _FAILPOINTS.get(name)
    if not spec:
        return
    _HITS[name] = _HITS.get(name, 0) + 1
    if _HITS[name] != int(spec.get("skip", 0)) + 1:
        # fire once, on hit skip+1 (e.g. the second file's write, or kill after the third batch)
        return
    action = spec.get("action")
    hit = os.path.join(_FAILPOINT_DIR, f"failpoint-{name}.hit")
    tmp = f"{hit}.{os.getpid()}.tmp"
    # tell a waiting test that this point was reached, and by which pid (renamed in: never read
    # half)
    try:
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
