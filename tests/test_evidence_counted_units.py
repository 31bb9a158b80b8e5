"""Every evidence list in the human view shows its first lines and counts the rest ("and N more
(--json for all)"): a check's sixth call site that no longer binds was the only new break, and the
view used to drop it without a word. Drawn from a recorded verify answer (callsites on vLLM 0.17.0
against the 0.16 patch set)."""

from __future__ import annotations

from fleetops.report.console import Reporter
from fleetops.tasks.checks import _interpret_verify
from fleetops.tasks.plan import Plan

GEN, WORKER = "vllm_hidden_states_generator.py", "custom_worker.py"
CALLSITES = [  # as the node answers: one dict per call site that does not bind
    {
        "file": WORKER,
        "line": 30,
        "callee": "vllm.model_executor.models.deepseek_v2.DeepseekV2Model.get_input_embeddings",
        "error": "DeepseekV2Model has no attribute 'get_input_embeddings'",
    },
    {
        "file": WORKER,
        "line": 30,
        "callee": "vllm.model_executor.models.llama.LlamaModel.get_input_embeddings",
        "error": "LlamaModel has no attribute 'get_input_embeddings'",
    },
    {
        "file": GEN,
        "line": 136,
        "callee": "vllm.v1.core.kv_cache_utils.get_kv_cache_config_from_groups",
        "error": "got an unexpected keyword argument 'kv_cache_specs'",
    },
    {
        "file": GEN,
        "line": 148,
        "callee": "vllm.v1.core.sched.scheduler.Scheduler",
        "error": "missing a required argument: 'block_size'",
    },
    {
        "file": GEN,
        "line": 194,
        "callee": "vllm.config.SchedulerConfig",
        "error": "missing a required argument: 'is_encoder_decoder'",
    },
    {
        "file": GEN,
        "line": 236,
        "callee": "vllm.v1.request.Request",
        "error": "got an unexpected keyword argument 'eos_token_id'",
    },
]


def item(name: str, kind: str, evidence: list, **extra) -> dict:
    return {
        "name": name,
        "kind": kind,
        "ok": False,
        "msg": "failed",
        "evidence": evidence,
        "proves": "p",
        "cannot": "c",
        **extra,
    }


def drawn(items: list[dict]) -> list[str]:
    result = _interpret_verify(
        "lab02", Plan("verify", {}, 900, None), {"ok": False, "items": items}
    )
    # a failing verify's evidence is -v's (by default: a line a check)
    lines, _ = Reporter(verbose=True).draw(result)
    return ["".join(text for text, _ in line).strip() for line in lines]


def test_the_sixth_call_site_is_counted_not_dropped():
    text = drawn([item("vllm-callsites", "callsites", CALLSITES)])
    shown = [x for x in text if x.startswith((GEN, WORKER))]
    assert len(shown) == 5
    assert "and 1 more (--json for all)" in text
    # the sixth is behind --json, and the view says so
    assert not any("eos_token_id" in x for x in text)


def test_every_kind_of_evidence_list_counts_what_it_leaves_out():
    probe = [f"hard break: {n}" for n in range(8)]
    grep_kept = [{"line": n, "text": f"x{n}"} for n in range(50)]
    text = drawn(
        [
            item("p", "probe", probe),
            item("g", "grep", grep_kept, matches=64),
            item("short", "grep", grep_kept[:5], matches=5),
        ]
    )
    assert "and 3 more (--json for all)" in text
    # the node answers with 50 of a grep's 64 lines
    assert "and 59 more (--json for the first 50)" in text
    assert sum(1 for x in text if x.startswith("and ")) == 2  # five or fewer: nothing to count
