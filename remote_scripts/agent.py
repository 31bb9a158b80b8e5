"""Entry point on the node: one JSON request on stdin → one JSON result on stdout.

Libraries imported by checks (vLLM logs to stdout) must not corrupt the answer, so the real stdout is
set aside first and everything else that writes to fd 1 lands in stderr.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
import time
import traceback

from .protocol import OPS as OP_NAMES
from .protocol import PROTOCOL

# op → (module, function): only the module an op needs is imported (node start-up time is per exec).
OPS = {"patch": ("patching", "patch"), "rollback": ("patching", "rollback"), "verify": ("checks", "verify"),
       "gpu": ("gpu", "gpu"), "facts": ("gpu", "facts"), "preflight": ("jobs", "preflight"),
       "job_start": ("jobs", "job_start"), "job_status": ("jobs", "job_status"), "job_tail": ("jobs", "job_tail"),
       "job_logs": ("jobs", "job_logs"), "job_stop": ("jobs", "job_stop"), "run": ("adhoc", "run"),
       "jobs_list": ("jobs", "jobs_list"), "fetch_plan": ("fetch", "fetch_plan"),
       "diagnose": ("diagnose", "diagnose"), "capture": ("capture", "capture"),
       "slurm": ("slurm", "slurm")}
assert {"ping", *OPS} == set(OP_NAMES), "protocol.OPS and agent.OPS disagree"
EXIT_REFUSED = 3  # the state dir is not trusted: the same exit and answer shape as the bootstrap's refusals


def _ping(req: dict) -> dict:
    return {"ok": True, "python": sys.executable, "version": sys.version.split()[0], "pid": os.getpid()}


def _op(name: str):
    if name == "ping":
        return _ping
    if name not in OPS:
        return None
    import importlib

    module, function = OPS[name]
    return getattr(importlib.import_module(f"{__package__}.{module}"), function)


def _watch_client(answer_fd: int) -> None:
    """When the client goes away (Ctrl-C closes its connection), sshd closes our pipes: the write end of
    stdout reports POLLERR. Then the op is interrupted in the main thread, so it unwinds like any exception:
    atomic writes leave the old file or the new one, the node lock is released, child processes killed."""
    poller = select.poll()
    poller.register(answer_fd, select.POLLERR | select.POLLHUP)
    main = threading.main_thread().ident
    assert main is not None

    def watch() -> None:
        while True:
            if poller.poll(200):
                # To the main thread itself, so a blocking wait there (select, sleep) wakes with EINTR and
                # Python raises KeyboardInterrupt at once.
                signal.pthread_kill(main, signal.SIGINT)
                return

    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=watch, name="client-watch", daemon=True).start()


def main() -> int:
    # Long-running roles of the same zip: the job wrapper, and our hidden-state extraction driver.
    if len(sys.argv) >= 3 and sys.argv[1] == "wrap":
        from .jobs import wrap_main

        return wrap_main(sys.argv[2])
    if len(sys.argv) >= 3 and sys.argv[1] == "extract":
        from .extract_hidden_states import main as extract_main

        return extract_main(sys.argv[2])
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    started = time.monotonic()
    try:
        request = json.loads(sys.stdin.read())
        if request.get("protocol") != PROTOCOL:
            raise ValueError(f"protocol mismatch: client speaks {request.get('protocol')}, node {PROTOCOL}")
        from .nodeio import QUARANTINED, NodeError, check_state_dir, clean_stale_uploads, load_failpoints

        load_failpoints()  # only what the test harness's environment names; never a file in the state dir
        op = _op(str(request.get("op")))
        if op is None:
            raise ValueError(f"unknown op {request.get('op')!r}")
        _watch_client(answer_fd)
        cleaned: list[str] = []
        if request.get("state_dir"):  # StrictModes: every path fleetops uses there, before the op runs
            try:
                check_state_dir(request["state_dir"])
            except NodeError as exc:  # refused like the bootstrap refuses (exit 3): no op ran, for any task
                _answer(answer_fd, {"ok": False, "bootstrap": True, "error": str(exc), "error_kind": exc.kind,
                                    **exc.details})
                return EXIT_REFUSED
            cleaned = clean_stale_uploads(request["state_dir"])
            if cleaned:
                print(f"fleetops: removed dead uploads' temp files: {', '.join(cleaned)}", file=sys.stderr)
        try:
            result = op(request)
        except NodeError as exc:
            result = {"ok": False, "error": str(exc), "error_kind": exc.kind, "details": exc.details}
        except OSError as exc:
            from .nodeio import os_error_message

            result = {"ok": False, "error": os_error_message(exc, f"{request.get('op')} failed"),
                      "error_kind": "os"}
        if cleaned:  # what the node tidied on the way, reported whatever the op's outcome
            result["removed_temp_files"] = cleaned
        if QUARANTINED:
            result["quarantined"] = list(QUARANTINED)
    except KeyboardInterrupt:
        print("fleetops agent: client went away (interrupted); stopped cleanly", file=sys.stderr)
        return 130
    except Exception:  # noqa: BLE001 - report, never die silently
        traceback.print_exc()
        sys.stderr.flush()
        return 70
    result["seconds"] = round(time.monotonic() - started, 3)
    _answer(answer_fd, result)
    return 0


def _answer(answer_fd: int, result: dict) -> None:
    data = (json.dumps(result, default=str) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(answer_fd, view):]
