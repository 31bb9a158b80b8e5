"""Entry point on the node: one agent per host per invocation. The client starts it once, through
the verifying bootstrap (fleetops/wire/bundle.py), and sends every task of its chain over the same
channel: one JSON request per line on stdin -> one JSON answer per line on the answer pipe, in
order. The agent ends when its client closes stdin (the run is over) or goes away (the watchdog
below), so no agent outlives its client.

A request that imports the node's third-party code (verify's import and callsites checks, capture)
runs in a forked child: the agent itself never holds a module that a later request of the same
session may have patched, and never grows by vLLM's hundreds of MB. (The agent's python starts with
-S, but not to save time: `site` runs the .pth files of site-packages, so the bootstrap checks those
directories first and runs `site.main()` itself afterwards; every agent has site-packages on its
path, as before.)

Libraries imported by checks (vLLM logs to stdout) must not corrupt the answers, so the real stdout
is set aside first and everything else that writes to fd 1 lands in stderr.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import sys
import threading
import time

from .protocol import PROTOCOL
from .registry import Op, never

# typing.TYPE_CHECKING without importing typing: the agent's start-up imports only what it runs
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    FindOp = Callable[[str], "Op | None"]
    FindRole = Callable[[str], "Callable[..., int] | None"]

EXIT_REFUSED = 3  # the state dir is not trusted: the same answer shape as the bootstrap's refusals


def _ping(req: dict) -> dict:
    answer = {
        "ok": True,
        "python": sys.executable,
        "version": sys.version.split()[0],
        "pid": os.getpid(),
    }
    if req.get("modules"):  # what verify would refuse to import, said without importing
        from .importtrust import ping_warnings

        answer["warnings"] = ping_warnings(req["modules"])
    return answer


PING = Op("ping", _ping, False, never)  # built in: it loads no op module


def _op(name: str, find: FindOp) -> Op | None:
    return PING if name == "ping" else find(name)


# ---------------------------------------------------------------- the client
def _watch_client(answer_fd: int) -> None:
    """When the client goes away (Ctrl-C closes its connection, or it was killed), sshd closes our
    pipes: the write end of the answer pipe reports POLLERR. Then the main thread is interrupted, so
    the op in progress unwinds like any exception (atomic writes leave the old file or the new one,
    the node lock is released, child processes killed) and the agent exits; between requests it
    exits at once."""
    poller = select.poll()
    poller.register(answer_fd, select.POLLERR | select.POLLHUP)
    main = threading.get_ident()  # main() runs on the main thread

    def watch() -> None:
        # no timeout: the thread sleeps until the pipe breaks, never waking the agent meanwhile
        while not poller.poll():
            pass
        # To the main thread itself, so a blocking wait there (select, sleep, read) wakes with EINTR
        # and Python raises KeyboardInterrupt at once.
        signal.pthread_kill(main, signal.SIGINT)

    signal.signal(signal.SIGINT, signal.default_int_handler)
    # A daemon: it never holds up the agent's exit
    threading.Thread(target=watch, name="fleetops-client-watch", daemon=True).start()


def main(find_op: FindOp, find_role: FindRole) -> int:
    """Serve the session, each op found by `find_op` (the manifest, remote_scripts/ops.py, which
    this layer does not import); or run the role `python zip ROLE ARGS...` names."""
    # The bootstrap loaded the agent's modules with cyclic collection off: what they made is kept
    # out of every later collection (frozen: it lives as long as the process), and the requests'
    # garbage is collected as usual from here on.
    gc.freeze()
    gc.enable()
    # The other processes of the same verified bytes, each started through the bootstrap
    # (bootstrap.relaunch): the job keeper, the hidden-state extraction driver, the Slurm batch
    # step, verify's probe.
    role = find_role(sys.argv[1]) if len(sys.argv) >= 3 else None
    if role is not None:
        return role(*sys.argv[2:])
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _watch_client(answer_fd)
    requests = sys.stdin.buffer
    try:
        while True:
            line = requests.readline()
            if not line:
                return 0  # the client closed the session: the run is over
            if not line.strip():
                continue
            _answer(answer_fd, serve(line, find_op))
    except KeyboardInterrupt:
        print("fleetops agent: client went away (interrupted); stopped cleanly", file=sys.stderr)
        return 130


def serve_and_exit(find_op: FindOp, find_role: FindRole) -> None:
    """The serving agent's end (the bootstrap calls it through the manifest). When main() returns,
    the client has closed the session (or gone away): every answer is written (os.write,
    unbuffered), every op's files are closed and its children waited for, and no thread of ours is
    left but the watchdog. Python's teardown would only free memory: 3-5 ms of the node's CPU per
    host, measured, so it is skipped. The long-running roles (`wrap`, `extract`, where vLLM
    registers exit handlers) start from the zip's __main__ and exit normally."""
    code = main(find_op, find_role)
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is not None:
            stream.flush()
    os._exit(code)


def serve(line: bytes, find_op: FindOp) -> dict:
    """One request line -> its answer. Never raises but for KeyboardInterrupt (the client is gone):
    a bug or an unexpected error in one request is that request's answer (agent_error), and the
    session goes on."""
    started = time.monotonic()
    rid = None
    try:
        request = json.loads(line)
        rid = request.get("_id") if isinstance(request, dict) else None
        if not isinstance(request, dict) or request.get("protocol") != PROTOCOL:
            got = request.get("protocol") if isinstance(request, dict) else None
            raise ValueError(f"protocol mismatch: client speaks {got}, node {PROTOCOL}")
        op = _op(str(request.get("op")), find_op)
        if op is None:
            raise ValueError(f"unknown op {request.get('op')!r}")
        result = _forked(op, request) if op.forks(request) else _run(op.handler, request)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # report, never die: the next request must still be served
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        result = {
            "ok": False,
            "agent_error": True,
            "error": f"{type(exc).__name__}: {exc}",
            "error_kind": "agent_exception",
        }
    result["_id"] = rid
    result.setdefault("seconds", round(time.monotonic() - started, 3))
    sys.stderr.flush()
    return result


def _run(op: Callable[[dict], dict], request: dict) -> dict:
    from .failpoints import load_failpoints, reset_failpoint_hits
    from .nodeio import NodeError, forget_resolved
    from .statetrust import QUARANTINED, check_state_dir, clean_stale_uploads

    # only what the test harness's environment names; never a file in the state dir
    load_failpoints()
    reset_failpoint_hits()
    QUARANTINED.clear()
    # modules and versions are found again by each request: an earlier one (run) may have installed
    forget_resolved()
    cleaned: list[str] = []
    if request.get("state_dir"):  # StrictModes: every path fleetops uses there, before the op runs
        try:
            check_state_dir(request["state_dir"])
        except NodeError as exc:  # refused like the bootstrap refuses: no op ran, for any task
            return {
                "ok": False,
                "bootstrap": True,
                "error": str(exc),
                "error_kind": exc.kind,
                **exc.details,
            }
        cleaned = clean_stale_uploads(request["state_dir"])
        if cleaned:
            print(
                f"fleetops: removed dead uploads' temp files: {', '.join(cleaned)}", file=sys.stderr
            )
    try:
        result = op(request)
    except NodeError as exc:
        result = {"ok": False, "error": str(exc), "error_kind": exc.kind, "details": exc.details}
    except OSError as exc:
        from .atomicio import os_error_message

        result = {
            "ok": False,
            "error": os_error_message(exc, f"{request.get('op')} failed"),
            "error_kind": "os",
        }
    if cleaned:  # what the node tidied on the way, reported whatever the op's outcome
        result["removed_temp_files"] = cleaned
    if QUARANTINED:
        result["quarantined"] = list(QUARANTINED)
    # the bootstrap's loader, and the op's own (an import path let pass): --allow-insecure-venv
    warnings = [
        *(getattr(__spec__.loader, "warnings", None) or ()),
        *(result.get("warnings") or ()),
    ]
    if warnings:
        result["warnings"] = warnings
    return result


def _forked(op: Op, request: dict) -> dict:
    """Run a request that imports the node's packages in a child; the agent stays as clean as it
    started. The child's answer comes back over a pipe; if the client goes away meanwhile, the child
    is interrupted (SIGINT) like the agent itself would be."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no watchdog thread here; the parent relays the interruption
        code = 0
        try:
            os.close(read_fd)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                result = _run(op.handler, request)
            except KeyboardInterrupt:
                code = 130
                result = {"ok": False, "error": "interrupted", "error_kind": "interrupted"}
            except Exception as exc:  # the parent answers it as this request's error
                import traceback

                traceback.print_exc()
                result = {
                    "ok": False,
                    "agent_error": True,
                    "error": f"{type(exc).__name__}: {exc}",
                    "error_kind": "agent_exception",
                }
            _answer(write_fd, result)
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(write_fd)
    data = bytearray()
    try:
        with os.fdopen(read_fd, "rb") as pipe:
            while chunk := pipe.read(65536):
                data += chunk
    except KeyboardInterrupt:
        _stop_child(pid)
        raise
    os.waitpid(pid, 0)
    try:
        return json.loads(bytes(data))
    except ValueError:
        raise RuntimeError(
            f"the {request.get('op')} child process ended without an answer"
        ) from None


def _stop_child(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGINT)
        for _ in range(100):
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _answer(answer_fd: int, result: dict) -> None:
    # compact: the same JSON, ~5% fewer bytes through sshd for every answer
    data = (json.dumps(result, default=str, separators=(",", ":")) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(answer_fd, view) :]
