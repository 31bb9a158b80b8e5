"""Behavioural probe: does speculators 0.3.0's hidden-state generator, as patched, still run every
prompt token through the model on the installed vLLM? Every verdict names that vLLM's version.

It drives vLLM's real SchedulerConfig/CacheConfig/VllmConfig, its real Scheduler and KV cache
manager on the CPU, built by the generator file's own `__init__` and `_create_vllm_config` (read
from the file given on stdin, not copied here), and runs the file's own `generate()` twice over
prompts that share a prefix and together exceed `max_num_batched_tokens`. Only the GPU side is
replaced: a stand-in for `MultiprocExecutor` that answers the way the installed vLLM's executor and
worker do (where the executor has `sample_tokens`, as from 0.16 on: `execute_model` returns None and
keeps the step's state until it runs; `collective_rpc(..., unique_reply_rank=r)` returns the reply
itself) and records which prompt positions each step sends through the model. No GPU, no weights, no
downloads: the model is a tiny Llama config written to a temp dir.

Where the file hits a hard API break on the installed vLLM, the probe bridges it the way the naive
fix does (adds `is_encoder_decoder`, drops `kv_cache_specs`, passes `block_size`, attaches a block
hasher, runs `sample_tokens`), records the break, and keeps going so that it can still say how many
tokens are lost.

stdin:  {"modules": {dotted: path, ...}, "args": {...}}
stdout: last line is {"ok": bool, "summary": str, "evidence": [str], "details": {...}}; logs go to
stderr. args (all optional): max_model_len (2048), calls (2), shared_prefix (256 tokens), overshoot
(1.3: prompts total this times max_num_batched_tokens), free_memory_gib (1, what
torch.cuda.mem_get_info reports).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
import types
from typing import Any

GEN = "speculators.data_generation.vllm_hidden_states_generator"
WORKER = "speculators.data_generation.custom_worker"
MAX_STEPS = 2000
# The installed vLLM, as the verdict names it, and whether its executor splits a step in two
# (execute_model, then sample_tokens): read from the node's vLLM when the probe runs, never assumed.
VLLM = ["?"]
TWO_PHASE = [True]
STATE_ERROR = "State error: sample_tokens() must be called after execute_model() returns None."

# The verifier runs this file from a temp dir: don't let stray files there shadow real packages.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

# vLLM logs to stdout: keep the real stdout for the verdict only and send everything else to stderr.
_VERDICT_FD = os.dup(1)
os.dup2(2, 1)


def log(*parts: object) -> None:
    print("[probe]", *parts, file=sys.stderr, flush=True)


def short(exc: BaseException, n: int = 160) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= n else text[: n - 3] + "..."


def emit(verdict: dict) -> None:
    os.write(_VERDICT_FD, (json.dumps(verdict, default=str) + "\n").encode())


# ------------------------------------------------------------------ setup A module of the node's
# vLLM or speculators: what it has is what the probe finds out, so the type checker (which never
# sees the node's venv) takes it as it comes.
NodeModule = Any


def load_module(dotted: str, path: str | None) -> NodeModule:
    """Load `dotted` from exactly `path` (its parent package imported normally, for relative
    imports)."""
    if not path:
        return importlib.import_module(dotted)
    parent = dotted.rpartition(".")[0]
    if parent:
        importlib.import_module(parent)
    spec = importlib.util.spec_from_file_location(dotted, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {dotted} from {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[dotted] = mod
    spec.loader.exec_module(mod)
    if parent:
        setattr(sys.modules[parent], dotted.rpartition(".")[2], mod)
    return mod


def installed_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def make_tiny_model(root: str) -> dict:
    """A Llama-shaped config.json plus a word-level tokenizer, built locally (nothing is
    downloaded)."""
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 1024,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
    }
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump(cfg, f)
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"t{i}": i for i in range(3, cfg["vocab_size"])})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    ).save_pretrained(root)
    return cfg


# ------------------------------------------------------------------ the GPU side, as the installed
# vLLM answers
class Recorder:
    def __init__(self) -> None:
        # API breaks the file hits on this vLLM (bridged to keep measuring)
        self.hard_breaks: list[str] = []
        self.break_names: list[str] = []
        self.steps: list[list[tuple]] = []  # per execute_model: (req_id, start, n, request info)
        self.requests: dict[str, dict] = {}  # req_id -> latest request info added under that id
        self.added: list[dict] = []  # every request info, in add_request order
        self.executors: list[StandInExecutor] = []
        self.rpc_calls: list[str] = []

    def hard_break(self, name: str, text: str) -> None:
        if name not in self.break_names:
            self.break_names.append(name)
            self.hard_breaks.append(text)
            log("hard break:", text)


REC = Recorder()


class StandInExecutor:
    """Replaces MultiprocExecutor. Answers like the installed vLLM's executor + GPU worker, without
    a model."""

    def __init__(self, vllm_config=None, *args, **kwargs) -> None:
        self.vllm_config = vllm_config
        pc = vllm_config.parallel_config
        self.world_size = pc.tensor_parallel_size * pc.pipeline_parallel_size
        self.capture_layers: list[int] | None = None
        self.captured: list[list] | None = None
        # the step execute_model left for sample_tokens (vLLM's ExecuteModelState)
        self.pending = None
        self.sample_calls = 0
        REC.executors.append(self)

    # -- MultiprocExecutor API
    def collective_rpc(
        self,
        method,
        timeout=None,
        args=(),
        kwargs=None,
        non_block=False,
        unique_reply_rank=None,
        kv_output_aggregator=None,
    ):
        if not isinstance(method, str):
            raise NotImplementedError("stand-in executor only answers named RPCs")
        REC.rpc_calls.append(method)
        fn = getattr(self, "rpc_" + method, None)
        if fn is None:
            raise AttributeError(f"worker has no method {method!r}")
        reply = fn(*args, **(kwargs or {}))
        # With unique_reply_rank the reply itself comes back (vLLM 0.16 on), otherwise one reply per
        # worker.
        return reply if unique_reply_rank is not None else [reply] * self.world_size

    def initialize_from_config(self, kv_cache_configs) -> None:
        self.collective_rpc("initialize_from_config", args=(kv_cache_configs,))
        self.collective_rpc("compile_or_warm_up_model")

    def execute_model(self, scheduler_output, non_block: bool = False):
        if self.pending is not None:
            # Such a vLLM's GPUModelRunner.execute_model raises this; bridge as if sample_tokens had
            # run.
            REC.hard_break(
                "no sample_tokens()",
                f"execute_model() called again without sample_tokens(): vLLM {VLLM[0]}'s worker "
                f"raises '{STATE_ERROR}'",
            )
            self.pending = None
        if len(REC.steps) >= MAX_STEPS:
            raise RuntimeError(
                f"probe: more than {MAX_STEPS} model steps; generate() does not terminate"
            )
        if scheduler_output.total_num_scheduled_tokens == 0:
            return types.SimpleNamespace(empty=True)  # EMPTY_MODEL_RUNNER_OUTPUT, no state kept
        self._forward(scheduler_output)
        if not TWO_PHASE[0]:
            return types.SimpleNamespace(sampled=True)
        self.pending = scheduler_output
        return None

    def sample_tokens(self, grammar_output, non_block: bool = False):
        self.sample_calls += 1
        if self.pending is None:
            return None
        self.pending = None
        return types.SimpleNamespace(sampled=True)

    def shutdown(self) -> None:
        pass

    # -- worker RPCs (HiddenStatesWorkerExtension + Worker)
    def rpc_get_kv_cache_spec(self):
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        mc, cc = self.vllm_config.model_config, self.vllm_config.cache_config
        spec = FullAttentionSpec(
            block_size=cc.block_size,
            num_kv_heads=mc.get_num_kv_heads(self.vllm_config.parallel_config),
            head_size=mc.get_head_size(),
            dtype=mc.dtype,
        )
        n = mc.get_num_layers(self.vllm_config.parallel_config)
        return {f"model.layers.{i}.self_attn.attn": spec for i in range(n)}

    def rpc_initialize_from_config(self, kv_cache_configs) -> None:
        assert isinstance(kv_cache_configs, list) and kv_cache_configs, (
            "expects one KVCacheConfig per worker"
        )

    def rpc_compile_or_warm_up_model(self) -> None:
        pass

    def rpc__setup_hidden_states_capture(self, layer_ids) -> None:
        # the worker keeps a frozenset, captures in layer order
        self.capture_layers = sorted(set(layer_ids))
        self.captured = None

    def rpc__reset_capture(self) -> None:
        if self.capture_layers is None:
            raise RuntimeError("Must call _setup_hidden_states_capture before capturing states")
        self.captured = None

    def rpc__get_captured_states(self):
        import torch

        if self.captured is None:
            return None
        out = [torch.cat(parts, dim=0) for parts in self.captured]
        self.captured = None
        return out

    def _forward(self, so) -> None:
        """Record what one forward pass computes; 'capture' rows [layer, prompt#, position,
        token]."""
        import torch

        computed = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        cached = so.scheduled_cached_reqs
        for rid, nct in zip(
            getattr(cached, "req_ids", []) or [], getattr(cached, "num_computed_tokens", []) or []
        ):
            computed.setdefault(rid, nct)
        step, rows = [], []
        for rid, n in so.num_scheduled_tokens.items():
            start = computed.get(rid, 0)
            info = REC.requests.get(rid) or {
                "rid": rid,
                "prompt": (),
                "index": -1,
                "first_computed": None,
                "hasher": False,
            }
            if info.get("first_computed") is None:
                info["first_computed"] = start
            step.append((rid, start, n, info))
            prompt = info["prompt"]
            for pos in range(start, start + n):
                rows.append((info["index"], pos, prompt[pos] if pos < len(prompt) else -1))
        REC.steps.append(step)
        if self.capture_layers is None:
            return
        base = torch.tensor(rows, dtype=torch.float32).reshape(-1, 3)
        layer_tensors = [
            torch.cat([torch.full((len(rows), 1), float(layer)), base], dim=1)
            for layer in self.capture_layers
        ]
        if self.captured is None:
            self.captured = [[t] for t in layer_tensors]
        else:
            for parts, t in zip(self.captured, layer_tensors):
                parts.append(t)


# ------------------------------------------------------------------ bridges for hard API breaks
def install_bridges(gen_mod: NodeModule) -> None:
    import vllm.config as vcfg
    import vllm.v1.core.kv_cache_utils as kvu
    import vllm.v1.core.sched.scheduler as vsched
    import vllm.v1.executor.multiproc_executor as vmpe

    # The GPU side.
    TWO_PHASE[0] = hasattr(vmpe.MultiprocExecutor, "sample_tokens")
    gen_mod.MultiprocExecutor = StandInExecutor
    vmpe.MultiprocExecutor = StandInExecutor
    import torch

    gib = float(ARGS.get("free_memory_gib", 1))
    torch.cuda.mem_get_info = lambda *a, **k: (int(gib * (1 << 30)), int(80 * (1 << 30)))

    real_device = getattr(gen_mod, "DeviceConfig", vcfg.DeviceConfig)

    def device_config(*a, **k):
        if not a and "device" not in k:
            # scheduling is device-independent; never touch a GPU from the probe
            k["device"] = "cpu"
        return real_device(*a, **k)

    gen_mod.DeviceConfig = device_config

    real_sc = getattr(gen_mod, "SchedulerConfig", vcfg.SchedulerConfig)

    def scheduler_config(*a, **k):
        try:
            return real_sc(*a, **k)
        except Exception as exc:  # pydantic ValidationError for the missing InitVars
            missing = [name for name in ("is_encoder_decoder", "max_model_len") if name not in k]
            if not missing:
                raise
            REC.hard_break(
                "SchedulerConfig(is_encoder_decoder)",
                f"SchedulerConfig(...) lacks {', '.join(missing)} (required on vLLM {VLLM[0]}): "
                f"{type(exc).__name__}",
            )
            k.setdefault("is_encoder_decoder", False)
            k.setdefault("max_model_len", 8192)
            return real_sc(*a, **k)

    gen_mod.SchedulerConfig = scheduler_config

    real_kvc = getattr(
        gen_mod, "get_kv_cache_config_from_groups", kvu.get_kv_cache_config_from_groups
    )

    def kv_cache_config(*a, **k):
        try:
            return real_kvc(*a, **k)
        except TypeError as exc:
            if "kv_cache_specs" not in k:
                raise
            REC.hard_break(
                "kv_cache_specs=",
                f"get_kv_cache_config_from_groups(kv_cache_specs=...): {short(exc, 120)}",
            )
            k.pop("kv_cache_specs")
            return real_kvc(*a, **k)

    gen_mod.get_kv_cache_config_from_groups = kv_cache_config

    real_sched = getattr(gen_mod, "Scheduler", vsched.Scheduler)

    def scheduler(*a, **k):
        try:
            return real_sched(*a, **k)
        except TypeError as exc:
            if "block_size" in k or "block_size" not in str(exc):
                raise
            REC.hard_break(
                "Scheduler(block_size)", f"Scheduler(...) without block_size: {short(exc, 120)}"
            )
            k["block_size"] = k["vllm_config"].cache_config.block_size
            return real_sched(*a, **k)

    gen_mod.Scheduler = scheduler


def watch_scheduler(sched, vllm_config) -> None:
    """Record each request; if prefix caching is on and requests carry no block hasher, the block
    pool asserts on the first schedule() (`len(request.block_hashes) >= num_full_blocks`): bridge
    with one."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    real_add = sched.add_request
    hasher: list[bool] = []

    def add_request(request, *a, **k):
        prompt = tuple(request.prompt_token_ids or ())
        info = {
            "rid": request.request_id,
            "prompt": prompt,
            "index": PROMPT_INDEX.get(prompt, -1),
            "first_computed": None,
            "hasher": getattr(request, "_block_hasher", None) is not None,
        }
        REC.requests[request.request_id] = info
        REC.added.append(info)
        if (
            sched.kv_cache_manager.enable_caching
            and getattr(request, "_block_hasher", None) is None
        ):
            REC.hard_break(
                "block pool assert (prefix caching on, no hasher)",
                "prefix caching is on but requests carry no "
                f"block hasher: vLLM {VLLM[0]}'s block pool "
                "asserts on the first schedule()",
            )
            if not hasher:
                fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
                init_none_hash(fn)
                hasher.append(get_request_block_hasher(sched.block_size, fn))
            request._block_hasher = hasher[0]
            request.update_block_hashes()
        return real_add(request, *a, **k)

    sched.add_request = add_request


# ------------------------------------------------------------------ the worker side
def check_worker(worker_mod: NodeModule) -> tuple[bool, list[str]]:
    """Run the worker's _patched_forward on stand-ins exposing exactly the embedding API of the
    installed vLLM's LlamaModel / DeepseekV2Model (no weights: embeddings and layers are trivial
    tensors ops)."""
    import torch

    notes, ok = [], True
    classes = []
    for dotted in (
        "vllm.model_executor.models.llama.LlamaModel",
        "vllm.model_executor.models.deepseek_v2.DeepseekV2Model",
    ):
        mod_name, _, cls_name = dotted.rpartition(".")
        try:
            classes.append((cls_name, getattr(importlib.import_module(mod_name), cls_name)))
        except Exception as exc:
            notes.append(f"worker: cannot import {dotted}: {short(exc, 80)}")
    group = types.SimpleNamespace(is_first_rank=True, is_last_rank=True, rank_in_group=0)
    worker_mod.get_pp_group = lambda: group
    worker_mod.get_tp_group = lambda: group
    H = 8

    class Layer:
        def __call__(self, positions=None, hidden_states=None, residual=None, *a, **k):
            return hidden_states + 1, (hidden_states if residual is None else residual)

    for cls_name, cls in classes:
        attrs = {}
        if hasattr(cls, "embed_input_ids"):
            attrs["embed_input_ids"] = lambda self, ids: torch.ones(ids.shape[0], H)
        if hasattr(cls, "get_input_embeddings"):
            attrs["get_input_embeddings"] = lambda self, ids: torch.ones(ids.shape[0], H)
        fake = type(f"StandIn{cls_name}", (), attrs)()
        fake.layers = [Layer() for _ in range(4)]
        fake.start_layer, fake.end_layer = 0, 4
        fake.norm = lambda h, r: (h + r, None)
        store: list[Any] = []
        fake._extension = types.SimpleNamespace(
            _layer_ids=frozenset({1, 2}), _store_captured_states=store.append
        )
        api = "/".join(sorted(attrs)) or "no embedding method"
        try:
            worker_mod._patched_forward(fake, torch.arange(5), torch.arange(5))
            if not store or len(store[0]) != 2:
                raise RuntimeError("no hidden states captured")
            notes.append(f"worker forward ok on {cls_name} ({api})")
        except Exception as exc:
            ok = False
            notes.append(f"worker forward fails on {cls_name} ({api}): {short(exc, 100)}")
    return ok, notes


# ------------------------------------------------------------------ the scenario
ARGS: dict = {}
PROMPT_INDEX: dict[tuple, int] = {}


def make_prompts(
    n_tokens_budget: int, max_model_len: int, shared: int, overshoot: float, vocab: int
) -> list[list[int]]:
    rng = random.Random(20240616)
    longest = max_model_len - 1  # the generator truncates to max_model_len - 1
    base = max(shared + 8, int(longest * 0.85))
    prefix = [rng.randrange(3, vocab) for _ in range(shared)]
    prompts: list[list[int]] = []
    total = 0
    while total < n_tokens_budget * overshoot:
        length = max(shared + 8, min(longest, base - 7 * len(prompts)))
        p = prefix + [rng.randrange(3, vocab) for _ in range(length - shared)]
        prompts.append(p)
        total += len(p)
    # Make sure some prompt straddles the first step's budget (else chunked prefill would split
    # nothing).
    cum = 0
    for i, p in enumerate(prompts):
        cum += len(p)
        if cum == n_tokens_budget:
            prompts[i] = p[:-3]
            break
    return prompts


def account(call_infos: list[dict], prompts: list[list[int]], steps: list) -> dict:
    """Per prompt of one generate() call: positions that went through the model, cache hits, splits.
    A prompt the call never turned into a request counts as lost entirely."""
    per, hits, split = [], 0, 0
    done_by_prompt: dict[int, set[int]] = {i: set() for i in range(len(prompts))}
    for info in call_infos:
        chunks = [(start, n) for step in steps for (_, start, n, inf) in step if inf is info]
        length = len(info["prompt"])
        positions = {p for start, n in chunks for p in range(start, start + n) if p < length}
        first = info.get("first_computed") or 0
        is_split = bool(chunks) and first + sum(n for _, n in chunks) < length
        if info["index"] in done_by_prompt:
            done_by_prompt[info["index"]] |= positions
        hits += first
        split += int(is_split)
        per.append(
            {
                "req": info["rid"],
                "prompt": info["index"],
                "len": length,
                "through_model": len(positions),
                "cache_hit": first,
                "steps": len(chunks),
                "split": is_split,
                "hasher": info["hasher"],
            }
        )
    lost = sum(len(p) - len(done_by_prompt[i]) for i, p in enumerate(prompts))
    return {
        "lost": lost,
        "cache_hits": hits,
        "split": split,
        "requests": per,
        "prompt_tokens": sum(len(p) for p in prompts),
    }


def check_results(results, prompts: list[list[int]], layers: list[int]) -> str | None:
    """The generator's output must hold, per prompt, one [len, hidden] tensor per layer with the
    rows that prompt's tokens produced, in order."""
    if not isinstance(results, list) or len(results) != len(prompts):
        size = len(results) if hasattr(results, "__len__") else "?"
        return (
            f"generate() returned {type(results).__name__} "
            f"of {size} items for {len(prompts)} prompts"
        )
    for i, (res, prompt) in enumerate(zip(results, prompts)):
        hs = res.get("hidden_states") if isinstance(res, dict) else None
        problem = _prompt_states_problem(i, hs, prompt, layers)
        if problem:
            return problem
    return None


def _prompt_states_problem(i: int, hs: object, prompt: list[int], layers: list[int]) -> str | None:
    """What is wrong with one prompt's hidden states: one tensor per layer, each that prompt's."""
    import torch

    if not isinstance(hs, list):
        return (
            f"prompt {i}: hidden_states is {type(hs).__name__}, want a list of "
            f"{len(layers)} tensors"
        )
    if len(hs) != len(layers):
        shape = tuple(hs[0].shape) if hs and hasattr(hs[0], "shape") else "?"
        return (
            f"prompt {i}: {len(hs)} hidden-state tensors of shape {shape}, want {len(layers)} "
            f"(one per layer) of shape ({len(prompt)}, hidden)"
        )
    want = torch.tensor([[i, pos, tok] for pos, tok in enumerate(prompt)], dtype=torch.float32)
    for layer, t in zip(layers, hs):
        problem = _layer_states_problem(i, layer, t, len(prompt), want)
        if problem:
            return problem
    return None


def _layer_states_problem(i: int, layer: int, t: Any, n: int, want: Any) -> str | None:
    """One layer's tensor for prompt `i` (`n` tokens): rows (layer, prompt, position, token), as the
    tiny model's layers write them (`want` holds the last three columns)."""
    import torch

    if tuple(t.shape) != (n, 4):
        return (
            f"prompt {i} layer {layer}: hidden states shaped {tuple(t.shape)}, want "
            f"({n}, hidden): tokens or hidden dimension sliced wrongly"
        )
    if not torch.equal(t[:, 1:], want):
        bad = int((t[:, 1:] != want).any(dim=1).nonzero()[0])
    elif not torch.equal(t[:, 0], torch.full((n,), float(layer))):
        bad = 0
    else:
        return None
    return f"prompt {i} layer {layer}: row {bad} is not that prompt's token (states misaligned)"


def run_calls(gen, prompts: list, layers: list, calls: int) -> list:
    """`calls` generate() calls of the same prompts, each accounted from what the scheduler
    recorded."""
    per_call = []
    for c in range(calls):
        added0 = len(REC.added)
        step0 = len(REC.steps)
        error = None
        results = None
        try:
            results = gen.generate([list(p) for p in prompts])
        except Exception as exc:
            log(traceback.format_exc())
            error = short(exc)
        acc = account(REC.added[added0:], prompts, REC.steps[step0:])
        acc["steps"] = len(REC.steps) - step0
        acc["error"] = error
        acc["misaligned"] = check_results(results, prompts, layers) if error is None else None
        per_call.append(acc)
        log(
            f"call {c + 1}: {acc['steps']} steps, {acc['lost']} of {acc['prompt_tokens']} prompt "
            f"tokens never through the model, {acc['cache_hits']} cache hits, {acc['split']} "
            f"split, error={error}, misaligned={acc['misaligned']}"
        )
    return per_call


def lost_tokens(per_call: list) -> str:
    """What the calls lost, and why, or '' when every prompt token went through the model."""
    lost = sum(a["lost"] for a in per_call)
    if not lost:
        return ""
    all_tokens = sum(a["prompt_tokens"] for a in per_call)
    hits = sum(a["cache_hits"] for a in per_call)
    splits = sum(a["split"] for a in per_call)
    why = []
    if hits:
        why.append(f"{hits} prefix-cache hits")
    if splits:
        why.append(f"{splits} prompt(s) split by chunked prefill, tail aborted")
    text = f"{lost} of {all_tokens} prompt tokens never go through the model" + (
        f" ({', '.join(why)})" if why else ""
    )
    if REC.hard_breaks:
        text += (
            f" (measured with its {len(REC.hard_breaks)} "
            f"vLLM {VLLM[0]} API break(s) bridged the naive "
            "way)"
        )
    return text


# Scheduler settings that lose prompt tokens, by themselves, and how the verdict names each.
_SCHEDULER_PROBLEMS = (
    ("enable_chunked_prefill", "chunked prefill on"),
    ("async_scheduling", "async scheduling resolves to on"),
)


def find_problems(per_call: list, config: dict, worker_ok: bool, worker_notes: list) -> list:
    """Every reason the generator fails the probe, in the order the verdict names them."""
    problems = [lost_tokens(per_call), *_config_problems(per_call, config)]
    if REC.hard_breaks:
        problems.append(f"breaks on vLLM {VLLM[0]}: {', '.join(REC.break_names)}")
    problems.append(_first_call_with(per_call, "error", "generate() raised: "))
    problems.append(_first_call_with(per_call, "misaligned", "hidden states returned wrong: "))
    if not worker_ok:
        problems.append(next(n for n in worker_notes if "fails" in n))
    return [p for p in problems if p]


def _config_problems(per_call: list, config: dict) -> list[str]:
    """The engine settings, as resolved, that break the generator."""
    out = []
    if config["enable_prefix_caching"] or config["kv_manager_caching"]:
        hashed = any(r["hasher"] for a in per_call for r in a["requests"])
        out.append("prefix caching on" + (" (hidden by a block hasher)" if hashed else ""))
    out += [name for key, name in _SCHEDULER_PROBLEMS if config[key]]
    return out


def _first_call_with(per_call: list, key: str, prefix: str) -> str:
    """The first call whose `key` is set, named with its number ("" when none)."""
    for i, a in enumerate(per_call):
        if a[key]:
            return f"{prefix}call {i + 1}: {a[key]}"
    return ""


def run(req: dict) -> dict:
    global ARGS
    ARGS = req.get("args") or {}
    paths = req.get("modules") or {}
    max_model_len = int(ARGS.get("max_model_len", 2048))
    calls = int(ARGS.get("calls", 2))
    shared = int(ARGS.get("shared_prefix", 256))
    overshoot = float(ARGS.get("overshoot", 1.3))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    t0 = time.monotonic()
    VLLM[0] = installed_version("vllm")
    evidence: list[str] = []
    details: dict = {
        "vllm": VLLM[0],
        "two_phase_steps": None,
        "args": {"max_model_len": max_model_len, "calls": calls, "shared_prefix": shared},
    }

    tmp = tempfile.mkdtemp(prefix="fleetops-probe-")
    try:
        cfg = make_tiny_model(tmp)
        gen_mod = load_module(GEN, paths.get(GEN))
        details["generator_file"] = getattr(gen_mod, "__file__", None)
        log(f"loaded {GEN} from {gen_mod.__file__} ({time.monotonic() - t0:.1f}s)")
        worker_ok, worker_notes = True, list[str]()
        if WORKER in paths:
            worker_mod = load_module(WORKER, paths[WORKER])
            worker_ok, worker_notes = check_worker(worker_mod)
            details["worker"] = worker_notes
        install_bridges(gen_mod)
        details["two_phase_steps"] = TWO_PHASE[0]

        # The file's own __init__ builds the config, the KV cache config and the Scheduler.
        try:
            gen = gen_mod.VllmHiddenStatesGenerator(model_path=tmp, max_model_len=max_model_len)
        except Exception as exc:
            log(traceback.format_exc())
            return {
                "ok": False,
                "summary": f"FAIL: VllmHiddenStatesGenerator() cannot be built on vLLM {VLLM[0]} "
                "even with the naive fixes bridged, so no prompt token goes through "
                f"the model: {short(exc, 150)}",
                "evidence": REC.hard_breaks + [short(exc)],
                "details": details,
            }
        vc = gen.vllm_config
        sc, cc = vc.scheduler_config, vc.cache_config
        sched = gen.scheduler
        config = {
            "enable_chunked_prefill": sc.enable_chunked_prefill,
            "max_num_batched_tokens": sc.max_num_batched_tokens,
            "max_num_seqs": sc.max_num_seqs,
            "async_scheduling": sc.async_scheduling,
            "enable_prefix_caching": cc.enable_prefix_caching,
            "kv_manager_caching": sched.kv_cache_manager.enable_caching,
            "scheduler_class": f"{type(sched).__module__}.{type(sched).__qualname__}",
            "block_size": cc.block_size,
            "scheduler_block_size": getattr(sched, "block_size", None),
            "num_gpu_blocks": cc.num_gpu_blocks,
        }
        details["config"] = config
        log("config built by the file:", config)
        watch_scheduler(sched, vc)

        budget = sc.max_num_batched_tokens
        prompts = make_prompts(budget, max_model_len, shared, overshoot, cfg["vocab_size"])
        PROMPT_INDEX.update({tuple(p): i for i, p in enumerate(prompts)})
        total = sum(len(p) for p in prompts)
        details["scenario"] = {
            "prompts": len(prompts),
            "prompt_tokens_per_call": total,
            "lengths": [len(p) for p in prompts],
            "shared_prefix": shared,
            "max_num_batched_tokens": budget,
        }
        layers = sorted(set(gen.layer_ids))

        per_call = run_calls(gen, prompts, layers, calls)
        details["calls"] = per_call
        details["sample_tokens_calls"] = sum(e.sample_calls for e in REC.executors)
        details["hard_breaks"] = REC.hard_breaks
        details["seconds"] = round(time.monotonic() - t0, 1)

        # ---------------------------------------------------------------- verdict
        all_tokens = sum(a["prompt_tokens"] for a in per_call)
        problems = find_problems(per_call, config, worker_ok, worker_notes)

        evidence.append(
            f"config from the file: chunked_prefill={config['enable_chunked_prefill']}, "
            f"prefix_caching={config['enable_prefix_caching']}, "
            f"async_scheduling={config['async_scheduling']}, "
            f"max_num_batched_tokens={budget}, scheduler={type(sched).__name__}"
        )
        for i, a in enumerate(per_call):
            evidence.append(
                f"call {i + 1}: {a['steps']} step(s), {a['prompt_tokens'] - a['lost']}/"
                f"{a['prompt_tokens']} prompt tokens through the model, {a['cache_hits']} cache "
                f"hits, {a['split']} split"
                + (f", raised {a['error']}" if a["error"] else "")
                + (f", {a['misaligned']}" if a["misaligned"] else "")
            )
        evidence += [f"hard break: {b}" for b in REC.hard_breaks]
        evidence += worker_notes
        scenario = (
            f"vLLM {VLLM[0]}: {calls} generate() calls x {len(prompts)} prompts, shared "
            f"{shared}-token prefix, {total} tokens/call > max_num_batched_tokens {budget}"
        )
        if problems:
            summary = "FAIL: " + "; ".join(problems) + f" [{scenario}]"
            return {"ok": False, "summary": summary, "evidence": evidence, "details": details}
        summary = (
            f"PASS: all {all_tokens} prompt tokens went through the model, whole and uncached "
            f"[{scenario}; chunked prefill, prefix caching and async scheduling off; sample_tokens "
            f"after each step; hidden states aligned per prompt]"
        )
        return {"ok": True, "summary": summary, "evidence": evidence, "details": details}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    try:
        req = json.loads(sys.stdin.read() or "{}")
    except ValueError as exc:
        emit(
            {
                "ok": False,
                "summary": f"probe got no JSON request on stdin: {exc}",
                "evidence": [],
                "details": {},
            }
        )
        return 0
    try:
        verdict = run(req)
    except Exception as exc:  # a verdict, whatever happened
        log(traceback.format_exc())
        verdict = {
            "ok": False,
            "summary": f"probe could not drive the generator: {short(exc, 200)}",
            "evidence": REC.hard_breaks + [traceback.format_exc().splitlines()[-1]],
            "details": {"traceback": traceback.format_exc().splitlines()[-8:]},
        }
    emit(verdict)
    sys.stderr.flush()
    # vLLM/torch may leave non-daemon threads or atexit work behind; the verdict is out, leave now.
    os._exit(0)


if __name__ == "__main__":
    main()
