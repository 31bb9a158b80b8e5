"""Ctrl-C at a sweep of moments after a program starts: what each moment gave, for the start-up
tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# Frames of Python's own start-up, before the interpreter runs any line of the program: site
# processing the checkout's editable-install .pth (an installed wheel has none). Nothing a program
# can catch there.
_SITE = re.compile(r'File "<frozen site>"')
_SCRIPT = re.compile(r'File "[^"]*/bin/(fleet|fab)", line \d+, in <module>')
_PROGRAM_FRAME = re.compile(r'File "[^"]*/(fleetops|fabric|invoke|paramiko)/')
# CPython's own initialisation (creating sys.stdin/stdout/stderr, importing its core modules) cut
# short: it says so in a fatal error with the runtime not yet initialised, and exits 1 before any
# line of the program ran.
_CORE_INIT = re.compile(
    r"^Fatal Python error: init_\w+: .*\nPython runtime state: (core initialized|"
    r"preinitialized|initializing)$",
    re.M,
)


@dataclass
class Moment:
    delay: float
    code: int | None
    stderr: str
    finished_first: bool  # the program had ended before the signal was sent
    stdout: str = ""

    def describe(self) -> str:
        return f"SIGINT at {self.delay:.2f}s: exit {self.code}; stderr: {self.stderr[-600:]!r}"

    @property
    def before_the_program(self) -> bool:
        """The signal came before the interpreter ran a line of the program: killed by it before
        Python set its handler (the shell says 130 all the same, and nothing is printed), or a
        KeyboardInterrupt inside the interpreter's own start-up (site) or the console script's own
        imports, with no frame of the program's."""
        if self.code == -signal.SIGINT and not self.stderr:
            return True
        # site's start-up (a frame of it, or the interpreter's own fatal error when site could not
        # be imported), or the console script pip wrote (`import re` before it imports the program)
        # ; or one CPython swallowed in its own import machinery ("Exception ignored in" a module
        # lock's callback)
        # ; or one in CPython's own look at argv[0] before the program (it says "Failed checking
        # if argv[0] is an import path entry" and goes on: the program then runs uninterrupted); or
        # a bare "KeyboardInterrupt" and exit 1, CPython's word for one that came before the first
        # line of the program (the program's own answer is the one line and 130)
        interrupted = "KeyboardInterrupt" in self.stderr and (
            _SITE.search(self.stderr)
            or _SCRIPT.search(self.stderr)
            or "init_import_site" in self.stderr
            or "Exception ignored in: <function _get_module_lock" in self.stderr
            or _CORE_INIT.search(self.stderr)
            or "Failed checking if argv[0] is an import path entry" in self.stderr
            or (self.code == 1 and self.stderr.strip() == "KeyboardInterrupt")
        )
        return bool(interrupted) and not _PROGRAM_FRAME.search(self.stderr)


def sigint_at(
    argv: list[str], cwd: Path, delay: float, env: dict | None = None, timeout: float = 60
) -> Moment:
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "FLEETOPS_NO_LIVE": "1", **(env or {})},
    )
    time.sleep(delay)
    finished_first = proc.poll() is not None
    if not finished_first:
        proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(
            f"still running {timeout}s after SIGINT at {delay}s: {err[-600:]}"
        ) from None
    return Moment(delay, proc.returncode, err, finished_first, out)


def sweep(start: float, stop: float, steps: int) -> list[float]:
    return [round(start + (stop - start) * i / (steps - 1), 3) for i in range(steps)]


def run_span(argv: list[str], cwd: Path, env: dict | None = None, timeout: float = 120) -> float:
    """How long one uninterrupted run takes on this machine now: a sweep over a fixed window would
    fall wholly inside Python's own start-up on a loaded machine and test nothing."""
    started = time.monotonic()
    subprocess.run(
        argv,
        cwd=cwd,
        capture_output=True,
        timeout=timeout,
        env={**os.environ, "FLEETOPS_NO_LIVE": "1", **(env or {})},
    )
    return time.monotonic() - started


def sweep_over(span: float, steps: int) -> list[float]:
    """Moments from the very start to just past the end of a run that takes `span` seconds."""
    return sweep(min(0.05, span / 20), span * 1.05, steps)
