"""fetch: files from a node to the laptop over the run's one connection (SFTP).

By default the latest job's log and (for an extract job) its manifest go to ./fetched/<host>/<job-id>/;
--path names other files (relative: to the node's state dir), which must resolve under the state dir or a
job's output directory unless --any-path. The node's agent says which files may go and hashes them
(`fetch_plan`, remote_scripts/jobs/fetch.py); the client copies [0, size) into `<file>.part`, resuming a partial
copy from its length, hashes what it wrote and renames it into place only when the two sha256 agree."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..plans.localpath import UnsafeName, safe_join_relative
from ..results import EXIT_FAILED, Item, Result, Status
from ..wire.connector import Connector
from .plan import Plan, TaskSpec, UsageError, agent_error

if TYPE_CHECKING:
    from ..state import RunState

DEFAULT_DEST = "fetched"
PART = ".part"
# The node says how big each file is; a node is not trusted to fill the operator's disk. A log or a manifest
# is far below this; a larger file needs --max-size (e.g. --max-size 50G).
DEFAULT_MAX_SIZE = 1024**3
UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1000, "KIB": 1024, "M": 1024**2, "MB": 1000**2, "MIB": 1024**2,
         "G": 1024**3, "GB": 1000**3, "GIB": 1024**3, "T": 1024**4, "TB": 1000**4, "TIB": 1024**4}


def _paths(value: object) -> list[str]:
    if value in (None, "", [], ()):
        return []
    items = [value] if isinstance(value, str) else list(value)  # type: ignore[call-overload]
    out = []
    for item in items:
        text = str(item)
        if not text.strip() or "\x00" in text or "\n" in text:
            raise UsageError(f"fetch --path {text!r}: not a file path")
        out.append(text)
    return out


def parse_size(value: object) -> int:
    """--max-size: bytes, or a number with K/M/G/T (powers of 1024; KB/MB/GB/TB: of 1000)."""
    text = str(value).strip().replace("_", "")
    number = text.rstrip("BbKkMmGgTtIi")
    unit = text[len(number):].upper()
    try:
        size = float(number) * UNITS[unit]
    except (ValueError, KeyError):
        raise UsageError(f"fetch --max-size {value!r}: a size such as 500M, 20G or 1073741824") from None
    if size <= 0 or size != size or size == float("inf"):
        raise UsageError(f"fetch --max-size {value!r}: more than 0 bytes")
    return int(size)


def _fetch_plan(run: RunState, kwargs: dict) -> Plan:
    paths = _paths(kwargs.get("path"))
    max_size = parse_size(kwargs["max_size"]) if kwargs.get("max_size") else DEFAULT_MAX_SIZE
    dest = Path(str(kwargs.get("dest") or DEFAULT_DEST)).expanduser()
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"fetch --dest {dest}: exists and is not a directory")
    request = {"paths": paths, "any_path": bool(kwargs.get("any_path")), "job_id": kwargs.get("job_id") or None}
    return Plan("fetch_plan", request, 600, None,
                options={**kwargs, "dest": str(dest.absolute()), "max_size": max_size})


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _host_folder(name: str) -> str:
    return name.replace("/", "_") if name not in (".", "..") else f"_{name}"


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


def _fetch_one(run: RunState, node: Connector, entry: dict, folder: Path, max_size: int) -> Item:
    host = node.host.name
    label = entry.get("requested") or entry.get("path") or "?"
    if entry.get("error"):
        error = str(entry["error"])
        return Item(label, Status.FAILED, error[len(label) + 2:] if error.startswith(f"{label}: ") else error)
    try:  # the node proposes where the file goes under fetched/<host>/; never trusted to leave that folder
        final = safe_join_relative(folder, entry.get("local"), what="local name")
    except UnsafeName as exc:
        return Item(label, Status.FAILED, f"the node proposed an unsafe {exc}; refused")
    part = final.with_name(final.name + PART)
    size, want = entry.get("size"), entry.get("sha256")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(want, str):
        return Item(label, Status.FAILED, f"the node's size {size!r} or sha256 {want!r} for it is not a number of "
                    "bytes and a hash; refused")
    if size > max_size:
        return Item(label, Status.FAILED, f"{size:,} bytes ({_gib(size)}) is over the {_gib(max_size)} fetch takes "
                    f"without asking; nothing downloaded (raise it: --max-size {-(-size // 1024**3)}G)",
                    {"remote": entry.get("path"), "bytes": size, "max_size": max_size})
    details = {"remote": entry["path"], "local": str(final), "bytes": size, "sha256": want}
    if final.is_file() and final.stat().st_size == size and sha256_file(final) == want:
        return Item(label, Status.OK, f"already fetched: {final} has the same sha256 ({want[:16]}...); nothing to do",
                    {**details, "fetched_bytes": 0})
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.is_symlink():
        return Item(label, Status.FAILED, f"{final} is a symlink; refusing to write through it")
    if part.is_symlink() or (part.exists() and not part.is_file()):
        return Item(label, Status.FAILED, f"{part} is not a plain file; remove it and run fetch again")
    if not part.exists():  # what comes off a node (logs, data) is the operator's alone to read
        os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    offset = part.stat().st_size
    if offset > size:
        offset = 0  # the node's file is shorter than our partial copy: it is another file now
    resumed_from = offset
    for attempt in (1, 2):
        transfer = run.transfer(f"{host} {label}", size, offset)
        try:
            fetched = node.download_to(entry["path"], str(part), offset, size, transfer)
        finally:
            transfer.finish()
        got = sha256_file(part)
        if got == want:
            break
        if attempt == 1 and offset > 0:  # the partial copy was of other bytes: start over once
            run.reporter.note(f"{host} | {label}: the partial copy did not match the node's file; downloading it "
                              "again from byte 0")
            offset = resumed_from = 0
            continue
        part.unlink(missing_ok=True)
        return Item(label, Status.FAILED, f"sha256 mismatch after download: node {want}, local {got}; the file "
                    "changed on the node while it was read? Run fetch again", {**details, "local_sha256": got})
    os.replace(part, final)
    how = f"resumed at byte {resumed_from}, " if resumed_from else ""
    return Item(label, Status.CHANGED, f"saved as {final} ({size} bytes; {how}sha256 {want[:16]}... verified on "
                "both ends)",
                {**details, "fetched_bytes": fetched, "resumed_from": resumed_from})


def run_fetch(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host.name
    answer, evidence = node.call("fetch_plan", plan.request, timeout=plan.timeout)
    if answer.get("error"):
        return agent_error(host, "fetch", answer)
    folder = Path(plan.options["dest"]) / _host_folder(host)
    items = [_fetch_one(run, node, entry, folder, plan.options["max_size"]) for entry in answer["files"]]
    items += [Item("note", Status.OK, n) for n in answer.get("notes", [])]
    files = [{"requested": i.label, "status": i.status.value, "msg": i.msg, **i.details} for i in items
             if i.label != "note"]
    failed = [i for i in items if i.status is Status.FAILED]
    changed = [i for i in items if i.status is Status.CHANGED]
    job = f" of job {answer['job_id']}" if answer.get("job_id") and not plan.request["paths"] else ""
    where = f"into {folder}"
    if failed:
        msg = f"{len(failed)} of {len(files)} files not fetched{job}: " + "; ".join(i.msg for i in failed)
        return Result(host, "fetch", Status.FAILED, msg, items, evidence=evidence, code=EXIT_FAILED,
                      data={"files": files, "job_id": answer.get("job_id"), "folder": str(folder)})
    status = Status.CHANGED if changed else Status.OK
    msg = (f"fetched {len(changed)} of {len(files)} files{job} {where}" if changed else
           f"all {len(files)} files{job} already in {folder} with matching sha256; nothing to do")
    return Result(host, "fetch", status, msg, items,
                  data={"files": files, "job_id": answer.get("job_id"), "folder": str(folder)})


# fetch writes only on the laptop and has no check mode: --dry is refused rather than silently copying.
TASKS = [TaskSpec("fetch", _fetch_plan, run=run_fetch, dry=None)]
