"""`fetch`'s node side: which files may leave the node, and their size and sha256, before the client copies
them over SFTP. Stdlib only.

A file may be fetched when its real path (every symlink resolved) is under the state dir or under a job's
output directory; anything else only with any_path. A path that looks inside but resolves outside (a symlink
escape) is refused too. The hash covers the first `size` bytes as they were when hashed, so a log that is
still growing is copied and verified up to that point."""

from __future__ import annotations

import hashlib
import os
import stat

from ..core.nodeio import NodeError
from .outputs import read_manifest
from .records import every_job, find_job, jobs_dir, log_paths, output_dir, record_dir, slurm_records_dir

HASH_CHUNK = 1 << 20
# One answer line lists every file of a fetched directory (~300 bytes each, under the client's 32 MiB cap).
MAX_DIR_FILES = 50_000


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _hash_prefix(path: str) -> dict:
    """size, sha256 (of those bytes), mode, mtime of a regular file, opened without following a final symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
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
        return {"size": st.st_size - left, "sha256": digest.hexdigest(), "mode": stat.S_IMODE(st.st_mode),
                "mtime": st.st_mtime}
    finally:
        os.close(fd)


def _roots(state_dir: str) -> list[tuple[str, str]]:
    """(real path, local folder prefix) of every place fetch may read without any_path: each job's output
    directory, then the state dir (jobs/<id>/ under it gets the job id as its folder)."""
    roots = []
    for job in every_job(state_dir):  # SSH and Slurm jobs alike
        out = output_dir(record_dir(state_dir, job), job)
        if out:
            roots.append((os.path.realpath(out), f"{job['id']}/output"))
    roots.append((os.path.realpath(state_dir), "state"))
    return roots


def _local_name(real: str, state_dir: str, roots: list[tuple[str, str]]) -> str:
    """Where under fetched/<host>/ the file goes: <job-id>/<file> for a job's own files, <job-id>/output/...
    for its output, state/... for the rest of the state dir, other/<absolute path> otherwise."""
    for store in (jobs_dir(state_dir), slurm_records_dir(state_dir)):
        store_real = os.path.realpath(store)
        if _under(real, store_real) and real != store_real:
            return os.path.relpath(real, store_real)
    for root, prefix in roots:
        if _under(real, root) and real != root:
            return f"{prefix}/{os.path.relpath(real, root)}"
    return "other/" + real.lstrip("/")


def _check(requested: str, base: str, state_dir: str, roots: list[tuple[str, str]], any_path: bool) -> dict:
    path = os.path.normpath(os.path.join(base, requested))
    real = os.path.realpath(path)
    inside_as_named = any(_under(path, os.path.abspath(r)) for r, _ in roots) or _under(path, os.path.abspath(
        state_dir))
    inside_really = any(_under(real, r) for r, _ in roots)
    allowed = ", ".join(sorted({r for r, _ in roots}))
    if not inside_really and not any_path:
        if inside_as_named and real != path:
            raise NodeError(f"{requested}: a symlink that leads outside the state and job directories (to "
                            f"{real}); refused (fetch only reads under {allowed}; --any-path to fetch it anyway)",
                            kind="refused")
        raise NodeError(f"{requested}: outside the state and job directories ({allowed}); refused (--any-path "
                        "fetches any file the login user can read)", kind="refused")
    if not os.path.exists(real):
        raise NodeError(f"{requested}: no such file on the node ({path})", kind="missing")
    if os.path.isdir(real):
        return {"requested": requested, "path": real, "directory": True}
    info = _hash_prefix(real)
    return {"requested": requested, "path": real, "local": _local_name(real, state_dir, roots), **info}


def _manifest_runs(output: str) -> list[str] | None:
    """The job ids of the runs an output's manifest records (oldest first), or None when it cannot be read."""
    try:
        manifest = read_manifest(output)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    return [str(r.get("job")) for r in manifest.get("runs") or [] if isinstance(r, dict) and r.get("job")]


def fetch_plan(req: dict) -> dict:
    """The files to fetch (each: requested, path, local, size, sha256) or, per file, why not."""
    state_dir = os.path.abspath(req["state_dir"])
    paths = [str(p) for p in req.get("paths") or []]
    any_path = bool(req.get("any_path"))
    job_dir, job = None, None
    notes: list[str] = []
    try:
        job_dir, job = find_job(state_dir, req.get("job_id"))
    except NodeError:
        if not paths or req.get("job_id"):
            raise
    roots = _roots(state_dir)
    wanted: list[tuple[str, str]] = []  # (role, path)
    if paths:
        wanted = [("file", p) for p in paths]
    else:
        assert job is not None and job_dir is not None
        wanted += [("log", log) for log in log_paths(job) or [os.path.join(job_dir, "output.log")]]
        out = output_dir(job_dir, job)
        if out and os.path.exists(os.path.join(out, "manifest.json")):
            ran = _manifest_runs(out)
            if ran is None or job["id"] in ran:
                wanted.append(("manifest", os.path.join(out, "manifest.json")))
            else:  # the output's manifest is another run's: this job was killed before it wrote its own
                notes.append(f"no manifest of job {job['id']}: the one in {out} is of "
                             f"{', '.join(ran[-3:]) or 'no recorded job'} (job {job['id']} ended before it wrote "
                             "one)")
        elif out:
            notes.append(f"no manifest yet in {out} (the extraction has not written one)")
        else:
            notes.append(f"no manifest: job {job['id']} is a {job.get('kind')} job (only extract jobs write one)")
    base = state_dir  # a relative path is taken from the state dir: the same words work on every host
    files = []
    for role, path in wanted:
        try:
            entry = {"role": role, **_check(path, base, state_dir, roots, any_path)}
            if entry.get("directory"):
                files.extend(directory_entries(entry, state_dir, roots, notes))
                continue
            if role == "manifest" and job is not None:
                entry["local"] = f"{job['id']}/manifest.json"
            files.append(entry)
        except NodeError as exc:
            files.append({"role": role, "requested": path, "error": str(exc), "error_kind": exc.kind})
        except OSError as exc:
            files.append({"role": role, "requested": path, "error": f"{path}: {exc.strerror or exc}",
                          "error_kind": "os"})
    return {"ok": True, "job_id": job["id"] if job else None, "files": files, "notes": notes}


def _walk_dir(top: str) -> list[tuple[str, str]]:
    """(relative name, path) of everything under top that is not a directory, sorted; symlinked directories
    are listed as entries too (never walked into: a link can loop or lead anywhere)."""
    found: list[tuple[str, str]] = []
    for root, dirs, names in os.walk(top, followlinks=False):
        dirs.sort()
        links = [d for d in dirs if os.path.islink(os.path.join(root, d))]
        dirs[:] = [d for d in dirs if d not in links]
        for name in sorted(names + links):
            path = os.path.join(root, name)
            found.append((os.path.relpath(path, top), path))
            if len(found) > MAX_DIR_FILES:
                raise NodeError(f"{top} holds more than {MAX_DIR_FILES:,} files; fetch its subdirectories one by "
                                "one", kind="refused")
    return found


def directory_entries(entry: dict, state_dir: str, roots: list[tuple[str, str]], notes: list[str]) -> list[dict]:
    """Every file under a requested directory, each as _check's entry plus `dir` (the directory: requested,
    local) and `rel` (its name in it, '/'-separated). A symlink is followed only when it stays inside the
    directory; one leading out is refused, a symlinked directory and anything not a regular file are skipped
    with a note."""
    top, requested = entry["path"], entry["requested"]
    local_top = next((prefix for root, prefix in roots if root == top), None) or _local_name(top, state_dir, roots)
    where = {"requested": requested, "local": local_top, "path": top}
    out = []
    for rel, path in _walk_dir(top):
        rel = rel.replace(os.sep, "/")
        real = os.path.realpath(path)
        base = {"role": entry["role"], "requested": f"{requested.rstrip('/')}/{rel}", "dir": where, "rel": rel}
        if os.path.islink(path) and not _under(real, top):
            out.append({**base, "error": f"{base['requested']}: a symlink that leads outside {requested} (to "
                        f"{real}); refused", "error_kind": "refused"})
            continue
        try:
            st = os.stat(real)
            if stat.S_ISDIR(st.st_mode):
                notes.append(f"{base['requested']}: a symlink to a directory; skipped (fetch {real} by name)")
                continue
            if not stat.S_ISREG(st.st_mode):  # a FIFO would block the open; a device is no file to copy
                notes.append(f"{base['requested']}: not a regular file; skipped")
                continue
            info = _hash_prefix(real)
        except NodeError as exc:
            out.append({**base, "error": str(exc), "error_kind": exc.kind})
            continue
        except OSError as exc:
            out.append({**base, "error": f"{base['requested']}: {exc.strerror or exc}", "error_kind": "os"})
            continue
        out.append({**base, "path": real, "local": f"{local_top}/{rel}", **info})
    if not out:
        notes.append(f"{requested}: an empty directory; nothing to fetch")
    return out
