"""A job's log as the client reads it (stdlib only): tail by byte offset (whole lines; a very long
line shown cut, never holding back the ones after it), where an attaching tail starts, the last
lines, the last progress line."""

from __future__ import annotations

import io
import os
import re
import time

from ..core.registry import node_op
from .liveness import job_state
from .records import file_size, load_job

TAIL_CHUNK = 256 * 1024
# a log line longer than this is shown cut: its first and last LINE_KEEP bytes
LONG_LINE = 16 * 1024
LINE_KEEP = 4096
LINE_SCAN = 64 * 1024 * 1024  # how far one tail poll reads for the end of a long line
DEFAULT_TAIL_LINES = 20
COUNT_LINES_MAX = 64 * 1024 * 1024  # skipped lines are counted up to this many bytes
MASK = b"[secret]"  # what the client's redaction writes for a secret value, too
MASK_VALUES = 256  # values one request may ask to mask; each at most MASK_VALUE_MAX bytes
MASK_VALUE_MAX = 4096
MASK_MIN = 4  # shorter values would mask ordinary text (the client's MIN_LENGTH)


class Masker:
    """The job's secret values (the client sends them: the job's secret-env file is gone once the
    job started), masked in what tail and logs send before a long line is cut: a value across the
    cut would otherwise show the part on the kept side, which no masking on the client can
    recognise. `reach`: how many bytes past a kept part a value that starts in it can run, so each
    kept part is read that much wider, masked, then cut."""

    def __init__(self, values: object) -> None:
        found = {
            v.encode("utf-8", "surrogatepass")
            for v in (values if isinstance(values, list) else [])[:MASK_VALUES]
            if isinstance(v, str)
            and MASK_MIN <= len(v.encode("utf-8", "surrogatepass")) <= MASK_VALUE_MAX
        }
        self.values = sorted(found, key=len, reverse=True)
        self.reach = max((len(v) for v in self.values), default=1) - 1

    def __call__(self, data: bytes) -> bytes:
        for value in self.values:
            if value in data:
                data = data.replace(value, MASK)
        return data

    def held(self, data: bytes) -> int:
        """How many bytes at the end of `data` may be the start of a secret (the longest end of it
        that begins a value): a line cut where the job has written so far shows them only once the
        rest is there."""
        for size in range(min(self.reach, len(data)), 0, -1):
            piece = data[-size:]
            if any(value.startswith(piece) for value in self.values):
                return size
        return 0

    def head(self, data: bytes) -> bytes:
        """The first LINE_KEEP bytes of `data` (read LINE_KEEP + reach long), masked first."""
        return self(data[: LINE_KEEP + self.reach])[:LINE_KEEP]

    def end(self, data: bytes) -> bytes:
        """The last LINE_KEEP bytes of `data` (read LINE_KEEP + reach long), masked first."""
        return self(data[-(LINE_KEEP + self.reach) :])[-LINE_KEEP:]


NO_MASK = Masker(None)


def last_match(path: str, pattern: str | None) -> str | None:
    if not pattern:
        return None
    rx = re.compile(pattern)
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 65536))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    return next((ln for ln in reversed(lines) if rx.search(ln)), None)


@node_op("job_tail", writes=False)
def job_tail(req: dict) -> dict:
    """Bytes of the log from `offset`, whole lines only (until the job has ended), waiting up to
    wait_s for something new: one exec per poll, no line split across two answers; a line over
    LONG_LINE comes cut (_tail_read), so no line, however long, holds back the ones after it."""
    job_dir, job = load_job(req["state_dir"], req.get("job_id"))
    mask = Masker(req.get("mask"))
    start: dict = {"playbook": job.get("playbook"), "job_name": job.get("name")}
    if req.get("offset") is None:  # attaching: where to start
        start.update(attach_offset(job, req.get("last_lines"), bool(req.get("from_start"))))
        offset = start["offset"]
    else:
        offset = int(req["offset"])
    deadline = time.monotonic() + float(req.get("wait_s", 5))
    while True:
        st = job_state(job_dir, job)
        ended = st["state"] not in ("running", "starting")
        size = file_size(job["log"])
        if size > offset:
            with open(job["log"], "rb") as f:
                data, next_offset = _tail_read(f, offset, size, ended, mask)
            if data:
                return {
                    "ok": True,
                    "job_id": job["id"],
                    "data": data.decode("utf-8", "replace"),
                    "offset": offset,
                    "next_offset": next_offset,
                    **start,
                    **st,
                }
        if ended and file_size(job["log"]) <= offset:
            return {
                "ok": True,
                "job_id": job["id"],
                "data": "",
                "offset": offset,
                "next_offset": offset,
                **start,
                **st,
            }
        if time.monotonic() >= deadline:
            return {
                "ok": True,
                "job_id": job["id"],
                "data": "",
                "offset": offset,
                "next_offset": offset,
                **start,
                **st,
            }
        time.sleep(0.1)


def _tail_read(
    f: io.BufferedReader, offset: int, size: int, ended: bool, mask: Masker = NO_MASK
) -> tuple[bytes, int]:
    """What tail sends from `offset`: whole lines (the last one too once the job has ended), each
    line over LONG_LINE cut to its first and last LINE_KEEP bytes around a marker; and the offset
    after them. Empty while the only line there is still being written."""
    if offset > 0:
        f.seek(offset - 1)
        if f.read(1) != b"\n":  # the rest of a line cut by the answer before
            return _long_line(f, offset, size, ended, mask, continued=True)
    f.seek(offset)
    data = f.read(min(size - offset, TAIL_CHUNK))
    more = len(data) < size - offset
    cut = data.rfind(b"\n") + 1
    if cut and (not ended or more):
        data = data[:cut]
    elif not cut and (not ended or more):
        if len(data) < TAIL_CHUNK:
            return b"", offset  # a line still being written
        return _long_line(f, offset, size, ended, mask)  # one line longer than a whole chunk
    return b"".join(_cut_line(line, mask) for line in data.splitlines(keepends=True)), offset + len(
        data
    )


def _cut_line(
    line: bytes,
    mask: Masker = NO_MASK,
    length: int | None = None,
    end: bytes | None = None,
    goes_on: bool = False,
) -> bytes:
    """line as tail shows it, the job's secrets masked: whole up to LONG_LINE bytes, else its head
    and end around what was left out, each masked before it is cut. `length`/`end`: the line's
    length and last bytes (LINE_KEEP + mask.reach of each), when `line` holds only its start;
    `goes_on`: it has no end yet (the rest comes with a later answer)."""
    body = line[:-1] if line.endswith(b"\n") else line
    length = len(body) if length is None else length
    if length <= LONG_LINE:
        return mask(line)
    tail = mask.end(body if end is None else end)
    head = mask.head(body)
    left = length - len(head) - len(tail)
    marker = (
        f" … [{left:,} bytes not shown; this line goes on] … "
        if goes_on
        else f" … [{left:,} bytes of this {length:,}-byte line not shown] … "
    )
    return head + marker.encode() + tail + b"\n"


def _long_line(
    f: io.BufferedReader,
    offset: int,
    size: int,
    ended: bool,
    mask: Masker = NO_MASK,
    continued: bool = False,
) -> tuple[bytes, int]:
    """A line too long for one chunk, from `offset` to its newline (looked for up to LINE_SCAN bytes
    on): its head and end, cut. A line still being written, or longer than LINE_SCAN, is cut where
    the reading stops and goes on at the next poll (`continued`: only its end is shown then)."""
    pos, stop, newline = offset, min(size, offset + LINE_SCAN), -1
    while pos < stop:
        f.seek(pos)
        block = f.read(min(1 << 20, stop - pos))
        if not block:
            break
        found = block.find(b"\n")
        if found >= 0:
            newline = pos + found
            break
        pos += len(block)
    end = newline if newline >= 0 else pos
    if newline < 0 and not ended and end - offset < TAIL_CHUNK:
        return b"", offset  # wait for more of it, as for any line being written
    goes_on = newline < 0 and not (ended and end >= size)
    wide = LINE_KEEP + mask.reach
    f.seek(max(offset, end - wide))
    tail = f.read(end - max(offset, end - wide))
    if goes_on:  # cut where the reading stops: the start of a secret there waits for the rest of it
        held = mask.held(tail)
        end, tail = end - held, tail[: len(tail) - held]
    next_offset = newline + 1 if newline >= 0 else end
    if continued:
        kept = mask.end(tail)
        left = end - offset - min(len(tail), LINE_KEEP)
        gap = (
            f"{left:,} more bytes of the line cut above not shown] … "
            if left
            else "the line cut above goes on] "
        )
        return f"… [{gap}".encode() + kept + b"\n", next_offset
    f.seek(offset)
    head = f.read(wide)
    return _cut_line(head, mask, length=end - offset, end=tail, goes_on=goes_on), next_offset


def attach_offset(job: dict, last_lines: int | str | None, from_start: bool) -> dict:
    """Where a tail attaching to the job starts: the last N whole lines (default 20), or byte 0 with
    from_start (an explicit --from-start, or the client's own `extract tail` that launched the job
    and has shown nothing of it yet). Says what it skipped."""
    size = file_size(job["log"])
    want = (
        None if from_start else (int(last_lines) if last_lines is not None else DEFAULT_TAIL_LINES)
    )
    if want is None or size == 0:
        return {"offset": 0, "skipped_bytes": 0, "skipped_lines": 0}
    with open(job["log"], "rb") as f:
        back = min(size, max(TAIL_CHUNK, 4096 * (want + 1)))
        f.seek(size - back)
        chunk = f.read(back)
    at_file_start = back == size
    # whole lines only: a line still being written comes with the next poll
    end = chunk.rfind(b"\n") + 1
    idx = end - 1
    for _ in range(want):
        if idx < 0:
            break
        idx = chunk.rfind(b"\n", 0, idx)
    if idx >= 0:
        first = idx + 1
    elif at_file_start:
        first = 0
    else:  # fewer than N whole lines in the chunk: start at its first whole line
        first = chunk.find(b"\n") + 1
    offset = size - back + first
    skipped = _count_lines(job["log"], offset) if offset <= COUNT_LINES_MAX else None
    return {"offset": offset, "skipped_bytes": offset, "skipped_lines": skipped}


def _count_lines(path: str, upto: int) -> int:
    count = 0
    with open(path, "rb") as f:
        while upto > 0:
            block = f.read(min(upto, 1 << 20))
            if not block:
                break
            count += block.count(b"\n")
            upto -= len(block)
    return count


@node_op("job_logs", writes=False)
def job_logs(req: dict) -> dict:
    job_dir, job = load_job(req["state_dir"], req.get("job_id"))
    mask = Masker(req.get("mask"))
    n = int(req.get("lines", 50))
    try:
        with open(job["log"], "rb") as f:
            start = max(0, file_size(job["log"]) - 1024 * 1024)
            f.seek(max(0, start - 1))
            data = f.read()
    except OSError:
        data, start = b"", 0
    first = b""
    if start > 0:  # data[0] is the byte before the window: is its first line whole?
        piece, newline, rest = data[1:].partition(b"\n")
        if data[:1] == b"\n":
            data = data[1:]
        else:  # the window starts inside a (long) line: its end, marked as such
            first = (
                "… [this line starts earlier in the log] … ".encode() + mask.end(piece) + newline
            )
            data = rest
    text = (
        first + b"".join(_cut_line(line, mask) for line in data.splitlines(keepends=True))
    ).decode("utf-8", "replace")
    lines = text.splitlines()[-n:]
    return {
        "ok": True,
        "job_id": job["id"],
        "lines": lines,
        "log": job["log"],
        "playbook": job.get("playbook"),
        "job_name": job.get("name"),
        **job_state(job_dir, job),
    }
