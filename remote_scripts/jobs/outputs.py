"""What an extraction's output folder holds (stdlib only): the dataset it is made from, the identity
its manifest must carry to be resumed, and whether every sample of that very extraction is already
there. The extraction driver resumes by it; `extract`'s preflight reads it so that a finished output
is not run again (a real model takes many minutes to load, only to find nothing to do)."""

from __future__ import annotations

import json
import os

MANIFEST = "manifest.json"


def load_dataset(path: str) -> tuple[list[dict], str]:
    """The dataset's rows and its sha256; SystemExit naming the line that is not a prompt."""
    from ..core.nodeio import sha256_bytes

    with open(path, "rb") as f:
        raw = f.read()
    rows = []
    for n, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise SystemExit(f"{path}:{n}: not JSON: {exc}") from None
        if isinstance(row, list):
            row = {"input_ids": row}
        if not isinstance(row, dict) or not ({"text", "prompt", "input_ids"} & set(row)):
            raise SystemExit(f"{path}:{n}: each line needs 'text', 'prompt' or 'input_ids'")
        rows.append(row)
    return rows, sha256_bytes(raw)


def identity(req: dict, rows: list[dict], dataset_sha: str) -> dict:
    """What a manifest must say to belong to this extraction (a resume of another one is
    refused)."""
    return {
        "model": req["model"],
        "backend": req["backend"],
        "layer_ids": req["layer_ids"],
        "dataset": req["dataset"],
        "dataset_sha256": dataset_sha,
        "total": len(rows),
    }


def rows_of(req: dict) -> tuple[list[dict], str]:
    rows, sha = load_dataset(req["dataset"])
    return (rows[: int(req["limit"])] if req.get("limit") else rows), sha


def read_manifest(output: str) -> dict | None:
    try:
        with open(os.path.join(output, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return None
    return manifest if isinstance(manifest, dict) else None


def completion(req: dict) -> dict | None:
    """{output, done, total, runs} when `output` holds every sample of this extraction (same model,
    backend, layers and dataset bytes), else None: nothing there yet, a part done, another
    extraction, or a manifest or dataset that cannot be read (the job then says why)."""
    output = req.get("output")
    if not isinstance(output, str) or not output:
        return None
    try:
        manifest = read_manifest(output)
        if manifest is None or len(manifest.get("samples") or {}) < int(manifest.get("total") or 0):
            # cheap answers first: the dataset is read only for an output that looks finished
            return None
        rows, sha = rows_of(req)
    except (OSError, ValueError, TypeError, SystemExit):
        return None
    want = identity(req, rows, sha)
    if any(manifest.get(k) != v for k, v in want.items()):
        return None
    done = manifest.get("samples") or {}
    if not all(str(i) in done for i in range(len(rows))):
        return None
    return {
        "output": output,
        "done": len(rows),
        "total": len(rows),
        "runs": len(manifest.get("runs") or []),
    }


def manifest_of(output: str) -> dict | None:
    """An output's manifest, None when it cannot be read or is not a manifest."""
    try:
        manifest = read_manifest(output)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def run_jobs(manifest: dict) -> list[str]:
    """The job id of each run the manifest records, oldest first ("" for a run that names none): a
    sample's `run` is an index into this list."""
    return [
        str(r.get("job") or "") if isinstance(r, dict) else "" for r in manifest.get("runs") or []
    ]


def written_by(output: str, job_id: str, manifest: dict | None = None) -> dict | None:
    """What of `output` the job wrote, by its manifest: {samples, bytes} of the samples its run(s)
    wrote and the manifest still names (a later --again replaces them), or None when no run of the
    manifest is the job's (it never wrote one: killed before, or another extraction's output)."""
    if manifest is None:
        manifest = manifest_of(output)
    if not isinstance(manifest, dict):
        return None
    runs = [i for i, job in enumerate(run_jobs(manifest)) if job == job_id]
    if not runs:
        return None
    samples = [
        s
        for s in (manifest.get("samples") or {}).values()
        if isinstance(s, dict) and s.get("run") in runs
    ]
    total = 0
    for sample in samples:
        size = sample.get("bytes")
        if not isinstance(size, int):  # a manifest written before sizes were kept: the file's own
            try:
                size = os.lstat(
                    os.path.join(output, os.path.basename(str(sample.get("file"))))
                ).st_size
            except OSError:
                size = 0
        total += size
    return {"samples": len(samples), "bytes": total}
