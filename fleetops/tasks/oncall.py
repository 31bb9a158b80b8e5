"""fetch: files from a node to the laptop over the run's one connection (SFTP).

By default the latest job's log and (for an extract job) its manifest go to
./fetched/<host>/<job-id>/; --path names other files (relative: to the node's state dir), which must
resolve under the state dir or a job's output directory unless --any-path. The node's agent says
which files may go and hashes them (`fetch_plan`, remote_scripts/jobs/fetch.py); the client copies
[0, size) into `<file>.part`, resuming a partial copy from its length, hashes what it wrote and
renames it into place only when the two sha256 agree."""

from __future__ import annotations

import hashlib
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from ..plans.localpath import UnsafeName, safe_join_relative
from ..results import EXIT_FAILED, EXIT_INTERRUPTED, Item, Result, Status
from ..results.events import CopyRestarted
from ..results.oncall import Fetched, FetchInterrupted
from ..wire.connector import Connector, TransportError
from .declare import HELP_JOB_ID, JSON, HostTask, Option
from .plan import Plan, UsageError, agent_error

if TYPE_CHECKING:
    from ..state import RunState

DEFAULT_DEST = "fetched"
PART = ".part"
# The node says how big each file is; a node is not trusted to fill the operator's disk. A log or a
# manifest is far below this; a larger file needs --max-size (e.g. --max-size 50G).
DEFAULT_MAX_SIZE = 1024**3
UNITS = {
    "": 1,
    "B": 1,
    "K": 1024,
    "KB": 1000,
    "KIB": 1024,
    "M": 1024**2,
    "MB": 1000**2,
    "MIB": 1024**2,
    "G": 1024**3,
    "GB": 1000**3,
    "GIB": 1024**3,
    "T": 1024**4,
    "TB": 1000**4,
    "TIB": 1024**4,
}


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
    unit = text[len(number) :].upper()
    try:
        size = float(number) * UNITS[unit]
    except (ValueError, KeyError):
        raise UsageError(
            f"fetch --max-size {value!r}: a size such as 500M, 20G or 1073741824"
        ) from None
    if size <= 0 or size != size or size == float("inf"):
        raise UsageError(f"fetch --max-size {value!r}: more than 0 bytes")
    return int(size)


def _fetch_plan(run: RunState, kwargs: dict) -> Plan:
    paths = _paths(kwargs.get("path"))
    max_size = parse_size(kwargs["max_size"]) if kwargs.get("max_size") else DEFAULT_MAX_SIZE
    dest = Path(str(kwargs.get("dest") or DEFAULT_DEST)).expanduser()
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"fetch --dest {dest}: exists and is not a directory")
    request = {
        "paths": paths,
        "any_path": bool(kwargs.get("any_path")),
        "job_id": kwargs.get("job_id") or None,
    }
    return Plan(
        "fetch_plan",
        request,
        600,
        None,
        options={
            **kwargs,
            "dest": str(dest.absolute()),
            "max_size": max_size,
            "max_size_given": str(kwargs["max_size"]) if kwargs.get("max_size") else None,
        },
    )


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


class Stopped(Exception):
    """Ctrl-C during a fetch: the copy stops where it is; `part` (None between files) stays for the
    next fetch to resume from its length."""

    def __init__(self, label: str, part: Path | None, have: int, size: int) -> None:
        super().__init__(label)
        self.label, self.part, self.have, self.size = label, part, have, size


def _symlink_between(folder: Path, final: Path) -> Path | None:
    """The first folder from `folder` down to final's parent that is a symlink (writing there could
    leave fetched/<host>/), else None."""
    here = folder
    for name in final.relative_to(folder).parts[:-1]:
        here = here / name
        if here.is_symlink():
            return here
    return None


def _local_for(entry: dict, folder: Path) -> Path:
    """Where a file goes: the node proposes a name under fetched/<host>/ and is never trusted to
    leave it; a directory's file goes under the directory's own copy, by its name in it (UnsafeName
    otherwise)."""
    if entry.get("dir"):
        top = safe_join_relative(folder, entry["dir"].get("local"), what="local name")
        return safe_join_relative(top, entry.get("rel"), what="name in the directory")
    return safe_join_relative(folder, entry.get("local"), what="local name")


def _fetch_one(run: RunState, node: Connector, entry: dict, folder: Path, max_size: int) -> Item:
    label = entry.get("requested") or entry.get("path") or "?"
    if entry.get("error"):
        error = str(entry["error"])
        return Item(
            label,
            Status.FAILED,
            error[len(label) + 2 :] if error.startswith(f"{label}: ") else error,
        )
    if run.interrupted.is_set():
        raise Stopped(label, None, 0, 0)
    try:
        final = _local_for(entry, folder)
    except (UnsafeName, AttributeError) as exc:
        return Item(label, Status.FAILED, f"the node proposed an unsafe {exc}; refused")
    refused = _size_refusal(label, entry, max_size)
    if refused is not None:
        return refused
    size, want = entry["size"], entry["sha256"]
    details = {"remote": entry["path"], "local": str(final), "bytes": size, "sha256": want}
    there = _already_there(label, folder, final, details)
    if there is not None:
        return there
    final.parent.mkdir(parents=True, exist_ok=True)
    part = final.with_name(final.name + PART)
    if final.is_symlink():
        return Item(label, Status.FAILED, f"{final} is a symlink; refusing to write through it")
    if part.is_symlink() or (part.exists() and not part.is_file()):
        return Item(
            label, Status.FAILED, f"{part} is not a plain file; remove it and run fetch again"
        )
    return _download(run, node, label, part, final, details)


def _size_refusal(label: str, entry: dict, max_size: int) -> Item | None:
    """A size and a hash the node gave that are not that, or a file over --max-size: refused."""
    size, want = entry.get("size"), entry.get("sha256")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(want, str):
        return Item(
            label,
            Status.FAILED,
            f"the node's size {size!r} or sha256 {want!r} for it is not a number of "
            "bytes and a hash; refused",
        )
    if size > max_size:
        return Item(
            label,
            Status.FAILED,
            f"{size:,} bytes ({_gib(size)}) is over the {_gib(max_size)} fetch takes "
            f"without asking; nothing downloaded (raise it: --max-size {-(-size // 1024**3)}G)",
            {"remote": entry.get("path"), "bytes": size, "max_size": max_size},
        )
    return None


def _already_there(label: str, folder: Path, final: Path, details: dict) -> Item | None:
    """A symlink on the way to the file (refused), or the file already fetched, whole."""
    link = _symlink_between(folder, final)
    if link is not None:
        return Item(label, Status.FAILED, f"{link} is a symlink; refusing to write through it")
    want = details["sha256"]
    if (
        final.is_file()
        and not final.is_symlink()
        and final.stat().st_size == details["bytes"]
        and sha256_file(final) == want
    ):
        return Item(
            label,
            Status.OK,
            f"already fetched: {final} has the same sha256 ({want[:16]}...); nothing to do",
            {**details, "fetched_bytes": 0},
        )
    return None


def _download(
    run: RunState, node: Connector, label: str, part: Path, final: Path, details: dict
) -> Item:
    """The file into `part`, resumed from what is there, checked against the node's sha256, then
    renamed to `final`."""
    size, want = details["bytes"], details["sha256"]
    if not part.exists():  # what comes off a node (logs, data) is the operator's alone to read
        os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    offset = part.stat().st_size
    if offset > size:
        offset = 0  # the node's file is shorter than our partial copy: it is another file now
    resumed_from = offset
    for attempt in (1, 2):
        fetched = _copy(run, node, details["remote"], label, part, offset, size)
        got = sha256_file(part)
        if got == want:
            break
        if attempt == 1 and offset > 0:  # the partial copy was of other bytes: start over once
            run.emit(CopyRestarted(node.host.name, label))
            offset = resumed_from = 0
            continue
        part.unlink(missing_ok=True)
        return Item(
            label,
            Status.FAILED,
            f"sha256 mismatch after download: node {want}, local {got}; the file "
            "changed on the node while it was read? Run fetch again",
            {**details, "local_sha256": got},
        )
    os.replace(part, final)
    how = f"resumed at byte {resumed_from}, " if resumed_from else ""
    return Item(
        label,
        Status.CHANGED,
        f"saved as {final} ({size} bytes; {how}sha256 {want[:16]}... verified on both ends)",
        {**details, "fetched_bytes": fetched, "resumed_from": resumed_from},
    )


def _copy(
    run: RunState, node: Connector, remote: str, label: str, part: Path, offset: int, size: int
) -> int:
    """[offset, size) of remote into part; Stopped at Ctrl-C (checked at every chunk, so the copy
    ends within a chunk and before the run closes the link under it)."""
    transfer = run.transfer(f"{node.host.name} {label}", size, offset)

    def progress(written: int) -> None:
        transfer(written)
        if run.interrupted.is_set():
            raise Stopped(label, part, offset + written, size)

    try:
        return node.download_to(remote, str(part), offset, size, progress)
    except TransportError as exc:
        # the run closed the link under the copy: what is in part stays
        if run.interrupted.is_set():
            raise Stopped(label, part, part.stat().st_size if part.exists() else 0, size) from None
        # the link is up, the node's file ended or failed: not the file planned (a
        if exc.kind == "remote":
            # directory on its path swapped for a link), no partial copy to keep
            part.unlink(missing_ok=True)
        raise
    finally:
        transfer.finish()


def _record(item: Item) -> dict:
    return {"requested": item.label, "status": item.status.value, "msg": item.msg, **item.details}


def run_fetch(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host.name
    answer, evidence = node.call("fetch_plan", plan.request, timeout=plan.timeout)
    if answer.get("error"):
        return agent_error(host, "fetch", answer)
    folder = Path(plan.options["dest"]) / _host_folder(host)
    max_size = plan.options["max_size"]
    files: list[dict] = []
    try:
        items = _fetch_entries(run, node, answer["files"], folder, max_size, files)
    except Stopped as stop:
        return _stopped(host, plan, stop, files, len(answer["files"]), folder)
    items += [Item("note", Status.OK, n) for n in answer.get("notes", [])]
    failed = [r for r in files if r["status"] == Status.FAILED.value]
    changed = [r for r in files if r["status"] == Status.CHANGED.value]
    job = (
        f" of job {answer['job_id']}" if answer.get("job_id") and not plan.request["paths"] else ""
    )
    fetched = Fetched(files, answer.get("job_id"), str(folder))
    if failed:
        shown = [i.msg for i in items if i.status is Status.FAILED][:5]
        msg = f"{len(failed)} of {len(files)} files not fetched{job}: " + "; ".join(shown)
        return Result(
            host,
            "fetch",
            Status.FAILED,
            msg,
            items,
            evidence=evidence,
            code=EXIT_FAILED,
            payload=fetched,
        )
    if not changed:
        msg = f"all {len(files)} files{job} already in {folder} with matching sha256; nothing to do"
        return Result(host, "fetch", Status.OK, msg, items, payload=fetched)
    msg = f"fetched {len(changed)} of {len(files)} files{job} into {folder}"
    return Result(host, "fetch", Status.CHANGED, msg, items, payload=fetched)


def _fetch_entries(
    run: RunState,
    node: Connector,
    entries: list[dict],
    folder: Path,
    max_size: int,
    files: list[dict],
) -> list[Item]:
    """Each file the node planned, then each directory's files; `files` gets each one's record as
    it is done, so a Ctrl-C (Stopped) leaves the list of those fetched so far."""
    items: list[Item] = []
    # a fetched directory (its local name) -> its files, in the node's order
    groups: dict[str, list[dict]] = {}
    for entry in entries:
        where = entry.get("dir")
        if isinstance(where, dict):
            groups.setdefault(str(where.get("local")), []).append(entry)
            continue
        item = _fetch_one(run, node, entry, folder, max_size)
        items.append(item)
        files.append(_record(item))
    for group in groups.values():
        items += fetch_dir(run, node, group, folder, max_size, files)
    return items


def fetch_dir(
    run: RunState,
    node: Connector,
    group: list[dict],
    folder: Path,
    max_size: int,
    files: list[dict],
) -> list[Item]:
    """Every file of one directory (appended to `files` as each ends, so an interrupt still counts
    them); one line for the directory, one per file that failed (the first few). When all are there,
    their sha256s are written beside the copy: <dir>.sha256, as `sha256sum` writes them (cd <dir>;
    sha256sum -c ../<dir>.sha256)."""
    where = group[0]["dir"]
    label = str(where.get("requested"))
    try:
        top = safe_join_relative(folder, where.get("local"), what="local name")
    except UnsafeName as exc:
        return [Item(label, Status.FAILED, f"the node proposed an unsafe {exc}; refused")]
    total = sum(e["size"] for e in group if isinstance(e.get("size"), int))
    if total > max_size:
        return [
            Item(
                label,
                Status.FAILED,
                f"{len(group)} files, {total:,} bytes ({_gib(total)}): over the {_gib(max_size)} "
                "fetch takes without asking; nothing downloaded (raise it: --max-size "
                f"{-(-total // 1024**3)}G)",
                {"bytes": total, "max_size": max_size},
            )
        ]
    records = []
    for entry in group:
        item = _fetch_one(run, node, entry, folder, max_size)
        record = {**_record(item), "dir": str(top), "rel": entry.get("rel")}
        records.append(record)
        files.append(record)
    failed = [r for r in records if r["status"] == Status.FAILED.value]
    new = sum(1 for r in records if r["status"] == Status.CHANGED.value)
    got = sum(r.get("fetched_bytes") or 0 for r in records)
    kept = len(records) - new - len(failed)
    counts = (
        f"{len(records)} files, {total:,} bytes: {new} fetched "
        f"({got:,} bytes), {kept} already there with the "
        "same sha256"
    )
    manifest = top.with_name(top.name + ".sha256")
    if failed:
        items = [
            Item(
                label,
                Status.FAILED,
                f"{counts}, {len(failed)} not fetched; no manifest written",
                {"dir": str(top), "files": len(records), "bytes": total},
            )
        ]
        return items + [
            Item(str(r["requested"]), Status.FAILED, f"{r['requested']}: {r['msg']}")
            for r in failed[:10]
        ]
    _write_manifest(manifest, top, records)
    status = Status.CHANGED if new else Status.OK
    return [
        Item(
            label,
            status,
            f"{counts}; sha256s in {manifest}",
            {"dir": str(top), "files": len(records), "bytes": total, "manifest": str(manifest)},
        )
    ]


def _write_manifest(manifest: Path, top: Path, records: list[dict]) -> None:
    """sha256sum's format, the names relative to the directory; written whole or not at all."""
    if manifest.is_symlink():
        manifest.unlink()
    tmp = manifest.with_name(f".{manifest.name}.{os.getpid()}.tmp")
    with open(
        os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8"
    ) as f:
        for r in sorted(records, key=lambda r: str(r["rel"])):
            f.write(f"{r['sha256']}  {r['rel']}\n")
    os.replace(tmp, manifest)


def resume_command(host: str, plan: Plan) -> str:
    """The command line that fetches the same files into the same folder (it resumes each partial
    copy)."""
    words = ["fab", "-H", host, "fetch"]
    for path in plan.request["paths"]:
        words += ["--path", path]
    if plan.request.get("job_id"):
        words += ["--job-id", str(plan.request["job_id"])]
    if plan.request.get("any_path"):
        words.append("--any-path")
    if plan.options.get("max_size_given"):
        words += ["--max-size", str(plan.options["max_size_given"])]
    words += ["--dest", plan.options["dest"]]
    return " ".join(shlex.quote(w) for w in words)


def _stopped(
    host: str, plan: Plan, stop: Stopped, files: list[dict], total: int, folder: Path
) -> Result:
    done = sum(1 for r in files if r["status"] in (Status.OK.value, Status.CHANGED.value))
    if stop.part is not None:
        where = (
            f"while copying {stop.label}: its partial copy "
            f"{stop.part} holds {stop.have:,} of {stop.size:,} bytes"
        )
        item = Item(
            stop.label,
            Status.FAILED,
            f"stopped at byte {stop.have:,} of {stop.size:,}; kept in {stop.part}",
        )
    else:
        where = "between two files"
        item = Item(stop.label, Status.FAILED, "not started")
    again = resume_command(host, plan)
    msg = (
        f"interrupted (Ctrl-C) {where}; {done} of {total} "
        f"files complete in {folder}; resume with: {again}"
    )
    return Result(
        host,
        "fetch",
        Status.FAILED,
        msg,
        [item],
        code=EXIT_INTERRUPTED,
        payload=FetchInterrupted(
            files=files,
            folder=str(folder),
            part=str(stop.part) if stop.part else None,
            part_bytes=stop.have,
            resume=again,
        ),
    )


# fetch writes only on the laptop and has no check mode: --dry is refused rather than silently
# copying.
TASKS = [
    HostTask(
        "fetch",
        _fetch_plan,
        run=run_fetch,
        writes=True,
        op="fetch_plan",
        result=Fetched,
        help="Download the latest job's log and manifest (or --path files or directories) to "
        "./fetched/HOST/JOB-ID/\nover SFTP: resumes a partial copy, sha256 checked on both "
        "ends, hosts in parallel; a directory's sha256s\ngo beside its copy (DIR.sha256). "
        "Ctrl-C prints the command that resumes.",
        options=(
            Option(
                "path",
                "a file or directory to fetch instead (repeatable; relative: to the node's "
                "state dir); it must be under the state dir or a job's output dir unless "
                "--any-path",
                iterable=True,
            ),
            Option(
                "any_path",
                "allow --path outside the state and job directories (any file the login "
                "user reads)",
                False,
            ),
            Option("job_id", HELP_JOB_ID),
            Option("dest", "local folder (default ./fetched; files go to DEST/HOST/...)"),
            Option(
                "max_size",
                "largest file taken, e.g. 500M, 20G (default 1G): a bigger one is refused "
                "before any byte is copied",
            ),
            JSON,
        ),
    ),
]
