"""Whether a path on a node can be changed by anyone but root and the login user: judged from lstat
answers alone, so the client can ask them over SFTP as the login user before sudo runs anything
(docs/become.md).

`judge_interpreter` walks the inventory's `python:` one component at a time, as the kernel resolves
it: every directory on the way, every symlink's own directory, each symlink's target and its
directories in turn, and the file at the end. A path that someone else could change (a directory or
file writable by a group or by others, or owned by another user; a symlink that another user may
re-point) is refused with what was found and what to do. The venv's pyvenv.cfg (beside the
interpreter or one level up) is judged too: its `home` names the directory the interpreter takes its
standard library from. Pure: no network, no printing."""

from __future__ import annotations

import posixpath
import stat
from collections.abc import Callable
from dataclasses import dataclass

MAX_LINKS = 40  # the kernel's own limit on symlinks in one path resolution


@dataclass(frozen=True)
class Entry:
    """What lstat says about one path: its mode (type and permission bits) and owner."""

    mode: int
    uid: int
    gid: int


@dataclass(frozen=True)
class Untrusted:
    """Why a path is not trusted: the path, what was found, and the next step."""

    path: str
    why: str
    fix: str
    entry: Entry | None = None

    def describe(self) -> str:
        found = ""
        if self.entry is not None:
            found = (
                f" [mode {stat.filemode(self.entry.mode)} ({self.entry.mode & 0o7777:04o}), "
                f"owner uid {self.entry.uid}, group gid {self.entry.gid}]"
            )
        return f"{self.path} {self.why}{found}; {self.fix}"


Lstat = Callable[[str], "Entry | None"]  # None: no such path
Readlink = Callable[[str], str]


def writers_problem(
    path: str, entry: Entry, trusted: frozenset[int], *, on_way: bool, sticky_ok: bool
) -> str:
    """Why someone but the trusted users may change `path` (empty: no one may). A directory on the
    way may be writable by others when it is sticky (/tmp): they cannot replace what they do not
    own, and what it holds on the way is judged in turn."""
    where = "(on the way to the interpreter) " if on_way else ""
    if entry.uid not in trusted:
        return f"{where}is owned by uid {entry.uid}, neither root nor the login user"
    if entry.mode & 0o022 and not (
        sticky_ok and stat.S_ISDIR(entry.mode) and entry.mode & stat.S_ISVTX
    ):
        who = (
            "group (gid %d) and others" % entry.gid
            if entry.mode & 0o022 == 0o022
            else "its group (gid %d)" % entry.gid
            if entry.mode & 0o020
            else "others"
        )
        return f"{where}is writable by {who}"
    return ""


def _fix(path: str, entry: Entry) -> str:
    return (
        "whoever may write it can put code there that sudo runs as root: check who changed it "
        "(reinstall the venv if you cannot tell), then make it root's and writable by root "
        f"alone (chown root {path}; chmod go-w {path}), or "
        "give this host a `python:` no other user can change"
    )


def resolve(
    path: str, lstat: Lstat, readlink: Readlink, trusted: frozenset[int]
) -> tuple[str, Untrusted | None]:
    """`path` resolved component by component, each judged on the way. Returns the resolved path and
    the first problem (or None); a path that does not exist is a problem too."""
    if not path.startswith("/"):
        return path, Untrusted(
            path,
            "is not an absolute path",
            "sudo would look it up in its own secure_path, "
            "which fleetops cannot check: give this host's "
            "`python:` as an absolute path",
        )
    # the names still to walk, the next one last
    todo = _names_reversed(path)
    here = "/"
    refused = _root_problem(lstat, trusted, on_way=bool(todo))
    if refused is not None:
        return path, refused
    links = 0
    while todo:
        name = todo.pop()
        if name == "..":
            here = posixpath.dirname(here) or "/"
            continue
        full = posixpath.join(here, name)
        last = not todo
        entry = lstat(full)
        if entry is None:
            return full, Untrusted(
                full, "does not exist on the node", "check this host's `python:`"
            )
        if stat.S_ISLNK(entry.mode):
            links += 1
            target, refusal = _link(full, entry, links, readlink, trusted)
            if refusal is not None:
                return full, refusal
            if target.startswith("/"):
                here = "/"
            todo.extend(_names_reversed(target))
            continue
        if last:
            return full, _final(full, entry, trusted)
        refused = _on_the_way(full, entry, trusted)
        if refused is not None:
            return full, refused
        here = full
    return here, Untrusted(
        path, "names a directory, not an interpreter", "check this host's `python:`"
    )


def _names_reversed(path: str) -> list[str]:
    """A path's names, last first (`.` and empty ones left out)."""
    return [n for n in path.split("/")[::-1] if n not in ("", ".")]


def _root_problem(lstat: Lstat, trusted: frozenset[int], on_way: bool) -> Untrusted | None:
    """/ itself, judged as the directories on the way are."""
    root = lstat("/")
    if root is None:
        return Untrusted("/", "cannot be read", "check the node's SFTP server")
    problem = writers_problem("/", root, trusted, on_way=on_way, sticky_ok=on_way)
    if problem:
        return Untrusted("/", problem, _fix("/", root), root)
    return None


def _on_the_way(path: str, entry: Entry, trusted: frozenset[int]) -> Untrusted | None:
    """A component before the last: a directory only trusted users may write."""
    if not stat.S_ISDIR(entry.mode):
        return Untrusted(path, "is not a directory", "check this host's `python:`", entry)
    problem = writers_problem(path, entry, trusted, on_way=True, sticky_ok=True)
    if problem:
        return Untrusted(path, problem, _fix(path, entry), entry)
    return None


def _link(
    path: str, entry: Entry, links: int, readlink: Readlink, trusted: frozenset[int]
) -> tuple[str, Untrusted | None]:
    """A symlink's target. The link itself cannot be rewritten, only replaced by whoever may write
    its directory (judged on the way); in a sticky directory others may write, the link must also be
    a trusted user's."""
    target = readlink(path)
    if links > MAX_LINKS:
        return target, Untrusted(
            path,
            f"is one symlink too many (more than {MAX_LINKS})",
            "give the path without symlink loops",
            entry,
        )
    if entry.uid not in trusted:
        return target, Untrusted(
            path,
            f"is a symlink owned by uid {entry.uid}, who may point it anywhere",
            f"give the path without it (its target is {target})",
            entry,
        )
    return target, None


def _final(path: str, entry: Entry, trusted: frozenset[int]) -> Untrusted | None:
    problem = writers_problem(path, entry, trusted, on_way=False, sticky_ok=False)
    if problem:
        return Untrusted(path, problem, _fix(path, entry), entry)
    if not stat.S_ISREG(entry.mode):
        return Untrusted(path, "is not a regular file", "check this host's `python:`", entry)
    return None


def judge_interpreter(
    python: str, lstat: Lstat, readlink: Readlink, trusted: frozenset[int]
) -> Untrusted | None:
    """The first reason someone but root and the login user (`trusted`: their uids) may change what
    `sudo PYTHON` runs, or None."""
    _, problem = resolve(python, lstat, readlink, trusted)
    if problem is not None:
        return problem
    bindir = posixpath.dirname(posixpath.normpath(python))
    for conf in (
        posixpath.join(bindir, "pyvenv.cfg"),
        posixpath.join(posixpath.dirname(bindir), "pyvenv.cfg"),
    ):
        if lstat(conf) is None:
            continue
        _, problem = resolve(conf, lstat, readlink, trusted)
        return problem
    return None


def judge_read(
    path: str, lstat: Lstat, readlink: Readlink, trusted: frozenset[int]
) -> Untrusted | None:
    """become: whether the login user's read of `path` by name (SFTP opens by path, and can neither
    open by descriptor nor refuse a symlink) reads what the node listed: every directory on the way
    may be changed by root and the login user alone (sticky ones allowed), and nothing on the way is
    a symlink (the node listed the real path). None when so."""
    real, problem = resolve(path, lstat, readlink, trusted)
    fix = (
        "fleetops reads a node's file by its path as the login user and never through a place "
        "another user can change (a swap there could hand it another file): make the directories "
        "of the path writable by root and the login user "
        "alone, or copy the file into the state dir first"
    )
    if problem is not None:
        why = problem.why.replace("(on the way to the interpreter) ", "(on the way to the file) ")
        if "does not exist" in why or "is not a directory" in why:
            return Untrusted(
                problem.path,
                why + " (it changed since the node listed it)",
                "run fetch again",
                problem.entry,
            )
        return Untrusted(problem.path, why, fix, problem.entry)
    if real != posixpath.normpath(path):
        return Untrusted(
            path, f"is reached through a symlink (to {real}) since the node listed it", fix
        )
    return None
