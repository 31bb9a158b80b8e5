"""The custom_worker fix of playbooks/speculators-0.3.0-vllm-0.16 (custom_worker.diff) as a patch
script: the warm-up's embedding lookup, renamed in vLLM 0.16 (get_input_embeddings ->
embed_input_ids). A transform finds the expression wherever it is, so it survives upstream moving
the function; it refuses (raises) when the code is neither the old form nor the fixed one. Stdlib
only; run by the node agent as transform(text)."""

OLD = """\
        hidden_states = (
            inputs_embeds
            if inputs_embeds is not None
            else self.get_input_embeddings(input_ids)
        )
"""

NEW = """\
        if inputs_embeds is not None:
            hidden_states = inputs_embeds
        elif hasattr(self, "embed_input_ids"):
            # vLLM 0.16 renamed get_input_embeddings to embed_input_ids
            hidden_states = self.embed_input_ids(input_ids)
        else:
            # Older vLLM (0.11): looked up by name, as 0.16's models lack it
            hidden_states = getattr(self, "get_input_embeddings")(input_ids)  # noqa: B009
"""


def transform(text: str) -> str:
    if NEW in text:
        return text  # already fixed: unchanged, so the agent says "already applied"
    if text.count(OLD) != 1:
        raise ValueError(
            f"expected the old embedding lookup exactly once, found it {text.count(OLD)} times"
        )
    return text.replace(OLD, NEW)
