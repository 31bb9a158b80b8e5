"""Hidden-state extraction driver: the job `extract` launches on a node (under the node venv's
python).

Reads a JSONL dataset (one prompt per line: {"text": ...} / {"prompt": ...} / {"input_ids": [...]}),
tokenizes, runs the model and writes one .safetensors file per sample (input_ids plus one tensor per
requested layer, "hidden_states.<layer>", shape [tokens, hidden]) and a manifest. Backends:
  vllm          speculators 0.3.0's (patched) VllmHiddenStatesGenerator, on GPUs
  transformers  Hugging Face on the CPU, forward hooks on the decoder layers (the same quantity the
                generator captures: a layer's output, before the final norm)
Crash-safe: every sample file is written atomically before the manifest names it, and a restart
resumes from the manifest (adopting complete sample files it did not yet name), so no sample is done
twice or skipped; `again` (extract --again) starts a new manifest and redoes every sample. One
progress line per batch; a summary at the end. Only the standard library is imported at module
level: torch and friends are imported when the job runs.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from typing import Any

from ..core.atomicio import atomic_write
from ..core.failpoints import failpoint, load_failpoints
from ..core.nodeio import now_iso
from ..core.registry import node_role
from ..core.statetrust import read_json
from .outputlock import OutputBusy, acquire, release
from .outputs import MANIFEST, identity, read_manifest, rows_of
from .records import cause_name


def say(line: str) -> None:
    print(line, flush=True)


def tokenize(rows: list[dict], model: str, max_len: int) -> list[list[int]]:
    tokenizer = None
    out = []
    for row in rows:
        if "input_ids" in row:
            ids = [int(x) for x in row["input_ids"]]
        else:
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(model)
            ids = tokenizer(row.get("text", row.get("prompt")), add_special_tokens=True)[
                "input_ids"
            ]
        out.append(ids[:max_len])
    return out


def sample_path(output: str, index: int) -> str:
    return os.path.join(output, f"sample_{index:07d}.safetensors")


def save_sample(
    output: str, index: int, input_ids: list[int], layer_ids: list[int], states: list
) -> int:
    import torch
    from safetensors.torch import save

    tensors = {"input_ids": torch.as_tensor(input_ids, dtype=torch.long)}
    for layer, tensor in zip(layer_ids, states):
        tensors[f"hidden_states.{layer}"] = tensor.detach().to("cpu").contiguous()
    data = save(tensors, metadata={"index": str(index)})
    atomic_write(sample_path(output, index), data, mode=0o644, point="extract.sample")
    return len(data)


def complete_sample(output: str, index: int, n_tokens: int, layer_ids: list[int]) -> bool:
    """A sample file left by a run that died before naming it in the manifest: keep it if it is
    whole."""
    try:
        from safetensors import safe_open

        with safe_open(sample_path(output, index), framework="pt") as f:
            keys = set(f.keys())
            return keys == {
                "input_ids",
                *[f"hidden_states.{lid}" for lid in layer_ids],
            } and f.get_slice("input_ids").get_shape() == [n_tokens]
    except Exception:  # missing or truncated: do it again
        return False


class TransformersBackend:
    def __init__(self, req: dict) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(req["model"], torch_dtype=torch.float32)
        self.model.eval()
        layers = self.model.model.layers
        self.layer_ids = req["layer_ids"]
        for lid in self.layer_ids:
            if not 0 <= lid < len(layers):
                raise SystemExit(f"layer {lid} out of range: the model has {len(layers)} layers")
        self.captured: dict[int, Any] = {}  # torch tensors (torch is the node venv's, untyped here)
        for lid in self.layer_ids:
            layers[lid].register_forward_hook(self._hook(lid))

    def _hook(self, lid: int):
        def hook(module, inputs, output):
            self.captured[lid] = output[0] if isinstance(output, tuple) else output

        return hook

    def generate(self, batch: list[list[int]]) -> list[list]:
        out = []
        with self.torch.no_grad():
            for ids in batch:
                self.model(input_ids=self.torch.as_tensor([ids], dtype=self.torch.long))
                out.append([self.captured[lid][0].clone() for lid in self.layer_ids])
        return out


class VllmBackend:
    def __init__(self, req: dict) -> None:
        from speculators.data_generation.vllm_hidden_states_generator import (
            VllmHiddenStatesGenerator,
        )

        self.layer_ids = req["layer_ids"]
        self.gen = VllmHiddenStatesGenerator(
            model_path=req["model"],
            layer_ids=req["layer_ids"],
            max_model_len=req["max_model_len"],
            tensor_parallel_size=req["tensor_parallel_size"],
        )

    def generate(self, batch: list[list[int]]) -> list[list]:
        return [r["hidden_states"] for r in self.gen.generate(batch)]


BACKENDS: dict[str, type[TransformersBackend] | type[VllmBackend]] = {
    "transformers": TransformersBackend,
    "vllm": VllmBackend,
}


def _start_manifest(req: dict, output: str, ident: dict) -> dict:
    """The manifest this run continues: the output's own (refused when it is another extraction's),
    or a new one; with `again` (extract --again) a new one that keeps only the record of earlier
    runs."""
    manifest = read_manifest(output)
    if manifest is not None:
        differs = {k: (manifest.get(k), v) for k, v in ident.items() if manifest.get(k) != v}
        if differs:
            raise SystemExit(
                f"{output} holds a different extraction ({differs}); use another output directory"
            )
    if manifest is None or req.get("again"):
        runs = (manifest or {}).get("runs") or []
        manifest = {**ident, "version": 1, "samples": {}, "runs": runs}
    return manifest


def run(req: dict) -> int:
    load_failpoints(req.get("state_dir", "/nonexistent"))
    started = time.monotonic()
    say(
        f"fleetops extract: backend={req['backend']} model={req['model']} "
        f"layers={req['layer_ids']} tp={req['tensor_parallel_size']} "
        f"batch={req['batch_size']} at {now_iso()}"
    )
    failpoint("extract.start")  # a test takes the dataset away here, after the preflight found it
    rows, dataset_sha = rows_of(req)
    output = req["output"]
    os.makedirs(output, exist_ok=True)
    try:  # one run at a time writes an output, on whichever host (outputlock.py)
        lock = acquire(output, os.environ.get("FLEETOPS_JOB_ID"))
    except OutputBusy as busy:
        cause = (
            f"its output {output} is in use: {busy}; nothing "
            "written: extract again once that run has ended"
        )
        record_cause(cause)
        say(f"fleetops extract: {cause}")
        return 1
    try:
        failpoint("extract.locked")  # a test holds the run here, its output's lock taken
        return _run(req, started, rows, dataset_sha, output)
    finally:
        release(lock)


def _run(req: dict, started: float, rows: list[dict], dataset_sha: str, output: str) -> int:
    manifest_path = os.path.join(output, MANIFEST)
    manifest = _start_manifest(req, output, identity(req, rows, dataset_sha))
    token_ids = tokenize(rows, req["model"], int(req["max_model_len"]) - 1)
    done: dict[str, dict] = manifest["samples"]
    adopted = [] if req.get("again") else _adopt(req, output, token_ids, manifest)
    manifest["runs"].append(
        {"started": now_iso(), "already_done": len(done), "job": os.environ.get("FLEETOPS_JOB_ID")}
    )
    run_index = len(manifest["runs"]) - 1
    todo = [i for i in range(len(rows)) if str(i) not in done]
    if req.get("again"):
        say(
            f"again: all {len(rows)} samples redone (extract "
            "--again), the earlier files replaced one by one"
        )
    elif done:
        say(
            f"resuming: {len(done)}/{len(rows)} samples already done ({len(adopted)} adopted "
            f"from disk), {len(todo)} to go"
        )
    _write_manifest(manifest_path, manifest)
    backend = BACKENDS[req["backend"]](req)
    loaded = time.monotonic()
    say(f"model loaded in {loaded - started:.1f}s")
    batch_size = int(req["batch_size"])
    tokens = 0
    batches = [todo[k : k + batch_size] for k in range(0, len(todo), batch_size)]
    for n, batch in enumerate(batches, 1):
        states = backend.generate([token_ids[i] for i in batch])
        for i, layer_states in zip(batch, states):
            size = save_sample(output, i, token_ids[i], req["layer_ids"], layer_states)
            done[str(i)] = {
                "file": os.path.basename(sample_path(output, i)),
                "tokens": len(token_ids[i]),
                "run": run_index,
                "bytes": size,
            }
            tokens += len(token_ids[i])
        _write_manifest(manifest_path, manifest)
        say(_progress(n, batches, len(done), len(rows), tokens, time.monotonic() - loaded))
        failpoint("extract.after_batch")
    total_tokens = sum(d["tokens"] for d in done.values())
    say(
        f"done: {len(done)}/{len(rows)} samples, {total_tokens} tokens in all, {tokens} this run, "
        f"{tokens / max(time.monotonic() - loaded, 1e-9):.1f} tok/s, output {output}"
    )
    return 0


def _adopt(req: dict, output: str, token_ids: list[list[int]], manifest: dict) -> list[int]:
    """Samples complete on disk that the manifest does not list (a run killed between writing a
    sample and its manifest): listed now, as adopted, not computed again."""
    done: dict[str, dict] = manifest["samples"]
    adopted = [
        i
        for i in range(len(token_ids))
        if str(i) not in done and complete_sample(output, i, len(token_ids[i]), req["layer_ids"])
    ]
    for i in adopted:
        done[str(i)] = {
            "file": os.path.basename(sample_path(output, i)),
            "tokens": len(token_ids[i]),
            "run": len(manifest["runs"]) - 1,
            "adopted": True,
        }
    return adopted


def _write_manifest(path: str, manifest: dict) -> None:
    atomic_write(
        path, json.dumps(manifest, indent=1).encode(), mode=0o644, point="extract.manifest"
    )


def _progress(
    n: int, batches: list[list[int]], done: int, total: int, tokens: int, elapsed: float
) -> str:
    """The progress line after batch `n` (`status` reads it from the log: keep its shape)."""
    rate = tokens / elapsed if elapsed > 0 else 0.0
    eta = (total - done) / (sum(len(b) for b in batches[:n]) / elapsed) if elapsed > 0 else 0.0
    return (
        f"progress samples={done}/{total} batch={n}/{len(batches)} tokens={tokens} "
        f"tok/s={rate:.1f} elapsed={elapsed:.1f}s eta={eta:.1f}s"
    )


REQUEST = ""  # the request this run was started with (main)


@node_role("extract")
def main(request_path: str) -> int:
    global REQUEST
    REQUEST = request_path
    # written by the agent in the job's dir: never through a link, ours alone
    req = read_json(request_path)
    if req is None:
        print(f"fleetops extract: {request_path} does not exist", file=sys.stderr)
        return 2
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    refused = _import_path_refused()
    if refused is not None:
        return refused
    try:
        return run(req)
    # the job's cause in one line, for its log and for `status`, never a traceback
    except OSError as exc:
        if exc.errno is None:
            # not the system's (a library's own OSError, e.g. a model it cannot find): its own
            # account
            raise
        cause = os_cause(exc, req)
        record_cause(cause)
        try:
            say(f"fleetops extract: {cause}")
        except OSError:
            # the log's own filesystem is full: the cause beside the exit record is what remains
            pass
        return 1


def os_cause(exc: OSError, req: dict) -> str:
    """What a failed read or write means for the extraction, naming the file and the next step."""
    import errno

    path = exc.filename if isinstance(exc.filename, str) else None
    reason = exc.strerror or str(exc)
    if path is not None and path == req.get("dataset"):
        return (
            f"cannot read the dataset '{path}': {reason}; put "
            "it there (or point the playbook's dataset: at "
            "it), then extract again"
        )
    if exc.errno == errno.ENOSPC:
        where = f" '{path}'" if path else f" in '{req.get('output')}'"
        return (
            f"cannot write{where}: No space left on device; "
            "free space there, then extract again (it resumes "
            "from the samples already written)"
        )
    where = f" '{path}'" if path else ""
    return f"{reason}{where} (errno {exc.errno}); fix it, then extract again"


def record_cause(cause: str) -> None:
    """The cause, beside the job's request (its job dir): the wrapper, or a Slurm task's step, adds
    it to the exit record when the job ends (request.json: cause.json; a Slurm task's
    request-N.json: cause-N.json)."""
    if not REQUEST:
        return
    name = os.path.basename(REQUEST)
    task = name[len("request-") : -len(".json")] if name.startswith("request-") else ""
    path = os.path.join(os.path.dirname(REQUEST), cause_name(task))
    try:
        atomic_write(
            path,
            (json.dumps({"cause": cause}) + "\n").encode(),
            mode=0o600,
            point="extract.cause",
            durable=False,
        )
    except OSError:
        pass  # a full disk: the log's line (if it could be written) is all there is


# What the driver imports, with what they import in turn (their site-packages is walked whole).
DRIVER_IMPORTS = ["speculators", "vllm", "torch", "transformers", "safetensors"]


def _import_path_refused() -> int | None:
    """Before the driver imports the venv's packages (as root under become): refused when someone
    but root and the login user may change them (core/importtrust.py); --allow-insecure-venv goes on
    with a warning."""
    from ..core.importtrust import check_before_import
    from ..core.nodeio import NodeError

    try:
        warnings = check_before_import(
            DRIVER_IMPORTS, "run the extraction (it imports %s)" % ", ".join(DRIVER_IMPORTS)
        )
    except NodeError as exc:
        print(f"fleetops extract: {exc}", file=sys.stderr)
        return 2
    for line in warnings:
        print(f"fleetops extract: warning: {line}", file=sys.stderr)
    return None
