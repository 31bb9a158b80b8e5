"""How the agent's processes start (the bootstrap is remote_scripts/core/bootstrap.py).

- Interpreter: the bootstrap's check of the node's Python, run from the verified bytes after the zip
  was read and before `site` reads any .pth file (the agent's python starts with -S; the bootstrap
  runs site.main() once this passed): its executable, prefixes, every directory on sys.path, the
  site-packages directories and their .pth files must be owned by the connecting user or root and
  writable by no one else, like the state dir (a directory on the way may be sticky). With
  --allow-insecure-venv a refusal becomes a warning.
- relaunch(): the command that starts another process of this very agent (job keeper, extract, the
  Slurm batch step, verify's probe) through the bootstrap's text and the sha256 this process was
  verified against, never the zip by its path.

Stdlib only; the walk and its rules are the bootstrap's own (handed in: the bootstrap runs as
__main__)."""

from __future__ import annotations

import os
import sys

# typing.TYPE_CHECKING without importing typing: the agent's start-up imports only what it runs
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

VENV_FIX = (
    "a .pth file or module put there by another user would run as uid %d in every Python start: "
    "make it writable by its owner alone (chmod go-w {path}; reinstall the venv if you cannot "
    "tell what changed in it), or run again with --allow-insecure-venv to go on with a warning"
)


# The bootstrap's walk and its rules, handed in at every start (bootstrap.main): the node's writer
# (atomicio.open_write_dir) opens the directory it writes into by the same walk. None in a process
# the bootstrap did not start.
PATHS: tuple | None = None


class Interpreter:
    """Checks what this Python reads code from, each path once (`dirs`: the directories walks
    passed)."""

    def __init__(self, allow: bool, dirs: dict, walk, rules, refused) -> None:  # the bootstrap's
        self.allow, self.dirs, self.walk, self.rules, self.refused = (
            allow,
            dirs,
            walk,
            rules,
            refused,
        )
        self.warnings: list[str] = []
        self.seen: set[str] = set()
        self.allowed: set[object] = set()

    def check(self, path: str, role: str, final_dir: bool = True) -> None:
        if path in self.seen:
            return
        self.seen.add(path)
        try:
            fd = self.walk(
                path,
                self.rules(
                    role, "untrusted_venv", VENV_FIX % os.geteuid(), "the agent with this Python"
                ),
                final_dir,
                True,
                self.dirs,
            )
        except self.refused as exc:
            if not self.allow:
                raise
            # once per insecure path, however many lead there
            if exc.extra.get("path") not in self.allowed:
                self.allowed.add(exc.extra.get("path"))
                self.warnings.append(
                    f"--allow-insecure-venv: running anyway, as asked: {exc.reason}; a .pth file "
                    f"or module another user puts there runs as uid {os.geteuid()}"
                )
            return
        if fd is not None:
            os.close(fd)

    def before_site(self) -> None:
        """The executable, the prefixes, the standard library and the site-packages directories
        `site` would add (with their .pth files), while `site` has not run yet."""
        self.check(sys.executable, "the Python executable", final_dir=False)
        exe_dir = os.path.dirname(os.path.abspath(sys.executable))
        prefixes = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]
        for conf in (
            os.path.join(exe_dir, "pyvenv.cfg"),
            os.path.join(os.path.dirname(exe_dir), "pyvenv.cfg"),
        ):
            if os.path.lexists(conf):  # a venv: site.main() makes its directory the prefix
                self.check(conf, "the venv's pyvenv.cfg", final_dir=False)
                prefixes.insert(0, os.path.dirname(conf))
                break
        for prefix in prefixes:
            self.check(prefix, "the interpreter's prefix")
        for entry in sys.path:
            self.check(entry, "a directory on the interpreter's path")
        import site

        for directory in site.getsitepackages(prefixes):
            self.check(directory, "the interpreter's site-packages")
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            for name in sorted(names):
                if name.endswith(".pth"):
                    self.check(
                        os.path.join(directory, name),
                        "a .pth file in site-packages",
                        final_dir=False,
                    )

    def after_site(self) -> None:
        """Directories the .pth lines added to sys.path: modules are imported from them."""
        for entry in sys.path:
            self.check(entry, "a directory on the interpreter's path")


# A verdict is kept only for a zip whose ctime is this much older than now: a write in the very
# clock tick the zip was read in may leave its ctime as it was (the kernel's file times are coarse).
RACY_NS = 2 * 10**9


def keep_verdict(bin_fd: int, name: str, line: str) -> None:
    """Remember the sha256 the bootstrap computed for the agent's zip (bootstrap._verdict reads
    it): `line` names it and the zip's identity as read, its last word the zip's ctime. Written in
    bin/ by its descriptor under a temp name, 0600 whatever the umask, never through a symlink, then
    renamed over the old one; one that cannot be written only costs the next start its hashing.
    Closes bin_fd."""
    from time import time_ns

    tmp = f"{name}.{os.getpid()}.tmp"
    try:
        if time_ns() - int(line.split()[-1]) < RACY_NS:
            return
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=bin_fd,
        )
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, line.encode("ascii"))
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=bin_fd, dst_dir_fd=bin_fd)
    except OSError:
        try:
            os.unlink(tmp, dir_fd=bin_fd)
        except OSError:
            pass
    finally:
        os.close(bin_fd)


def relaunch(*role: str) -> list[str]:
    """The argv that starts another process of this very agent (a role: `wrap JOB_DIR`, `extract
    REQUEST`, ...; none: a serving agent) through the bootstrap, with the sha256 this process was
    verified against: the new process checks the interpreter and the state dir again and runs only
    those bytes."""
    loader = _agent_loader()
    if not getattr(loader, "sha256", "") or not hasattr(loader, "get_source"):
        raise RuntimeError(
            "this agent was not started through the verifying bootstrap; it cannot start another"
        )
    return [
        sys.executable,
        *loader.python_flags,
        "-c",
        loader.get_source("remote_scripts.core.bootstrap"),
        loader.state_dir,
        loader.pyz,
        loader.sha256,
        *loader.flags,
        *role,
    ]


def shown(argv: list[str]) -> list[str]:
    """A relaunch command as records and the operator see it: the bootstrap's text stands for
    itself."""
    if "-c" not in argv:
        return list(argv)
    at = argv.index("-c")
    return [*argv[: at + 1], "<fleetops bootstrap>", *argv[at + 2 :]]


def insecure_allowed() -> bool:
    """The operator said --allow-insecure-venv for this run (the bootstrap's flags)."""
    return "--allow-insecure-venv" in (getattr(_agent_loader(), "flags", None) or ())


def warn(line: str) -> None:
    """A line for the answer's warnings (what the node let pass because the operator said so),
    once."""
    warnings = getattr(_agent_loader(), "warnings", None)
    if isinstance(warnings, list) and line not in warnings:
        warnings.append(line)


def _agent_loader() -> Any:
    # The loader of the running agent's package: the bootstrap's Agent (it runs as __main__, so it
    # is known by what it holds, not by its class).
    return getattr(getattr(sys.modules.get("remote_scripts"), "__spec__", None), "loader", None)
