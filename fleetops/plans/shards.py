"""Sharded extraction across SSH hosts (pure): what `--shards` means, which rows shard i of N gets,
the fleet manifest kept on the laptop (<project>/.fleetops/shards/<job>.json) and the one aggregated
progress line.

`--shards` on SSH hosts is one shard per selected host: `--shards` with no number, `--shards all`,
or the number of selected hosts; any other number is refused (a host runs one job at a time, so N
shards on fewer hosts could not run, and more hosts than shards would leave hosts idle). On a Slurm
login node `--shards N` is the size of the job array (fleetops/tasks/jobs/slurm/). Shard i of N is
the contiguous rows [i*n//N, (i+1)*n//N) of the dataset's non-blank lines: the same split and the
same files (<output>/shards/dataset-i-of-N.jsonl, <output>/shards/output-i-of-N/) as a Slurm job
array, hosts taken in sorted name order."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .hostrange import natural_key

VERSION = 1
FOLDER = Path(".fleetops") / "shards"


class ShardError(Exception):
    """A sharded run that must not start (its message says why and what to do)."""


def count(raw: object, hosts: int) -> int:
    """How many shards `--shards RAW` asks for on `hosts` SSH hosts (always `hosts`), or
    ShardError."""
    text = "" if raw in (None, True) else str(raw).strip().lower()
    if text in ("", "all", "true"):
        return hosts
    try:
        n = int(text)
    except ValueError:
        raise ShardError(
            f"--shards {raw!r}: give no value or 'all' (one shard per selected host), or the "
            f"number of selected hosts ({hosts})"
        ) from None
    if n != hosts:
        raise ShardError(
            f"--shards {n} on {hosts} SSH hosts: on SSH hosts there is one shard per selected host "
            f"(each runs one job at a time); select {n} hosts, or give --shards alone (= {hosts}). "
            "A number of shards of its own is for a Slurm login node (a job array)"
        )
    return n


def order(hosts: list[str]) -> list[str]:
    """Shard i goes to the i-th host in name order (lab2 before lab10): the same hosts give the same
    plan."""
    return sorted(set(hosts), key=natural_key)


def rows_of(index: int, of: int, rows: int) -> tuple[int, int]:
    """Shard `index` of `of`: rows [start, end) of `rows` (the Slurm array's split,
    remote_scripts/jobs/slurm.py)."""
    return index * rows // of, (index + 1) * rows // of


def manifest_path(root: Path, job: str) -> Path:
    return root / FOLDER / f"{job}.json"


def load(path: Path) -> dict[str, Any] | None:
    """The fleet manifest, None when there is none; ShardError naming the file when it is not
    readable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ShardError(f"{path}: cannot read the shard plan ({exc.strerror or exc})") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ShardError(
            f"{path}:{exc.lineno if hasattr(exc, 'lineno') else 1}: not JSON ({exc}); move it "
            f"aside (mv {path} {path}.bad) to start a new shard plan"
        ) from None
    if (
        not isinstance(doc, dict)
        or doc.get("version") != VERSION
        or not isinstance(doc.get("shards"), list)
    ):
        raise ShardError(
            f"{path}:1: not a fleetops shard plan (version "
            f"{VERSION}); move it aside to start a new "
            "one"
        )
    return doc


def save(path: Path, doc: dict[str, Any]) -> None:
    """Written atomically (a temp file renamed in), so a reader never sees half a plan. The temp
    file's name is unique to this save: the hosts' threads of one run save at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def unfinished(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in doc["shards"] if not s.get("complete")]


def new_plan(job: str, hosts: list[str], now: str) -> dict[str, Any]:
    names = order(hosts)
    return {
        "version": VERSION,
        "job": job,
        "hosts": names,
        "of": len(names),
        "created": now,
        "updated": now,
        "dataset": None,
        "complete": False,
        "shards": [
            {
                "index": i,
                "of": len(names),
                "host": h,
                "start": None,
                "end": None,
                "samples": None,
                "done": 0,
                "complete": False,
                "jobs": [],
            }
            for i, h in enumerate(names)
        ],
    }


def decide(
    doc: dict[str, Any] | None, job: str, hosts: list[str], now: str, path: Path
) -> tuple[dict[str, Any], str]:
    """The plan a sharded `extract` on `hosts` follows, and how it came about: 'new', 'resumed' (the
    same hosts: each shard keeps its host and rows) or 'replaced' (a finished plan gives way to a
    new one). ShardError when the host set changed while shards are unfinished."""
    names = order(hosts)
    if doc is None:
        return new_plan(job, names, now), "new"
    if doc["hosts"] == names:
        return doc, "resumed"
    left = unfinished(doc)
    if left:
        added = [h for h in names if h not in doc["hosts"]]
        gone = [h for h in doc["hosts"] if h not in names]
        what = "; ".join(
            x
            for x in (
                f"added {', '.join(added)}" if added else "",
                f"left out {', '.join(gone)}" if gone else "",
            )
            if x
        )
        raise ShardError(
            f"refused: job {job!r} is sharded over {len(doc['hosts'])} hosts "
            f"({', '.join(doc['hosts'])}) and shards "
            f"{', '.join(str(s['index']) + ' on ' + s['host'] for s in left)} are not finished; "
            f"this run selects {', '.join(names)} ({what}), which would split the dataset "
            "differently and mix two plans. Re-run with the same hosts (fab -H "
            f"{','.join(doc['hosts'])} extract --shards) to finish it, check with `status` on "
            f"them (it records finished shards in {path}), or move {path} aside to start over"
        )
    return new_plan(job, names, now), "replaced"


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One line for the fleet from each shard's last progress ({done, total, tok_s, eta, state}):
    samples done/total summed, tok/s summed over the shards still running, ETA of the slowest
    running shard."""
    done = sum(int(r.get("done") or 0) for r in rows)
    total = sum(int(r.get("total") or 0) for r in rows)
    running = [r for r in rows if r.get("state") in ("running", "starting")]
    tok_s = sum(float(r.get("tok_s") or 0.0) for r in running)
    etas = [(float(r["eta"]), r.get("host", "?")) for r in running if r.get("eta") is not None]
    slowest = max(etas) if etas else None
    out: dict[str, Any] = {
        "done": done,
        "total": total,
        "tok_s": round(tok_s, 1),
        "running": len(running),
        "shards": len(rows),
    }
    if slowest is not None:
        out["eta"], out["slowest"] = slowest
    elif total and done >= total:
        out["eta"] = 0.0
    return out


def line(agg: dict[str, Any]) -> str:
    """The aggregated line, in the extraction's own progress format (so the same progress regex
    reads it)."""
    eta = f" eta={agg['eta']:.1f}s" if agg.get("eta") is not None else ""
    slowest = f" (slowest: {agg['slowest']})" if agg.get("slowest") else ""
    return (
        f"fleet samples={agg['done']}/{agg['total']} tok/s={agg['tok_s']:.1f}{eta} "
        f"shards={agg['shards']} running={agg['running']}{slowest}"
    )
