"""Make the lab's tiny model and dataset, locally and deterministically (no downloads): a 4-layer
Llama-architecture model with random weights, a word-level tokenizer, and a JSONL of prompts.

Run by the lab under the shared node venv's python (it needs torch, transformers and tokenizers):
    python model.py OUT_DIR
writes OUT_DIR/lab-model/ and OUT_DIR/lab-data/prompts.jsonl.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

WORDS = (
    "the node patch verify extract hidden state layer token model prompt batch speculator draft "
    "target vllm cache prefix chunk schedule gpu memory fleet operator laptop ssh log progress "
    "job resume manifest sample tensor shape rank worker config default silent corrupt check "
    "probe import grep compile call site signature block "
    "size encoder decoder async sampling step abort request"
).split()


NO_ML_STACK = 3  # exit status: this venv has no torch/transformers, so there is nothing to make


def main(out: Path) -> None:
    try:
        import torch
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    except ImportError as exc:
        print(f"no tiny model: {exc}", file=sys.stderr)
        sys.exit(NO_ML_STACK)

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {w: i for i, w in enumerate(specials + sorted(set(WORDS)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    torch.manual_seed(1234)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model_dir = out / "lab-model"
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    rng = random.Random(7)
    data_dir = out / "lab-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "prompts.jsonl", "w", encoding="utf-8") as f:
        for i in range(64):
            words = [rng.choice(WORDS) for _ in range(rng.randint(8, 120))]
            row = (
                {"text": " ".join(words)}
                if i % 8
                else {"input_ids": [1] + [vocab[w] for w in words]}
            )
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
