"""How verify runs a playbook's probe script: in a fork of the verify process when an earlier check
of the same request (import, callsites) already imported the node's third-party packages, else in a
fresh interpreter.

Why: the probe imports what the callsites and import checks imported just before it (vLLM 0.16,
torch, transformers: about 4,700 modules, ~10 s of CPU on the lab), and a fresh `python probe.py`
imported them a second time; that was half of the deep verify's node CPU. A fork shares them
copy-on-write, so vLLM is imported once per verify, not once per check. The fork keeps what the
separate process gave: the probe's monkeypatching of vLLM and a crash stay in the child, it reads
its request on stdin, its stdout and stderr are its own, it runs as `__main__` with its own
directory first on sys.path, and the timeout kills it. Where nothing is shared or a fork is unsafe
(a `--kinds probe` verify runs in the agent itself: nothing third-party imported, and a watchdog
thread), a fresh interpreter runs it, as it always was. Stdlib only."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time

from ..core.registry import node_role

# how often the parent looks for the probe's end: a probe takes seconds, this adds at most 20 ms
POLL_S = 0.02


def shares_imports() -> bool:
    """Whether a fork is both worth it and safe: this process holds a third-party package (a public
    module from outside the standard library and the agent's own zip; `site` may import private
    helpers such as _distutils_hack in any process) and runs one thread (the agent has its client
    watchdog: forking a threaded process may copy a held lock; the verify child that imports runs
    only its main thread)."""
    if threading.active_count() != 1:
        return False
    # the base interpreter's (a venv's platstdlib is the venv's lib/pythonX.Y, above its
    # site-packages)
    paths = sysconfig.get_paths(
        vars={
            "base": sys.base_prefix,
            "platbase": sys.base_exec_prefix,
            "installed_base": sys.base_prefix,
            "installed_platbase": sys.base_exec_prefix,
        }
    )
    stdlib = tuple(
        {os.path.realpath(paths[k]) + "/" for k in ("stdlib", "platstdlib")}
        | {paths[k].rstrip("/") + "/" for k in ("stdlib", "platstdlib")}
    )
    # the agent's top package, whatever subpackage this module is in
    agent = __name__.partition(".")[0]
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or name.startswith("_") or name.partition(".")[0] == agent:
            continue
        if not path.startswith(stdlib) or "/site-packages/" in path or "/dist-packages/" in path:
            return True
    return False


def run_script(
    script: str, stdin_text: str, timeout: float, source: str | None = None
) -> subprocess.CompletedProcess:
    """The probe `source` (else the file `script`, read once here) run as `python script` would run
    it, with stdin_text on stdin, answered as subprocess.run(..., capture_output=True, text=True,
    timeout=timeout) would answer it (TimeoutExpired included): forked from this process when that
    shares already imported packages, else in a fresh interpreter started through the verifying
    bootstrap. Either way the code comes from memory, never from the path (`script` names it in
    tracebacks), and the script's directory is not put on sys.path (the temp directory is anyone's:
    a module planted there would be imported first)."""
    if source is None:
        source = read_source(script)
    if not shares_imports():
        return run_fresh(script, source, stdin_text, timeout)
    return run_forked(script, stdin_text, timeout, source)


def read_source(script: str) -> str:
    fd = os.open(script, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        return f.read().decode("utf-8")


def run_fresh(
    script: str, source: str, stdin_text: str, timeout: float
) -> subprocess.CompletedProcess:
    """A new interpreter through the bootstrap (role `probe`), the source on an inherited
    descriptor."""
    from ..core.launch import relaunch

    # unnamed where the system allows (O_TMPFILE): nothing to swap
    with tempfile.TemporaryFile() as code:
        code.write(source.encode("utf-8"))
        code.flush()
        code.seek(0)
        argv = relaunch("probe", str(code.fileno()), script)
        proc = subprocess.run(
            argv,
            input=stdin_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            pass_fds=(code.fileno(),),
        )
    return subprocess.CompletedProcess(
        [sys.executable, script], proc.returncode, proc.stdout, proc.stderr
    )


@node_role("probe")
def probe_main(fd: str, script: str) -> int:
    """The probe's own process (the bootstrap's role `probe`): its source from the descriptor the
    verify process passed, run as __main__."""
    with os.fdopen(int(fd), "rb") as f:
        source = f.read().decode("utf-8")
    return run_main(source, script)


def run_main(source: str, script: str) -> int:
    """Run `source` as the __main__ module named `script`; its exit status (an uncaught exception:
    1, with its traceback on stderr, as `python script` shows it)."""
    import types

    main = types.ModuleType("__main__")
    main.__file__ = script
    sys.modules["__main__"] = main
    sys.argv = [script]
    try:
        exec(compile(source, script, "exec", dont_inherit=True), main.__dict__)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:  # shown on the probe's stderr, as an uncaught exception would be
        import traceback

        traceback.print_exception(
            type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None
        )
        return 1
    return 0


def run_forked(
    script: str, stdin_text: str, timeout: float, source: str | None = None
) -> subprocess.CompletedProcess:
    if source is None:
        source = read_source(script)
    with (
        tempfile.TemporaryFile() as fin,
        tempfile.TemporaryFile() as fout,
        tempfile.TemporaryFile() as ferr,
    ):
        fin.write(stdin_text.encode())
        fin.flush()
        fin.seek(0)
        _flush_std()
        pid = os.fork()
        if pid == 0:
            _child(script, source, fin.fileno(), fout.fileno(), ferr.fileno())  # never returns
        try:
            status = _wait(pid, timeout)
        except BaseException:  # interrupted (the client went away): the probe goes with us
            _kill(pid)
            raise
        fout.seek(0)
        ferr.seek(0)
        out = fout.read().decode("utf-8", "replace")
        err = ferr.read().decode("utf-8", "replace")
    if status is None:
        raise subprocess.TimeoutExpired([sys.executable, script], timeout, output=out, stderr=err)
    return subprocess.CompletedProcess(
        [sys.executable, script], os.waitstatus_to_exitcode(status), out, err
    )


def _child(script: str, source: str, fd_in: int, fd_out: int, fd_err: int) -> None:
    code = 1
    try:
        os.dup2(fd_in, 0)
        os.dup2(fd_out, 1)
        os.dup2(fd_err, 2)
        # fresh stream objects: the inherited ones may hold buffered bytes of the agent's own
        # request stream
        sys.stdin = io.TextIOWrapper(
            io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace"
        )
        sys.stdout = io.TextIOWrapper(
            io.FileIO(1, "w", closefd=False),
            encoding="utf-8",
            errors="replace",
            line_buffering=True,
        )
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False),
            encoding="utf-8",
            errors="backslashreplace",
            line_buffering=True,
        )
        signal.signal(signal.SIGINT, signal.default_int_handler)
        code = run_main(source, script)
    finally:
        _flush_std()
        os._exit(code)


def _flush_std() -> None:
    """Before a fork and before os._exit: buffered output is written once, by the process that made
    it."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or redirected away: nothing to keep
            pass


def _wait(pid: int, timeout: float) -> int | None:
    """The child's wait status, or None after killing it at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= deadline:
            _kill(pid)
            return None
        time.sleep(POLL_S)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


__all__ = ["probe_main", "run_forked", "run_script", "shares_imports"]
