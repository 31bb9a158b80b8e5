"""What an importing check would run, checked before it runs: every directory and file on the import
path of the modules a playbook names (package directories, namespace-package parts, `.py` files,
`__pycache__/` and its `.pyc` files, extension modules) and then the rest of the site-packages
directories those modules were found in (what they import in turn, and the `*.dist-info` entry
points libraries load plugins from), found without importing anything (PathFinder.find_spec on the
top-level name).

A writer other than root and the login user (the agent's own uid; under sudo, SUDO_UID too) is
refused with the path, its mode and owner: whoever may change one of those files runs code in the
agent's process, as root under `become: sudo`. --allow-insecure-venv (the bootstrap's flag) turns
the refusal into a warning.

Only the ops that import the venv's packages walk (verify's import, callsites and probe checks,
extract's preflight, the extraction driver): an agent start and every other op pay nothing. Stdlib
only."""

from __future__ import annotations

import importlib.machinery
import os
import stat
import sys

from .nodeio import NodeError

# bootstrap.ALLOW_INSECURE_VENV: the bootstrap runs as __main__
ALLOW_FLAG = "--allow-insecure-venv"


def trusted_uids() -> frozenset[int]:
    """Root and the login user: the agent's own uid, and under sudo the uid sudo was called by."""
    uids = {0, os.geteuid()}
    if os.geteuid() == 0 and os.getuid() == 0:
        sudo_uid = os.environ.get("SUDO_UID", "")
        if sudo_uid.isdigit():
            uids.add(int(sudo_uid))
    return frozenset(uids)


def writers_problem(st: os.stat_result, trusted: frozenset[int]) -> str:
    """Why someone but the trusted users may change what `st` describes ("" when no one may). No
    sticky exception: in a sticky package directory others could still add the module an import
    looks for."""
    if st.st_uid not in trusted:
        return "is owned by uid %d, neither root nor the login user" % st.st_uid
    if st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode):
        if st.st_mode & 0o022 == 0o022:
            return "is writable by its group (gid %d) and by others" % st.st_gid
        return (
            "is writable by its group (gid %d)" % st.st_gid
            if st.st_mode & 0o020
            else "is writable by others"
        )
    return ""


def import_roots(names: list[str]) -> tuple[list[str], list[str]]:
    """The paths the named modules import from (their top-level package's directories, or a module's
    file and the bytecode Python would take for it), and the directories they were found in."""
    roots: list[str] = []
    found_in: list[str] = []
    for top in sorted({name.split(".")[0] for name in names if name}):
        spec = importlib.machinery.PathFinder.find_spec(top)
        if spec is None:
            continue  # not installed: the check fails for that by itself
        if spec.submodule_search_locations:
            places = [str(p) for p in spec.submodule_search_locations]
        elif spec.origin and os.path.isabs(spec.origin):
            where = os.path.dirname(spec.origin)
            cache = os.path.join(where, "__pycache__")
            places = [spec.origin, cache]
            try:
                places += [
                    os.path.join(cache, n)
                    for n in sorted(os.listdir(cache))
                    if n.split(".")[0] == top
                ]
            except OSError:
                pass
        else:
            continue  # built in or frozen: the interpreter's own
        for place in places:
            if place not in roots:
                roots.append(place)
            parent = os.path.dirname(place.rstrip("/"))
            if parent not in found_in:
                found_in.append(parent)
    return roots, found_in


def find_untrusted(
    roots: list[str], trusted: frozenset[int]
) -> tuple[str, str, os.stat_result] | None:
    """The first path under `roots` (each walked whole; a symlink's target judged, with its
    directories, and walked in turn) that someone but the trusted users may change: (path, why, its
    lstat), else None."""
    seen: set[tuple[int, int]] = set()
    todo: list[tuple[str, os.stat_result | None]] = [(root, None) for root in reversed(roots)]
    while todo:
        path, st = todo.pop()
        if st is None:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
        if stat.S_ISLNK(st.st_mode):
            found = _link_problem(path, st, trusted)
            if found is not None:
                return found
            todo.append((os.path.realpath(path), None))
            continue
        is_dir = stat.S_ISDIR(st.st_mode)
        if is_dir:
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
        if st.st_uid not in trusted or st.st_mode & 0o022:
            return path, writers_problem(st, trusted), st
        if is_dir:
            try:
                with os.scandir(path) as entries:
                    for entry in entries:  # one lstat each, from the directory entry
                        todo.append((entry.path, entry.stat(follow_symlinks=False)))
            except OSError as exc:
                raise NodeError(
                    "cannot check %s before importing from it: %s" % (path, exc.strerror),
                    kind="untrusted_venv",
                    path=path,
                ) from None
    return None


def _link_problem(
    path: str, st: os.stat_result, trusted: frozenset[int]
) -> tuple[str, str, os.stat_result] | None:
    problem = writers_problem(st, trusted)
    if problem:
        return path, "(a symlink) " + problem, st
    return _target_problem(path, trusted)


def _target_problem(link: str, trusted: frozenset[int]) -> tuple[str, str, os.stat_result] | None:
    """A symlink inside a package: the directories its target sits in, up to /, must be trusted too
    (one on the way may be sticky)."""
    real = os.path.realpath(link)
    parent = os.path.dirname(real)
    while True:
        try:
            st = os.lstat(parent)
        except OSError:
            return None
        problem = writers_problem(st, trusted)
        if problem and not (st.st_mode & stat.S_ISVTX and st.st_uid in trusted):
            return (
                parent,
                "(a directory on the way to %s, the target of %s) %s" % (real, link, problem),
                st,
            )
        if parent == "/":
            return None
        parent = os.path.dirname(parent)


def _allowed() -> bool:
    loader = getattr(getattr(sys.modules.get("remote_scripts"), "__spec__", None), "loader", None)
    return ALLOW_FLAG in (getattr(loader, "flags", None) or ())


def check_before_import(names: list[str], doing: str) -> list[str]:
    """Before `doing` (an op that imports the named modules as this process's user): refuse, with
    NodeError naming path, mode and owner, when anyone but root and the login user may change what
    it would import. Returns the warnings to report (with --allow-insecure-venv, the refusal that
    was let pass)."""
    trusted = trusted_uids()
    roots, found_in = import_roots(names)
    found = find_untrusted(roots + [p for p in found_in if p not in roots], trusted)
    if found is None:
        return []
    path, why, st = found
    mode = "%04o" % (st.st_mode & 0o7777)
    uid = os.geteuid()
    reason = _reason(path, why, st)
    if _allowed():
        return [
            "--allow-insecure-venv: importing anyway, as asked: "
            "%s; code another user puts there runs as uid %d" % (reason, uid)
        ]
    raise NodeError(
        "refusing to %s as uid %d: %s; whoever may write it can run code as uid %d in fleetops' "
        "agent. Check who changed it (reinstall the venv if you cannot tell), make it writable "
        "by its owner alone (chmod -R go-w %s) and owned by root or the login user, or run again "
        "with --allow-insecure-venv to go on with a warning" % (doing, uid, reason, uid, path),
        kind="untrusted_venv",
        path=path,
        mode=mode,
        uid=st.st_uid,
    )


def _reason(path: str, why: str, st: os.stat_result) -> str:
    return "%s %s [mode %s (%04o), owner uid %d]" % (
        path,
        why,
        stat.filemode(st.st_mode),
        st.st_mode & 0o7777,
        st.st_uid,
    )


def ping_warnings(names: object) -> list[str]:
    """ping: what verify's importing checks would refuse, as a warning, importing nothing and
    refusing nothing. Only the named modules' own paths and the directories they sit in are walked
    (ping stays quick); verify walks the rest of those directories too."""
    if not isinstance(names, list):
        return []
    trusted = trusted_uids()
    try:
        roots, found_in = import_roots([n for n in names if isinstance(n, str)][:64])
        found = find_untrusted(roots, trusted)
        for where in found_in:
            if found is None:
                st = os.lstat(where)
                problem = writers_problem(st, trusted)
                found = (where, problem, st) if problem else None
    except (OSError, NodeError) as exc:
        return ["cannot check what verify would import: %s" % exc]
    if found is None:
        return []
    return [
        "verify's importing checks would refuse to import as uid %d: %s; whoever may write it "
        "can run code in fleetops' agent (chmod -R go-w %s, owned by root or the login user)"
        % (os.geteuid(), _reason(*found), found[0])
    ]
