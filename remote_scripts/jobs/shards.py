"""One shard of an extraction on an SSH host (stdlib only), for `extract --shards` across hosts.

prepare: the playbook's dataset (its {state_dir} filled in as job_start does), its sha256 and number
of rows, and shard i of N written to <output>/shards/dataset-i-of-N.jsonl: the contiguous non-blank
rows [i*n//N, (i+1)*n//N), the same split and files as a Slurm job array
(remote_scripts/jobs/slurm.py), rewritten only when its bytes differ. The shard's output folder is
<output>/shards/output-i-of-N/, so a re-run resumes it from its own manifest. report: what that
folder holds: samples done of total, the sha256 of its manifest and of its samples (each sample
file's sha256, in index order, hashed together: the same bytes give the same digest)."""

from __future__ import annotations

import hashlib
import json
import os
import sys

from ..core.atomicio import atomic_write, ensure_dir
from ..core.nodeio import NodeError
from ..core.registry import node_op


def _paths(req: dict) -> tuple[str, str]:
    from .records import expand

    state_dir = os.path.abspath(req["state_dir"])
    extract = expand(
        req["extract"], {"state_dir": state_dir, "job_dir": state_dir, "python": sys.executable}
    )
    assert isinstance(extract, dict)
    return os.path.abspath(str(extract["dataset"])), os.path.abspath(str(extract["output"]))


def _names(output: str, index: int, of: int) -> tuple[str, str]:
    shard_dir = os.path.join(output, "shards")
    return (
        os.path.join(shard_dir, f"dataset-{index}-of-{of}.jsonl"),
        os.path.join(shard_dir, f"output-{index}-of-{of}"),
    )


def prepare(req: dict) -> dict:
    dataset, output = _paths(req)
    index, of = int(req["index"]), int(req["of"])
    if not 0 <= index < of:
        raise NodeError(f"shard {index} of {of}: no such shard", kind="bad_request")
    try:
        with open(dataset, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise NodeError(f"dataset {dataset}: {exc.strerror or exc}", kind="dataset") from None
    try:
        lines = [ln for ln in raw.decode("utf-8").splitlines() if ln.strip()]
    except UnicodeDecodeError as exc:
        raise NodeError(f"dataset {dataset}: not UTF-8 text ({exc})", kind="dataset") from None
    start, end = index * len(lines) // of, (index + 1) * len(lines) // of
    path, out = _names(output, index, of)
    ensure_dir(os.path.dirname(path))
    written = write_rows(path, lines[start:end], "shards.dataset")
    return {
        "ok": True,
        "dataset": dataset,
        "dataset_sha256": hashlib.sha256(raw).hexdigest(),
        "rows": len(lines),
        "start": start,
        "end": end,
        "shard_dataset": path,
        "shard_output": out,
        "written": written,
        **_report(out, end - start),
    }


def write_rows(path: str, rows: list[str], point: str) -> bool:
    """A shard's dataset, one row a line, at `path`: written only where the file there differs, so a
    shard run again finds the same rows and resumes. True if it was written."""
    data = ("\n".join(rows) + "\n").encode()
    try:
        with open(path, "rb") as f:
            same = f.read() == data
    except OSError:
        same = False
    if not same:
        atomic_write(path, data, mode=0o644, point=point)
    return not same


def _report(out: str, samples: int) -> dict:
    manifest_path = os.path.join(out, "manifest.json")
    try:
        with open(manifest_path, "rb") as f:
            raw = f.read()
        manifest = json.loads(raw)
    except FileNotFoundError:
        return {"done": 0, "total": samples, "manifest": None}
    except (OSError, ValueError) as exc:
        return {"done": 0, "total": samples, "manifest": manifest_path, "manifest_error": str(exc)}
    done = manifest.get("samples") or {}
    digest = hashlib.sha256()
    for key in sorted(done, key=int):
        name = os.path.basename(str(done[key].get("file", "")))
        try:
            with open(os.path.join(out, name), "rb") as f:
                file_sha = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            file_sha = "missing"
        digest.update(f"{int(key)} {name} {file_sha}\n".encode())
    return {
        "done": len(done),
        "total": int(manifest.get("total") or samples),
        "manifest": manifest_path,
        "manifest_sha256": hashlib.sha256(raw).hexdigest(),
        "samples_sha256": digest.hexdigest(),
        "runs": len(manifest.get("runs") or []),
    }


def report(req: dict) -> dict:
    _, output = _paths(req)
    index, of = int(req["index"]), int(req["of"])
    _, out = _names(output, index, of)
    return {"ok": True, "shard_output": out, **_report(out, int(req.get("samples") or 0))}


@node_op("shards", writes=True)
def shards(req: dict) -> dict:
    action = req.get("action")
    if action == "prepare":
        return prepare(req)
    if action == "report":
        return report(req)
    raise NodeError(f"shards: unknown action {action!r}", kind="bad_request")
