"""What every part of the lab uses: its error, progress lines, loopback ports, and the shared base
venv that holds the heavy node packages (real vllm 0.16.0 + speculators 0.3.0)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

NODE_PACKAGES = {"vllm": "0.16.0", "speculators": "0.3.0"}
# The lab's second base: a newer real vLLM whose API moved under speculators 0.3.0
# (vllm.v1.request.Request no longer takes eos_token_id). The tests' mixed fleet and the new-version
# runbook put a node on it.
NEWER_NODE_PACKAGES = {"vllm": "0.17.0", "speculators": "0.3.0"}
OWN_PACKAGES = ("speculators",)  # copied into each node so patching one node never touches another


class LabError(Exception):
    pass


# The test suite sets these around a test that is not marked `lab` / `base_venv`
# (tests/conftest.py), with the test's name: such a test must build no lab and no base venv,
# whatever way it tries (a fixture, Lab.up, `fab lab.up` in a child process), so a test that needs
# them cannot hide in the suite's fast tier.
REFUSE_LAB = "FLEETOPS_LAB_REFUSED"
REFUSE_BASE = "FLEETOPS_BASE_VENV_REFUSED"


def refuse_if_asked(var: str, what: str, mark: str) -> None:
    who = os.environ.get(var)
    if who:
        raise LabError(
            f"{who} uses {what} but is not marked `{mark}`: take it through a fixture (lab, "
            "lab_project, lab_factory, lab_base, base_python), which marks the test, or mark "
            f"the test `pytest.mark.{mark}` (tests/README.md, test tiers)"
        )


Progress = Callable[[str], None]  # where the lab's progress lines go (say prints them)


def say(message: str) -> None:
    print(message, flush=True)


def base_dir() -> Path:
    override = os.environ.get("FLEETOPS_LAB_BASE")
    if override:
        return Path(override)
    pins = "-".join(f"{k}{v}" for k, v in NODE_PACKAGES.items())
    py = f"py{sys.version_info.major}.{sys.version_info.minor}"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "fleetops" / "lab" / f"base-{py}-{pins}"


def site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise LabError(f"no site-packages under {venv}")
    return found[0]


def ensure_base(progress: Callable[[str], None] = say) -> Path:
    """The shared venv with the heavy node packages (~11 GB, a few minutes the first time)."""
    refuse_if_asked(REFUSE_BASE, "the lab base venv", "base_venv")
    base = base_dir()
    marker = base / ".fleetops-complete"
    if marker.exists():
        return base
    python = base / "bin" / "python"
    if not python.exists():
        progress(f"lab: creating the shared node venv {base}")
        base.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(base)], check=True)
    pins = [f"{k}=={v}" for k, v in NODE_PACKAGES.items()]
    check = (
        "import importlib.metadata as m, sys; "
        "sys.exit(any(m.version(k) != v for k, v in %r.items()))"
    ) % NODE_PACKAGES
    if subprocess.run([str(python), "-c", check], capture_output=True).returncode != 0:
        progress(
            f"lab: installing {' '.join(pins)} into the shared "
            "node venv (first time only: ~11 GB, minutes)"
        )
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pins],
            check=True,
        )
    marker.write_text(json.dumps(NODE_PACKAGES) + "\n")
    return base


def parse_pins(**versions: str | None) -> dict[str, str]:
    """`vllm="0.17.0", speculators=None` -> the base's pins: each package at the version given, else
    the default base's (NODE_PACKAGES), in NODE_PACKAGES' order (the base's folder name depends on
    it)."""
    pins = {
        name: (versions.get(name) or default).strip() for name, default in NODE_PACKAGES.items()
    }
    for name, version in pins.items():
        if not version or any(c.isspace() or c in "=<>!~;,[]" for c in version):
            raise LabError(
                f"--{name} {version!r}: give one release, e.g. --{name} {NODE_PACKAGES[name]}"
            )
    return pins


def base_dir_for(pins: dict[str, str]) -> Path:
    """The cached venv for these pins, named like the default base (the default's own folder for its
    pins)."""
    if pins == NODE_PACKAGES:
        return base_dir()
    name = "-".join(f"{k}{v}" for k, v in pins.items())
    py = f"py{sys.version_info.major}.{sys.version_info.minor}"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "fleetops" / "lab" / f"base-{py}-{name}"


def base_pins(base: Path) -> dict[str, str]:
    """What a finished base holds (its marker), {} for one that is not finished."""
    try:
        pins = json.loads((base / ".fleetops-complete").read_text())
    except (OSError, ValueError):
        return {}
    return pins if isinstance(pins, dict) else {}


def ensure_base_for(pins: dict[str, str], progress: Callable[[str], None] = say) -> Path:
    """A faithful node venv for other pins: pip installs the packages with their real dependencies
    (its own torch and the rest), as an operator's node would have them. Cached like the default
    base, finished only when pip's install and `pip check` both passed (the marker is written last);
    two builders of one base take turns (a lock file beside it). ~11 GB and ~8 minutes the first
    time."""
    if pins == NODE_PACKAGES:
        return ensure_base(progress)
    refuse_if_asked(REFUSE_BASE, "a lab base venv", "base_venv")
    base = base_dir_for(pins)
    base.parent.mkdir(parents=True, exist_ok=True)
    with open(base.parent / f".{base.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if base_pins(base) == pins:
            return base
        _build_base(base, pins, progress)
    return base


def _build_base(base: Path, pins: dict[str, str], progress: Callable[[str], None]) -> None:
    python = base / "bin" / "python"
    if not python.exists():
        progress(f"lab: creating the node venv {base}")
        subprocess.run([sys.executable, "-m", "venv", str(base)], check=True)
    wanted = [f"{k}=={v}" for k, v in pins.items()]
    progress(
        f"lab: installing {' '.join(wanted)} with their dependencies into {base} (~11 GB, minutes)"
    )
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    if subprocess.run([*pip, "install", "-q", *wanted]).returncode != 0:
        raise LabError(
            f"pip could not install {' '.join(wanted)} into {base}: see pip's message above; "
            f"the venv is left unfinished (no marker) and the next build starts from it"
        )
    check = subprocess.run([*pip, "check"], capture_output=True, text=True)
    if check.returncode != 0:
        raise LabError(
            f"{base}: `pip check` finds unmet requirements, so this is no faithful node:\n"
            f"{check.stdout.strip()}"
        )
    (base / ".fleetops-complete").write_text(json.dumps(pins) + "\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def settle(find: Callable[[], list[int]], grace: float, timeout: float) -> list[int]:
    """Wait up to `grace` for the processes `find` names to exit on their own (a session or a job
    step's child on its way out takes seconds on a loaded machine), SIGKILL by pid those still
    there, then wait up to `timeout` for the kernel to take them. Returns what `find` still names:
    what a teardown may then call a leftover. `find` is asked again before each signal, so a pid
    that exited meanwhile is never signalled."""
    left = _wait_gone(find, grace)
    if left:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        left = _wait_gone(find, timeout)
    return left


def _wait_gone(find: Callable[[], list[int]], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = find()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = find()
    return left
