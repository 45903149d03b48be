"""Parameter name -> component mapping and fused-QKV splits.

Real names come from data/param_names.json (tiny random models built with transformers by
data/make_param_names.py), so the mapping tests need no transformers. The split oracles run the
real transformers attention code where it is importable and are skipped otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from igpolicy.components import (
    FAMILIES,
    LAYOUTS,
    component_of,
    detect_family,
    fused_layout_for,
    map_parameters,
    param_infos,
    split_fused_qkv,
)
from igpolicy.vocab import ComponentId, ComponentKind

K = ComponentKind
DATA = json.loads((Path(__file__).parent / "data" / "param_names.json").read_text())
MODELS = sorted(DATA)
ATTN = {K.ATTN_Q, K.ATTN_K, K.ATTN_V, K.ATTN_QKV, K.ATTN_O}
MLP = {K.MLP_UP, K.MLP_GATE, K.MLP_GATE_UP, K.MLP_DOWN}


def names_of(model: str) -> list[str]:
    return [n for n, _ in DATA[model]["params"]]


# ---------------------------------------------------------------- mapping of real names


EXPECTED = {
    "llama": {
        "model.embed_tokens.weight": "embedding",
        "model.layers.1.self_attn.k_proj.weight": "1.attn_k",
        "model.layers.0.mlp.gate_proj.weight": "0.mlp_gate",
        "model.layers.0.post_attention_layernorm.weight": "0.norm",
        "model.norm.weight": "norm",
        "lm_head.weight": "head",
    },
    "qwen2": {"model.layers.0.self_attn.v_proj.bias": "0.attn_v"},
    "opt": {
        "model.decoder.embed_positions.weight": "pos_embedding",
        "model.decoder.layers.1.self_attn.out_proj.bias": "1.attn_o",
        "model.decoder.layers.0.fc1.weight": "0.mlp_up",
        "model.decoder.layers.0.fc2.weight": "0.mlp_down",
        "model.decoder.layers.0.self_attn_layer_norm.weight": "0.norm",
        "model.decoder.layers.0.final_layer_norm.bias": "0.norm",
        "model.decoder.final_layer_norm.weight": "norm",
    },
    "gpt2": {
        "transformer.wte.weight": "embedding",
        "transformer.wpe.weight": "pos_embedding",
        "transformer.h.1.attn.c_attn.weight": "1.attn_qkv",
        "transformer.h.1.attn.c_attn.bias": "1.attn_qkv",
        "transformer.h.0.attn.c_proj.weight": "0.attn_o",
        "transformer.h.0.mlp.c_fc.weight": "0.mlp_up",
        "transformer.h.0.mlp.c_proj.bias": "0.mlp_down",
        "transformer.h.0.ln_2.weight": "0.norm",
        "transformer.ln_f.bias": "norm",
    },
    "gpt_neox": {
        "gpt_neox.embed_in.weight": "embedding",
        "gpt_neox.layers.0.attention.query_key_value.weight": "0.attn_qkv",
        "gpt_neox.layers.0.attention.dense.weight": "0.attn_o",
        "gpt_neox.layers.1.mlp.dense_h_to_4h.bias": "1.mlp_up",
        "gpt_neox.layers.1.mlp.dense_4h_to_h.weight": "1.mlp_down",
        "gpt_neox.final_layer_norm.weight": "norm",
        "lm_head.weight": "head",
    },
    "bloom": {
        "transformer.word_embeddings.weight": "embedding",
        "transformer.word_embeddings_layernorm.weight": "norm",
        "transformer.h.0.self_attention.query_key_value.weight": "0.attn_qkv",
        "transformer.h.0.self_attention.dense.weight": "0.attn_o",
    },
    "falcon_new": {
        "transformer.h.1.ln_attn.weight": "1.norm",
        "transformer.h.1.self_attention.query_key_value.weight": "1.attn_qkv",
        "transformer.h.1.mlp.dense_4h_to_h.weight": "1.mlp_down",
    },
    "phi": {
        "model.layers.0.self_attn.dense.weight": "0.attn_o",
        "model.layers.0.mlp.fc1.bias": "0.mlp_up",
        "model.final_layernorm.weight": "norm",
        "lm_head.bias": "head",
    },
    "phi3": {
        "model.layers.0.self_attn.qkv_proj.weight": "0.attn_qkv",
        "model.layers.0.mlp.gate_up_proj.weight": "0.mlp_gate_up",
    },
    "bert": {
        "bert.embeddings.word_embeddings.weight": "embedding",
        "bert.embeddings.token_type_embeddings.weight": "pos_embedding",
        "bert.embeddings.LayerNorm.bias": "norm",
        "bert.encoder.layer.1.attention.self.query.weight": "1.attn_q",
        "bert.encoder.layer.1.attention.output.dense.weight": "1.attn_o",
        "bert.encoder.layer.1.attention.output.LayerNorm.weight": "1.norm",
        "bert.encoder.layer.0.intermediate.dense.weight": "0.mlp_up",
        "bert.encoder.layer.0.output.dense.bias": "0.mlp_down",
        "bert.pooler.dense.weight": "head",
        "classifier.bias": "head",
    },
    "bert_mlm": {"cls.predictions.transform.LayerNorm.weight": "head", "cls.predictions.bias": "head"},
    "minilm": {"encoder.layer.5.attention.self.value.bias": "5.attn_v", "pooler.dense.bias": "head"},
    "t5_gated": {
        "shared.weight": "embedding",
        "encoder.embed_tokens.weight": "encoder.embedding",
        "encoder.block.0.layer.0.SelfAttention.q.weight": "encoder.0.attn_q",
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight": "encoder.pos_embedding",
        "decoder.block.1.layer.0.SelfAttention.o.weight": "decoder.1.attn_o",
        "decoder.block.1.layer.1.EncDecAttention.k.weight": "decoder.1.xattn_k",
        "decoder.block.1.layer.1.layer_norm.weight": "decoder.1.norm",
        "decoder.block.0.layer.2.DenseReluDense.wi_0.weight": "decoder.0.mlp_gate",
        "decoder.block.0.layer.2.DenseReluDense.wi_1.weight": "decoder.0.mlp_up",
        "encoder.block.1.layer.1.DenseReluDense.wo.weight": "encoder.1.mlp_down",
        "encoder.final_layer_norm.weight": "encoder.norm",
        "lm_head.weight": "head",
    },
    "t5": {"encoder.block.1.layer.1.DenseReluDense.wi.weight": "encoder.1.mlp_up"},
    "mixtral": {
        "model.layers.0.mlp.gate.weight": "0.router",
        "model.layers.0.mlp.experts.gate_up_proj": "0.mlp_gate_up",
        "model.layers.1.mlp.experts.down_proj": "1.mlp_down",
    },
    "qwen2_moe": {
        "model.layers.0.mlp.shared_expert.up_proj.weight": "0.mlp_up",
        "model.layers.0.mlp.shared_expert_gate.weight": "0.router",
    },
}


@pytest.mark.parametrize(
    ("model", "name", "key"), [(m, n, k) for m, e in EXPECTED.items() for n, k in e.items()]
)
def test_hand_written_expectations(model, name, key):
    assert name in names_of(model), "expectation names a parameter the real model does not have"
    assert map_parameters(names_of(model)).components[name].key == key


@pytest.mark.parametrize("model", MODELS)
def test_real_models(model):
    entry = DATA[model]
    names = names_of(model)
    cmap = map_parameters(names)
    assert cmap.family == detect_family(names) == entry["family"]
    assert cmap.unknown == ()
    assert "every parameter recognised" in cmap.report()
    assert list(cmap.components) == names
    # the single-name guess agrees with the whole-model decision for every real family
    assert all(component_of(n) == c for n, c in cmap.components.items())
    # every layer of every stack has attention and MLP components
    stacks = ("encoder", "decoder") if cmap.stacked else ("",)
    for stack in stacks:
        for layer in range(entry["num_layers"]):
            kinds = {c.kind for c in cmap.components.values() if c.layer == layer and c.stack == stack}
            assert kinds & ATTN and kinds & MLP, (stack, layer, kinds)
    assert all(c.layer is None or 0 <= c.layer < entry["num_layers"] for c in cmap.components.values())
    # a bias maps with its weight; keys round-trip
    for n, c in cmap.components.items():
        if n.endswith(".bias") and n[: -len("bias")] + "weight" in cmap.components:
            assert cmap.components[n[: -len("bias")] + "weight"] == c
        assert ComponentId.from_key(c.key) == c


@pytest.mark.parametrize("model", ["t5", "t5_gated"])
def test_t5_stacks_are_disjoint(model):
    cmap = map_parameters(names_of(model))
    enc = {c.key for n, c in cmap.components.items() if n.startswith("encoder.")}
    dec = {c.key for n, c in cmap.components.items() if n.startswith("decoder.")}
    assert enc and dec and not enc & dec
    assert all(k.startswith("encoder.") for k in enc) and all(k.startswith("decoder.") for k in dec)
    assert not any(
        c.kind.value.startswith("xattn") for n, c in cmap.components.items() if n.startswith("encoder.")
    )


def test_decoder_only_and_encoder_only_models_have_no_stack():
    for model in ("opt", "bert", "minilm", "llama"):
        assert all(c.stack == "" for c in map_parameters(names_of(model)).components.values())


REAL_PAIRS = [(m, n) for m in MODELS for n in names_of(m)]
WRAPS = st.lists(
    st.sampled_from(["module.", "_orig_mod.", "base_model.model.", "_fsdp_wrapped_module."]), max_size=3
)


@settings(max_examples=300, deadline=None)
@given(
    pair=st.sampled_from(REAL_PAIRS),
    wraps=WRAPS,
    adapter=st.sampled_from(["", "lora_A.default.", "lora_B.default.", "base_layer."]),
)
def test_wrappers_and_adapters_map_to_the_base_parameter(pair, wraps, adapter):
    model, name = pair
    cmap = map_parameters(names_of(model))
    wrapped = "".join(wraps) + name
    if adapter and name.endswith(".weight"):
        wrapped = wrapped[: -len("weight")] + adapter + "weight"
    assert component_of(wrapped, stacked=cmap.stacked) == cmap.components[name]
    assert component_of(wrapped) == cmap.components[name]  # the guess sees through wrappers too


# ---------------------------------------------------------------- other naming conventions


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("model.layers.3.block_sparse_moe.experts.5.w1.weight", "3.expert5.mlp_gate"),
        ("model.layers.3.block_sparse_moe.experts.5.w3.weight", "3.expert5.mlp_up"),
        ("model.layers.3.block_sparse_moe.experts.5.w2.weight", "3.expert5.mlp_down"),
        ("model.layers.3.block_sparse_moe.gate.weight", "3.router"),
        ("model.layers.2.mlp.experts.11.gate_proj.weight", "2.expert11.mlp_gate"),
        ("model.layers.2.mlp.experts.11.down_proj.weight", "2.expert11.mlp_down"),
        ("model.layers.2.mlp.shared_experts.up_proj.weight", "2.mlp_up"),
        ("layers.7.attention.wq.weight", "7.attn_q"),  # Meta's original LLaMA checkpoints
        ("layers.7.attention.wo.weight", "7.attn_o"),
        ("layers.7.feed_forward.w1.weight", "7.mlp_gate"),
        ("layers.7.attention_norm.weight", "7.norm"),
        ("tok_embeddings.weight", "embedding"),
        ("output.weight", "head"),
        ("score.weight", "head"),
        ("base_model.model.score.modules_to_save.default.weight", "head"),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight", "0.attn_q"),
        ("model.embed_tokens.lora_embedding_A.default", "embedding"),
        ("model.layers.0.self_attn.q_norm.weight", "0.norm"),
    ],
)
def test_other_conventions(name, key):
    assert component_of(name).key == key


def test_bart_style_two_stacks_are_detected_from_the_name_set():
    names = [
        "model.shared.weight",
        "model.encoder.layers.0.self_attn.q_proj.weight",
        "model.encoder.layers.0.fc1.weight",
        "model.decoder.layers.0.self_attn.q_proj.weight",
        "model.decoder.layers.0.encoder_attn.q_proj.weight",
        "model.decoder.layers.0.encoder_attn.out_proj.bias",
        "model.decoder.layers.0.encoder_attn_layer_norm.weight",
        "model.decoder.layers.0.fc2.weight",
    ]
    keys = [c.key for c in map_parameters(names).components.values()]
    assert keys == [
        "embedding", "encoder.0.attn_q", "encoder.0.mlp_up", "decoder.0.attn_q", "decoder.0.xattn_q",
        "decoder.0.xattn_o", "decoder.0.norm", "decoder.0.mlp_down",
    ]  # fmt: skip


def test_unknown_names_are_reported_never_dropped():
    extra = [
        "model.layers.1.self_attn.mystery_scale",
        "frobnicator.weight",
        "model.layers.0.mlp.experts.2.zeta",
    ]
    names = names_of("llama") + extra
    cmap = map_parameters(names)
    assert cmap.unknown == tuple(extra)
    assert [cmap.components[n].key for n in extra] == ["1.other", "other", "0.other"]
    report = cmap.report()
    assert "3 parameter(s) not recognised" in report
    assert all(n in report for n in extra)
    assert len(cmap.components) == len(names)


@pytest.mark.parametrize("bad", ["", "..."])
def test_bad_names(bad):
    with pytest.raises(ValueError, match="parameter name"):
        component_of(bad)


def test_duplicates_rejected():
    with pytest.raises(ValueError, match=r"duplicate parameter name 'lm_head\.weight'"):
        map_parameters(["lm_head.weight", "lm_head.weight"])


def test_detect_family_unknown():
    assert detect_family(["encoder.stages.0.conv.weight"]) == "unknown"
    assert detect_family([]) == "unknown"
    assert detect_family(names_of("mistral")) == "llama"


def test_param_infos():
    named = [(n, tuple(s), "bfloat16") for n, s in DATA["gpt2"]["params"]]
    infos = param_infos(named)
    cmap = map_parameters(n for n, _, _ in named)
    assert [p.order for p in infos] == list(range(len(named)))
    assert [p.name for p in infos] == [n for n, _, _ in named]
    assert all(p.component == cmap.components[p.name].key for p in infos)
    assert infos[0].numel == 128 * 32 and infos[0].dtype == "bfloat16"
    with pytest.raises(ValueError, match="shape"):
        param_infos([("w", (2, -1), "float32")])
    with pytest.raises(ValueError, match="dtype"):
        param_infos([("w", (2,), "")])


# ---------------------------------------------------------------- fused QKV


def test_fused_layout_for_real_names():
    for model in MODELS:
        family = DATA[model]["family"]
        layouts = {n: fused_layout_for(n, family) for n in names_of(model)}
        cmap = map_parameters(names_of(model))
        for n, layout in layouts.items():
            # exactly the fused q/k/v parameters have a layout
            assert (layout is not None) == (cmap.components[n].kind is K.ATTN_QKV), (model, n)
    assert fused_layout_for("transformer.h.0.attn.c_attn.weight", "gpt2") == "gpt2"
    assert fused_layout_for("model.layers.0.self_attn.qkv_proj.weight", "phi3") == "contiguous"
    with pytest.raises(ValueError, match="family 'gpt3'"):
        fused_layout_for("x.weight", "gpt3")
    assert set(FAMILIES) >= {DATA[m]["family"] for m in MODELS}


def _check_partition(split, shape, num_heads, num_kv_heads):
    rows = shape[split.dim]
    parts = [split.index[k] for k in (K.ATTN_Q, K.ATTN_K, K.ATTN_V)]
    assert set(split.index) == {K.ATTN_Q, K.ATTN_K, K.ATTN_V}
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(rows))
    d = split.head_dim
    assert [len(p) for p in parts] == [num_heads * d, num_kv_heads * d, num_kv_heads * d]
    for p in parts:
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0) and not p.flags.writeable


@settings(max_examples=200, deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS),
    num_kv=st.integers(1, 6),
    group=st.integers(1, 4),
    head_dim=st.integers(1, 8),
    bias=st.booleans(),
)
def test_split_is_a_partition(layout, num_kv, group, head_dim, bias):
    mha = layout in ("gpt2", "gpt_neox", "bloom")
    num_heads = num_kv * group
    kv = num_heads if mha else num_kv
    hidden = num_heads * head_dim
    rows = (num_heads + 2 * kv) * head_dim
    shape = (rows,) if bias else ((hidden, rows) if layout == "gpt2" else (rows, hidden))
    split = split_fused_qkv(layout=layout, shape=shape, num_heads=num_heads, num_kv_heads=None if mha else kv)
    _check_partition(split, shape, num_heads, kv)
    assert split.dim == (1 if layout == "gpt2" and not bias else 0)
    if not bias and not mha:  # inferred from the weight's shape
        assert split_fused_qkv(layout=layout, shape=shape, num_heads=num_heads).num_kv_heads == kv


@pytest.mark.parametrize(
    "model", [m for m in MODELS if DATA[m]["family"] in ("gpt2", "gpt_neox", "bloom", "falcon", "phi3")]
)
def test_split_real_shapes(model):
    entry = DATA[model]
    heads = entry["attn"]
    for name, shape in entry["params"]:
        layout = fused_layout_for(name, entry["family"])
        if layout is None:
            continue
        split = split_fused_qkv(layout=layout, shape=tuple(shape), num_heads=heads["num_heads"])
        assert split.num_kv_heads == heads["num_kv_heads"]
        _check_partition(split, shape, heads["num_heads"], heads["num_kv_heads"])


def test_split_known_values():
    # falcon multi-query, 4 heads of 2: rows q0 q1 q2 q3 k v
    s = split_fused_qkv(layout="falcon", shape=(12, 8), num_heads=4)
    assert s.index[K.ATTN_K].tolist() == [8, 9] and s.index[K.ATTN_V].tolist() == [10, 11]
    # falcon grouped, 4 heads, 2 kv groups of head_dim 1: q q k v q q k v
    s = split_fused_qkv(layout="falcon", shape=(8,), num_heads=4, num_kv_heads=2)
    assert s.index[K.ATTN_Q].tolist() == [0, 1, 4, 5] and s.index[K.ATTN_V].tolist() == [3, 7]
    # NeoX is not contiguous thirds
    s = split_fused_qkv(layout="gpt_neox", shape=(12, 4), num_heads=2)
    assert s.index[K.ATTN_Q].tolist() == [0, 1, 6, 7]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(layout="neox", shape=(12, 4), num_heads=2), "unknown fused qkv layout"),
        (dict(layout="gpt_neox", shape=(12, 4, 1), num_heads=2), "1-D"),
        (dict(layout="gpt_neox", shape=(12, 4), num_heads=0), "num_heads"),
        (dict(layout="gpt_neox", shape=(14, 4), num_heads=2), "not a multiple"),
        (dict(layout="gpt_neox", shape=(12, 6), num_heads=2), "hidden"),
        (dict(layout="gpt_neox", shape=(12, 4), num_heads=2, num_kv_heads=1), "num_kv_heads == num_heads"),
        (dict(layout="gpt2", shape=(12, 12), num_heads=2), "Conv1D"),  # e.g. GPT-BigCode's Linear c_attn
        (dict(layout="falcon", shape=(12,), num_heads=4), "pass num_kv_heads"),
        (dict(layout="contiguous", shape=(16, 8), num_heads=3), "pass num_kv_heads"),
        (dict(layout="contiguous", shape=(10, 8), num_heads=4), "fit no num_kv_heads"),
        (dict(layout="falcon", shape=(24, 8), num_heads=4, num_kv_heads=3), "must divide"),
    ],
)
def test_split_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        split_fused_qkv(**kwargs)


# ---------------------------------------------------------------- oracle: the real transformers code


class _Captured(Exception):
    pass


def _capture_attention(monkeypatch, module, attention, hidden, **forward_kwargs):
    """Run ``attention``'s real forward; return (q, k, v) as channel indices, head-major.

    The fused projection is set so that output channel c carries the value c for the input e_0;
    rotary embedding is replaced by the identity and the attention kernel by a capture.
    """
    torch = pytest.importorskip("torch")
    seen = {}

    def capture(_module, q, k, v, *args, **kwargs):
        seen.update(q=q, k=k, v=v)
        raise _Captured

    monkeypatch.setattr(module, "eager_attention_forward", capture)
    if hasattr(module, "apply_rotary_pos_emb"):
        monkeypatch.setattr(module, "apply_rotary_pos_emb", lambda q, k, *a, **kw: (q, k))
    attention.config._attn_implementation = "eager"
    x = torch.zeros(1, 1, hidden)
    x[..., 0] = 1.0
    with pytest.raises(_Captured):
        attention(x, **forward_kwargs)
    # [batch, heads, seq, head_dim] -> head-major channel list
    return [seen[t][0, :, 0, :].reshape(-1).round().long().tolist() for t in ("q", "k", "v")]


def _set_fused(linear_weight, bias, *, transposed=False):
    torch = pytest.importorskip("torch")
    with torch.no_grad():
        linear_weight.zero_()
        rows = torch.arange(linear_weight.shape[1 if transposed else 0], dtype=linear_weight.dtype)
        if transposed:
            linear_weight[0, :] = rows
        else:
            linear_weight[:, 0] = rows
        if bias is not None:
            bias.zero_()


def _indices(split):
    """q, k, v channel indices of a split, head-major (the order the oracles produce)."""
    return [split.index[k].tolist() for k in (K.ATTN_Q, K.ATTN_K, K.ATTN_V)]


def test_oracle_gpt_neox(monkeypatch):
    pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    from transformers.models.gpt_neox import modeling_gpt_neox as mod

    attn = mod.GPTNeoXAttention(tf.GPTNeoXConfig(hidden_size=24, num_attention_heads=3), layer_idx=0)
    _set_fused(attn.query_key_value.weight, attn.query_key_value.bias)
    got = _capture_attention(
        monkeypatch, mod, attn, 24, attention_mask=None, position_embeddings=(None, None)
    )
    split = split_fused_qkv(layout="gpt_neox", shape=tuple(attn.query_key_value.weight.shape), num_heads=3)
    assert got == _indices(split)


def test_oracle_phi3(monkeypatch):
    pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    from transformers.models.phi3 import modeling_phi3 as mod

    cfg = tf.Phi3Config(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, eos_token_id=0
    )
    attn = mod.Phi3Attention(cfg, layer_idx=0)
    _set_fused(attn.qkv_proj.weight, attn.qkv_proj.bias)
    got = _capture_attention(
        monkeypatch, mod, attn, 32, attention_mask=None, position_embeddings=(None, None)
    )
    split = split_fused_qkv(layout="contiguous", shape=tuple(attn.qkv_proj.weight.shape), num_heads=4)
    assert split.num_kv_heads == 2
    assert got == _indices(split)


def test_oracle_gpt2(monkeypatch):
    pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    from transformers.models.gpt2 import modeling_gpt2 as mod

    attn = mod.GPT2Attention(tf.GPT2Config(n_embd=24, n_head=3, bos_token_id=0, eos_token_id=0), layer_idx=0)
    _set_fused(attn.c_attn.weight, attn.c_attn.bias, transposed=True)  # Conv1D weight is [in, out]
    got = _capture_attention(monkeypatch, mod, attn, 24)
    split = split_fused_qkv(layout="gpt2", shape=tuple(attn.c_attn.weight.shape), num_heads=3)
    assert split.dim == 1
    assert got == _indices(split)


def test_oracle_bloom():
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import BloomAttention

    attn = BloomAttention(tf.BloomConfig(hidden_size=24, n_head=3), layer_idx=0)
    fused = torch.arange(72, dtype=torch.float32).view(1, 1, 72)
    q, k, v = attn._reshape(fused)  # [batch, heads, seq, head_dim]
    got = [t[0, :, 0, :].reshape(-1).long().tolist() for t in (q, k, v)]
    split = split_fused_qkv(layout="bloom", shape=tuple(attn.query_key_value.weight.shape), num_heads=3)
    assert got == _indices(split)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(multi_query=True),
        dict(multi_query=False),
        dict(new_decoder_architecture=True, num_kv_heads=2),
        dict(new_decoder_architecture=True, num_kv_heads=4),
    ],
)
def test_oracle_falcon(kwargs):
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    from transformers.models.falcon.modeling_falcon import FalconAttention

    attn = FalconAttention(tf.FalconConfig(hidden_size=32, num_attention_heads=4, **kwargs), layer_idx=0)
    rows = attn.query_key_value.weight.shape[0]
    if not hasattr(attn, "_split_heads"):  # transformers >= 5.25 inlines the split into forward
        pytest.skip(f"transformers {tf.__version__}: FalconAttention has no _split_heads to check against")
    q, k, v = attn._split_heads(torch.arange(rows, dtype=torch.float32).view(1, 1, rows))
    # [batch, seq, heads, head_dim]; k/v of grouped attention are broadcast over the group: dedupe
    got = [sorted(set(t[0, 0].reshape(-1).long().tolist())) for t in (q, k, v)]
    split = split_fused_qkv(layout="falcon", shape=tuple(attn.query_key_value.weight.shape), num_heads=4)
    assert got == _indices(split)  # k/v indices ascend within and across groups
    assert q[0, 0].reshape(-1).long().tolist() == split.index[K.ATTN_Q].tolist()
