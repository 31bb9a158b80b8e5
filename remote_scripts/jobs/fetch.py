"""`fetch`'s node side: which files may leave the node, and their size and sha256, before the client
copies them over SFTP. Stdlib only.

A file may be fetched when its real path (every symlink resolved) is under the state dir or under a
job's output directory; anything else only with any_path. A path that looks inside but resolves
outside (a symlink escape) is refused too. The hash covers the first `size` bytes as they were when
hashed, so a log that is still growing is copied and verified up to that point."""

from __future__ import annotations

import errno
import hashlib
import os
import stat

from ..core.nodeio import NodeError
from ..core.registry import node_op
from .outputs import manifest_of, run_jobs
from .records import (
    every_job,
    find_job,
    jobs_dir,
    log_paths,
    output_dir,
    record_dir,
    slurm_records_dir,
)

# typing.TYPE_CHECKING without importing typing: the agent's start-up imports only what it runs
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

HASH_CHUNK = 1 << 20
# One answer line lists every file of a fetched directory (~300 bytes each, under the client's 32
# MiB cap).
MAX_DIR_FILES = 50_000


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _hash_prefix(path: str) -> dict:
    """size, sha256 (of those bytes), mode, mtime of a regular file, opened without following a
    final symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return _hash_fd(fd, path)
    finally:
        os.close(fd)


def _hash_fd(fd: int, path: str) -> dict:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise NodeError(f"{path} is not a regular file", kind="refused")
    digest = hashlib.sha256()
    left = st.st_size
    while left > 0:
        chunk = os.read(fd, min(HASH_CHUNK, left))
        if not chunk:
            break
        digest.update(chunk)
        left -= len(chunk)
    return {
        "size": st.st_size - left,
        "sha256": digest.hexdigest(),
        "mode": stat.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
    }


def _roots(state_dir: str) -> list[tuple[str, str]]:
    """(real path, local folder prefix) of every place fetch may read without any_path: each job's
    output directory, then the state dir (jobs/<id>/ under it gets the job id as its folder)."""
    roots = []
    for job in every_job(state_dir):  # SSH and Slurm jobs alike
        out = output_dir(record_dir(state_dir, job), job)
        if out:
            roots.append((os.path.realpath(out), f"{job['id']}/output"))
    roots.append((os.path.realpath(state_dir), "state"))
    return roots


def _local_name(real: str, state_dir: str, roots: list[tuple[str, str]]) -> str:
    """Where under fetched/<host>/ the file goes: <job-id>/<file> for a job's own files,
    <job-id>/output/... for its output, state/... for the rest of the state dir, other/<absolute
    path> otherwise."""
    for store in (jobs_dir(state_dir), slurm_records_dir(state_dir)):
        store_real = os.path.realpath(store)
        if _under(real, store_real) and real != store_real:
            return os.path.relpath(real, store_real)
    for root, prefix in roots:
        if _under(real, root) and real != root:
            return f"{prefix}/{os.path.relpath(real, root)}"
    return "other/" + real.lstrip("/")


def _check(
    requested: str, base: str, state_dir: str, roots: list[tuple[str, str]], any_path: bool
) -> dict:
    path = os.path.normpath(os.path.join(base, requested))
    real = os.path.realpath(path)
    inside_as_named = any(_under(path, os.path.abspath(r)) for r, _ in roots) or _under(
        path, os.path.abspath(state_dir)
    )
    inside_really = any(_under(real, r) for r, _ in roots)
    allowed = ", ".join(sorted({r for r, _ in roots}))
    if not inside_really and not any_path:
        if inside_as_named and real != path:
            raise NodeError(
                f"{requested}: a symlink that leads outside the state and job directories (to "
                f"{real}); refused (fetch only reads under "
                f"{allowed}; --any-path to fetch it anyway)",
                kind="refused",
            )
        raise NodeError(
            f"{requested}: outside the state and job directories ({allowed}); refused (--any-path "
            "fetches any file the login user can read)",
            kind="refused",
        )
    if not os.path.exists(real):
        raise NodeError(f"{requested}: no such file on the node ({path})", kind="missing")
    if os.path.isdir(real):
        return {"requested": requested, "path": real, "directory": True}
    info = _hash_prefix(real)
    return {
        "requested": requested,
        "path": real,
        "local": _local_name(real, state_dir, roots),
        **info,
    }


def _manifest_runs(output: str) -> list[str] | None:
    """The job ids of the runs an output's manifest records (oldest first), or None when it cannot
    be read."""
    manifest = manifest_of(output)
    return None if manifest is None else [job for job in run_jobs(manifest) if job]


@node_op("fetch_plan", writes=True)
def fetch_plan(req: dict) -> dict:
    """The files to fetch (each: requested, path, local, size, sha256) or, per file, why not."""
    state_dir = os.path.abspath(req["state_dir"])
    paths = [str(p) for p in req.get("paths") or []]
    job_dir, job = None, None
    notes: list[str] = []
    try:
        job_dir, job = find_job(state_dir, req.get("job_id"))
    except NodeError:
        if not paths or req.get("job_id"):
            raise
    roots = _roots(state_dir)
    wanted: list[tuple[str, str]]  # (role, path)
    if paths:
        wanted = [("file", p) for p in paths]
    else:
        assert job is not None and job_dir is not None
        wanted = _job_files(job_dir, job, notes)
    any_path = bool(req.get("any_path"))
    files = []
    for role, path in wanted:
        try:
            files.extend(_plan_entry(role, path, job, state_dir, roots, any_path, notes))
        except NodeError as exc:
            files.append(
                {"role": role, "requested": path, "error": str(exc), "error_kind": exc.kind}
            )
        except OSError as exc:
            files.append(
                {
                    "role": role,
                    "requested": path,
                    "error": f"{path}: {exc.strerror or exc}",
                    "error_kind": "os",
                }
            )
    return {"ok": True, "job_id": job["id"] if job else None, "files": files, "notes": notes}


def _job_files(job_dir: str, job: dict, notes: list[str]) -> list[tuple[str, str]]:
    """A job's own files, (role, path): its logs, and its output's manifest when the manifest is
    this job's (`notes` says why there is none)."""
    wanted = [("log", log) for log in log_paths(job) or [os.path.join(job_dir, "output.log")]]
    out = output_dir(job_dir, job)
    if not out:
        notes.append(
            f"no manifest: job {job['id']} is a {job.get('kind')} job (only extract jobs write one)"
        )
        return wanted
    manifest = os.path.join(out, "manifest.json")
    if not os.path.exists(manifest):
        notes.append(f"no manifest yet in {out} (the extraction has not written one)")
        return wanted
    ran = _manifest_runs(out)
    if ran is None or job["id"] in ran:
        wanted.append(("manifest", manifest))
    else:
        # the output's manifest is another run's: this job was killed before it wrote its own
        notes.append(
            f"no manifest of job {job['id']}: the one in {out} is of "
            f"{', '.join(ran[-3:]) or 'no recorded job'} "
            f"(job {job['id']} ended before it wrote one)"
        )
    return wanted


def _plan_entry(
    role: str,
    path: str,
    job: dict | None,
    state_dir: str,
    roots: list[tuple[str, str]],
    any_path: bool,
    notes: list[str],
) -> list[dict]:
    """The entries one requested path gives: itself, or every file under a directory."""
    # a relative path is taken from the state dir: the same words work on every host
    entry = {"role": role, **_check(path, state_dir, state_dir, roots, any_path)}
    if entry.get("directory"):
        return directory_entries(entry, state_dir, roots, notes)
    if role == "manifest" and job is not None:
        entry["local"] = f"{job['id']}/manifest.json"
    return [entry]


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# a FIFO would block an open without it
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _walk_dir(top_fd: int, top: str, each: Callable[[str, int, str], None]) -> None:
    """each(relative name, directory descriptor, name in it) for everything under top that is not a
    directory, sorted (a directory's own entries, then its subdirectories). Every directory is
    opened O_NOFOLLOW relative to the descriptor of the one above: a subdirectory swapped for a
    symlink while the walk runs is never entered, it is an entry like any symlink (symlinked
    directories are never walked into: a link can loop or lead anywhere)."""
    count = 0

    def visit(fd: int, prefix: str) -> None:
        nonlocal count
        subdirs = []
        for name in sorted(os.listdir(fd)):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(name)
                continue
            count += 1
            if count > MAX_DIR_FILES:
                raise NodeError(
                    f"{top} holds more than {MAX_DIR_FILES:,} "
                    "files; fetch its subdirectories one by "
                    "one",
                    kind="refused",
                )
            each(prefix + name, fd, name)
        for name in subdirs:
            try:
                sub = os.open(name, _DIR, dir_fd=fd)
            except OSError as exc:
                # swapped for a link (or a file) since listed
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    each(prefix + name, fd, name)
                continue
            try:
                visit(sub, prefix + name + "/")
            finally:
                os.close(sub)

    visit(top_fd, "")


def _open_beneath(top_fd: int, rel: str) -> int:
    """`rel` (no symlink in it: a resolved path) opened from top's descriptor, one component at a
    time, never through a link: what a symlink inside the directory names, read from inside it
    only."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    fd = os.dup(top_fd)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], _FILE, dir_fd=fd) if parts else os.dup(fd)
    finally:
        os.close(fd)


def directory_entries(
    entry: dict, state_dir: str, roots: list[tuple[str, str]], notes: list[str]
) -> list[dict]:
    """Every file under a requested directory, each as _check's entry plus `dir` (the directory:
    requested, local) and `rel` (its name in it, '/'-separated). A symlink is followed only when it
    stays inside the directory (and read from inside it); one leading out is refused, a symlinked
    directory and anything not a regular file are skipped with a note. Read by descriptor all the
    way down (_walk_dir)."""
    top, requested = entry["path"], entry["requested"]
    local_top = next((prefix for root, prefix in roots if root == top), None) or _local_name(
        top, state_dir, roots
    )
    where = {"requested": requested, "local": local_top, "path": top}
    out: list[dict] = []

    def each(rel: str, dir_fd: int, name: str) -> None:
        base = {
            "role": entry["role"],
            "requested": f"{requested.rstrip('/')}/{rel}",
            "dir": where,
            "rel": rel,
        }
        path = os.path.join(top, rel)
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                real = os.path.realpath(path)
                if not _under(real, top):
                    out.append(
                        {
                            **base,
                            "error": f"{base['requested']}: a symlink that leads outside "
                            f"{requested} (to {real}); refused",
                            "error_kind": "refused",
                        }
                    )
                    return
                fd, path = _open_beneath(top_fd, os.path.relpath(real, top)), real
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(name, _FILE, dir_fd=dir_fd)
            else:
                fd = -1
            try:
                kind = os.fstat(fd).st_mode if fd >= 0 else st.st_mode
                if stat.S_ISDIR(kind):
                    notes.append(
                        f"{base['requested']}: a symlink to a "
                        f"directory; skipped (fetch {path} by name)"
                    )
                    return
                if not stat.S_ISREG(kind):  # a FIFO would block a read; a device is no file to copy
                    notes.append(f"{base['requested']}: not a regular file; skipped")
                    return
                info = _hash_fd(fd, path)
            finally:
                if fd >= 0:
                    os.close(fd)
        except NodeError as exc:
            out.append({**base, "error": str(exc), "error_kind": exc.kind})
            return
        except OSError as exc:
            out.append(
                {**base, "error": f"{base['requested']}: {exc.strerror or exc}", "error_kind": "os"}
            )
            return
        out.append({**base, "path": path, "local": f"{local_top}/{rel}", **info})

    top_fd = os.open(top, _DIR)
    try:
        _walk_dir(top_fd, top, each)
    finally:
        os.close(top_fd)
    if not out:
        notes.append(f"{requested}: an empty directory; nothing to fetch")
    return out
