"""Parameter name -> Transformer component, and the head-aware split of fused QKV weights.

Names are matched token by token (``model.layers.3.self_attn.q_proj.weight`` -> ``3.attn_q``), so
wrapper prefixes (``module.``, ``_orig_mod.``, ``base_model.model.`` …) need no special casing and a
bias maps with its weight. LoRA / PEFT adapter names (``q_proj.lora_A.default.weight``,
``q_proj.base_layer.weight``) map to their base projection. A name that matches no rule maps to
``ComponentKind.OTHER`` (keeping its layer when one is present) and is listed by
:meth:`ComponentMap.report`: the profiler pins such components, never treats them as low-importance.

Encoder-decoder models keep their stacks apart (``encoder.3.attn_q`` vs ``decoder.3.attn_q``).
Whether a model has two stacks is a property of the whole name set, so :func:`map_parameters` is
the reliable entry point; :func:`component_of` on one name guesses (T5 naming) unless told.

Freshly initialised parameters (a task head added for fine-tuning: BERT's ``classifier``, a
reward model's ``score``) are not like the pretrained ones around them: :func:`param_infos` and
:func:`mark_fresh` give every parameter matching a *fresh pattern* the component ``fresh``
(:data:`ComponentKind.FRESH`), which the profiler always pins. A pattern is a module name
(``classifier`` matches ``classifier.weight`` and ``model.classifier.dense.bias``) or a glob over the
full name (``*.score.*``); ``auto`` stands for :data:`FRESH_AUTO`. Without patterns the mapping is
unchanged (the classifier shares ``head`` with the pooler).

Fused q/k/v weights keep one component (``ATTN_QKV``); :func:`split_fused_qkv` gives the row (or
column) indices of q, k and v so a caller can account for them head-aware. Layouts, checked against
the installed transformers 5.x source (``transformers/models/...``):

- ``gpt2``: ``Conv1D`` weight ``[hidden, 3*hidden]``, output ``.split(split_size, dim=2)`` into
  q|k|v (modeling_gpt2.py, ``c_attn`` in ``GPT2Attention.forward``): contiguous thirds of dim 1
  (dim 0 of the bias).
- ``gpt_neox``: ``query_key_value(x).view(..., -1, 3 * head_size)`` then ``.chunk(3, dim=-1)``
  (modeling_gpt_neox.py, ``GPTNeoXAttention.forward``): head h owns rows ``[3hd, 3(h+1)d)`` = q_h|k_h|v_h.
- ``bloom``: ``fused_qkv.view(b, s, num_heads, 3, head_dim)`` (modeling_bloom.py,
  ``BloomAttention._reshape``): the same per-head interleave.
- ``falcon``: ``FalconAttention._split_heads`` (modeling_falcon.py): new architecture views
  ``(-1, num_heads // num_kv_heads + 2, head_dim)``: per kv group, its query heads then one k then
  one v; multi-query views ``(num_heads + 2, head_dim)`` (one group); classic MHA views
  ``(num_heads, 3, head_dim)`` (groups of one). All three are "grouped" with num_kv_heads = K.
- ``contiguous``: ``Phi3Attention.forward`` (modeling_phi3.py) slices ``qkv[..., :query_pos]``, then
  ``num_key_value_heads * head_dim`` for k, the rest for v.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from igpolicy.vocab import ComponentId, ComponentKind, ParamInfo

__all__ = [
    "FAMILIES",
    "FRESH_AUTO",
    "LAYOUTS",
    "ComponentMap",
    "FusedSplit",
    "component_of",
    "detect_family",
    "fresh_names",
    "fused_layout_for",
    "map_parameters",
    "mark_fresh",
    "param_infos",
    "split_fused_qkv",
]

FAMILIES = (
    "llama", "opt", "gpt2", "gpt_neox", "bloom", "falcon", "phi", "phi3", "bert", "t5", "mixtral",
    "qwen2_moe", "unknown",
)  # fmt: skip
LAYOUTS = ("gpt2", "gpt_neox", "bloom", "falcon", "contiguous")
# what ``auto`` marks fresh: Hugging Face task heads that ``from_pretrained`` initialises anew
# (sequence / token classification, reward and QA heads), outside the layers. An untied ``lm_head``
# is pretrained in post-training, so it is not in the list; name it explicitly when it is new.
FRESH_AUTO = ("classifier", "score", "qa_outputs")

K = ComponentKind
_WRAPPERS = frozenset(
    {"module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module", "base_layer"}
)
_ADAPTER = frozenset(
    {"lora_a", "lora_b", "lora_embedding_a", "lora_embedding_b", "lora_magnitude_vector", "lora_dropout",
     "modules_to_save", "original_module"}
)  # fmt: skip
_LEAVES = frozenset({"weight", "bias"})
_LAYER_CONTAINERS = frozenset({"layers", "layer", "h", "block", "blocks"})
_STACKS = ("encoder", "decoder")
_CROSS = frozenset({"encdecattention", "encoder_attn", "crossattention", "cross_attn", "cross_attention"})
_FFN = frozenset({"mlp", "block_sparse_moe", "moe", "feed_forward", "ffn"})
_TO_CROSS = {K.ATTN_Q: K.XATTN_Q, K.ATTN_K: K.XATTN_K, K.ATTN_V: K.XATTN_V, K.ATTN_O: K.XATTN_O}

# last module name inside a layer -> kind, where the name alone decides
_LAYER_KIND: dict[str, ComponentKind] = {
    **dict.fromkeys(("q_proj", "q", "query", "wq", "q_attn"), K.ATTN_Q),
    **dict.fromkeys(("k_proj", "k", "key", "wk"), K.ATTN_K),
    **dict.fromkeys(("v_proj", "v", "value", "wv"), K.ATTN_V),
    **dict.fromkeys(("o_proj", "o", "out_proj"), K.ATTN_O),
    **dict.fromkeys(("c_attn", "query_key_value", "qkv_proj", "qkv", "wqkv", "w_pack"), K.ATTN_QKV),
    **dict.fromkeys(("fc1", "c_fc", "fc_in", "up_proj", "wi", "wi_1", "w3", "dense_h_to_4h"), K.MLP_UP),
    **dict.fromkeys(("gate_proj", "wi_0", "w1"), K.MLP_GATE),
    "gate_up_proj": K.MLP_GATE_UP,
    **dict.fromkeys(("fc2", "fc_out", "down_proj", "w2", "dense_4h_to_h"), K.MLP_DOWN),
    **dict.fromkeys(("router", "shared_expert_gate"), K.ROUTER),
    "relative_attention_bias": K.POS_EMBEDDING,
}
_HEAD = frozenset({"lm_head", "embed_out", "classifier", "pooler", "score", "qa_outputs", "cls", "output",
                   "project_out"})  # fmt: skip
_POS = frozenset({"wpe", "embed_positions", "position_embeddings", "token_type_embeddings", "pos_emb",
                  "position_embedding", "relative_attention_bias"})  # fmt: skip
_EMB = frozenset({"wte", "embed_tokens", "embed_in", "word_embeddings", "shared", "tok_embeddings",
                  "token_embedding", "embeddings", "embedding", "project_in"})  # fmt: skip


def _is_norm(token: str) -> bool:
    return (
        "norm" in token
        or token == "ln"
        or token.startswith("ln_")
        or re.fullmatch(r"ln\d+", token) is not None
    )


def _is_attention(token: str) -> bool:
    return "attn" in token or "attention" in token


@dataclass(frozen=True, kw_only=True)
class _Parsed:
    tokens: tuple[str, ...]  # lower-cased module path, wrappers and the leaf removed
    layer_pos: int | None  # index of the layer number in ``tokens``
    expert: int | None


def _parse(name: str) -> _Parsed:
    if not isinstance(name, str) or not name.strip("."):
        raise ValueError(f"parameter name must be a non-empty string, got {name!r}")
    tokens = [t.lower() for t in name.split(".") if t]
    for i, t in enumerate(tokens):
        if t in _ADAPTER:  # lora_A.default.weight, modules_to_save.default.weight -> the base module
            tokens = tokens[:i]
            break
    tokens = [t for t in tokens if t not in _WRAPPERS]
    if tokens and tokens[-1] in _LEAVES:
        tokens = tokens[:-1]
    layer_pos = next(
        (i for i, t in enumerate(tokens) if t.isdigit() and i > 0 and tokens[i - 1] in _LAYER_CONTAINERS),
        None,
    )
    if layer_pos is None:  # unknown container: any number that is not an expert index
        layer_pos = next(
            (i for i, t in enumerate(tokens) if t.isdigit() and (i == 0 or tokens[i - 1] != "experts")), None
        )
    expert = next(
        (int(t) for i, t in enumerate(tokens) if t.isdigit() and i > 0 and tokens[i - 1] == "experts"), None
    )
    return _Parsed(tokens=tuple(tokens), layer_pos=layer_pos, expert=expert)


def _stack_of(p: _Parsed) -> str:
    """The first encoder/decoder token before the layer number (or anywhere, for non-layer names)."""
    end = len(p.tokens) if p.layer_pos is None else p.layer_pos
    return next((t for t in p.tokens[:end] if t in _STACKS), "")


def _guess_stacked(p: _Parsed) -> bool:
    """One name alone: T5-style naming, ``encoder.`` / ``decoder.`` at the very top (after a PEFT
    ``base_model.model.``) and not BERT's ``encoder.layer``. OPT's ``model.decoder.`` is one stack."""
    rest = p.tokens
    while rest[:2] == ("base_model", "model"):
        rest = rest[2:]
    return len(rest) >= 2 and rest[0] in _STACKS and rest[1] not in ("layer", "layers")


def _layer_kind(path: Sequence[str]) -> ComponentKind:
    """Kind of a parameter inside a layer, from its module path after the layer number."""
    path = [t for t in path if not t.isdigit()]
    if not path:
        return K.OTHER
    last, ctx = path[-1], path[:-1]
    if _is_norm(last):
        return K.NORM
    in_attention = any(_is_attention(t) for t in ctx)
    kind = _LAYER_KIND.get(last)
    if kind is None:
        if last in ("dense", "c_proj", "wo") and in_attention:
            kind = K.ATTN_O
        elif last in ("c_proj", "wo") or (last == "dense" and "output" in ctx):
            kind = K.MLP_DOWN  # gpt2 mlp.c_proj, T5 DenseReluDense.wo, BERT output.dense
        elif last == "dense" and "intermediate" in ctx:
            kind = K.MLP_UP
        elif last == "gate" and ctx and ctx[-1] in _FFN:
            kind = K.ROUTER
        else:
            return K.OTHER
    if any(t in _CROSS for t in ctx):
        return _TO_CROSS.get(kind, K.OTHER)  # no fused cross-attention kinds
    return kind


def _top_kind(tokens: Sequence[str]) -> ComponentKind:
    """Kind of a parameter outside the layers: heads, final norms, embeddings."""
    if any(t in _HEAD for t in tokens):
        return K.HEAD
    if any(_is_norm(t) for t in tokens):
        return K.NORM
    if any(t in _POS for t in tokens):
        return K.POS_EMBEDDING
    if any(t in _EMB for t in tokens):
        return K.EMBEDDING
    return K.OTHER


def component_of(name: str, *, stacked: bool | None = None) -> ComponentId:
    """The component of one parameter name (a bias maps with its weight).

    ``stacked`` says whether the model has separate encoder and decoder stacks (their keys are then
    prefixed ``encoder.`` / ``decoder.``); None guesses from this one name (T5-style naming).
    :func:`map_parameters` decides it from the whole name set. Per-layer components carry their
    layer; embeddings, final norms and heads have ``layer=None``; T5's relative attention bias (in
    block 0, shared by the stack) is ``POS_EMBEDDING`` with ``layer=None``. Unrecognised names give
    ``OTHER``, with the layer when one is present. Raises ValueError on an empty name.

    >>> component_of("module.model.layers.3.self_attn.q_proj.lora_A.default.weight").key
    '3.attn_q'
    """
    p = _parse(name)
    if stacked is None:
        stacked = _guess_stacked(p)
    stack = _stack_of(p) if stacked else ""
    if p.layer_pos is None:
        return ComponentId(kind=_top_kind(p.tokens), stack=stack)
    kind = _layer_kind(p.tokens[p.layer_pos + 1 :])
    layer = None if kind is K.POS_EMBEDDING else int(p.tokens[p.layer_pos])
    expert = p.expert if kind is not K.OTHER else None
    return ComponentId(kind=kind, layer=layer, stack=stack, expert=expert)


def detect_family(names: Iterable[str]) -> str:
    """The naming family of a model's parameters: one of :data:`FAMILIES` ("unknown" when none fits).

    LLaMA, Mistral and Qwen2 share one naming ("llama"); names alone cannot tell GPT-2 from
    GPT-BigCode, so :func:`split_fused_qkv` checks shapes as well.
    """
    toks: set[str] = set()
    for name in names:
        toks.update(_parse(name).tokens)
    if "block_sparse_moe" in toks:
        return "mixtral"
    if toks & {"shared_expert", "shared_experts"}:
        return "qwen2_moe"
    if "experts" in toks:
        return "mixtral"
    if toks & {"selfattention", "encdecattention", "densereludense"}:
        return "t5"
    if {"attention", "self", "intermediate"} <= toks:
        return "bert"
    if "c_attn" in toks:
        return "gpt2"
    if "query_key_value" in toks:
        if "self_attention" not in toks:
            return "gpt_neox"
        return "bloom" if "word_embeddings_layernorm" in toks else "falcon"
    if toks & {"qkv_proj", "gate_up_proj"}:
        return "phi3"
    if {"self_attn", "dense", "fc1"} <= toks:
        return "phi"
    if {"fc1", "out_proj"} <= toks:
        return "opt"
    if "q_proj" in toks and toks & {"gate_proj", "up_proj"}:
        return "llama"
    return "unknown"


def fused_layout_for(name: str, family: str) -> str | None:
    """The :data:`LAYOUTS` entry for a fused q/k/v parameter (weight or bias), None for any other name."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; expected one of {', '.join(FAMILIES)}")
    p = _parse(name)
    if not p.tokens or any(t in _CROSS for t in p.tokens):
        return None
    last = p.tokens[-1]
    if family == "gpt2" and last == "c_attn":
        return "gpt2"
    if family in ("gpt_neox", "bloom", "falcon") and last == "query_key_value":
        return family
    if family == "phi3" and last == "qkv_proj":
        return "contiguous"
    return None


@dataclass(frozen=True, kw_only=True)
class ComponentMap:
    """Every parameter's component, in input order, plus the names no rule recognised."""

    components: Mapping[str, ComponentId]
    unknown: tuple[str, ...]
    family: str
    stacked: bool = False

    @property
    def component_keys(self) -> tuple[str, ...]:
        """Distinct component keys, in first-seen order."""
        return tuple(dict.fromkeys(c.key for c in self.components.values()))

    def report(self) -> str:
        """A short text for the user: counts, and every unrecognised name (callers print it)."""
        head = (
            f"{len(self.components)} parameters -> {len(self.component_keys)} components "
            f"(naming family: {self.family})"
        )
        if not self.unknown:
            return head + "; every parameter recognised"
        lines = [
            head,
            f"{len(self.unknown)} parameter(s) not recognised, mapped to 'other' (always synchronised, "
            "never treated as low-importance):",
        ]
        lines += [f"  {n} -> {self.components[n].key}" for n in self.unknown]
        return "\n".join(lines)


def _has_two_stacks(names: Sequence[str]) -> bool:
    seen = set()
    for name in names:
        p = _parse(name)
        if p.layer_pos is not None:
            seen.add(_stack_of(p))
    return set(_STACKS) <= seen


def map_parameters(names: Iterable[str]) -> ComponentMap:
    """Map a model's parameter names (e.g. ``[n for n, _ in model.named_parameters()]``).

    The model is stacked (encoder/decoder keys kept apart) when both stacks have layers. Raises
    ValueError on a duplicate or empty name.
    """
    names = list(names)
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise ValueError(f"duplicate parameter name {n!r}")
        seen.add(n)
    stacked = _has_two_stacks(names)
    comps = {n: component_of(n, stacked=stacked) for n in names}
    unknown = tuple(n for n, c in comps.items() if c.kind is K.OTHER)
    return ComponentMap(
        components=MappingProxyType(comps), unknown=unknown, family=detect_family(names), stacked=stacked
    )


def _check_patterns(patterns: Iterable[str]) -> tuple[str, ...]:
    if isinstance(patterns, str):
        raise ValueError(f"fresh patterns must be a collection of strings, not the string {patterns!r}")
    out = []
    for pat in patterns:
        if not isinstance(pat, str) or not pat.strip(". "):
            raise ValueError(f"fresh pattern {pat!r} must be a non-empty module name or glob")
        out.extend(FRESH_AUTO if pat == "auto" else (pat,))
    return tuple(dict.fromkeys(out))


def fresh_names(names: Iterable[str], patterns: Iterable[str]) -> tuple[str, ...]:
    """The names (in input order) that match a fresh pattern (see the module docstring).

    A pattern without glob characters matches a name whose module path holds it as one token
    outside the layers (case-insensitive); one with ``*?[`` is an :mod:`fnmatch` glob over the whole
    name. ``auto`` expands to :data:`FRESH_AUTO`. Raises ValueError on an empty pattern.

    >>> fresh_names(["bert.pooler.dense.weight", "classifier.weight", "classifier.bias"], ["auto"])
    ('classifier.weight', 'classifier.bias')
    """
    pats = _check_patterns(patterns)
    globs = [p for p in pats if any(c in p for c in "*?[")]
    tokens = {p.lower() for p in pats if p not in globs}
    out = []
    for name in names:
        parsed = _parse(name)
        outside = parsed.tokens if parsed.layer_pos is None else parsed.tokens[: parsed.layer_pos]
        if tokens & set(outside) or any(fnmatch.fnmatchcase(name, g) for g in globs):
            out.append(name)
    return tuple(out)


def mark_fresh(infos: Sequence[ParamInfo], patterns: Iterable[str]) -> list[ParamInfo]:
    """``infos`` with every parameter matching a fresh pattern moved to the component ``fresh``.

    Used by the runtime (its own parameters), the simulator (a trace's or an architecture's) and
    the profiler, so all three see the same components. No patterns: ``infos`` unchanged. A
    pattern other than ``auto`` that matches nothing raises ValueError (a typo must not silently
    leave a new head among the pretrained ones); ``auto`` may match nothing.
    """
    import dataclasses

    if isinstance(patterns, str):
        raise ValueError(f"fresh patterns must be a collection of strings, not the string {patterns!r}")
    patterns = tuple(patterns)
    _check_patterns(patterns)
    if not patterns:
        return list(infos)
    names = [i.name for i in infos]
    unmatched = [p for p in patterns if p != "auto" and not fresh_names(names, [p])]
    if unmatched:
        raise ValueError(f"fresh pattern(s) {unmatched} match no parameter name (e.g. {names[:3]})")
    fresh = set(fresh_names(names, patterns))
    key = ComponentId(kind=K.FRESH).key
    return [dataclasses.replace(i, component=key) if i.name in fresh else i for i in infos]


def param_infos(
    named: Sequence[tuple[str, tuple[int, ...], str]], *, fresh: Iterable[str] = ()
) -> list[ParamInfo]:
    """(name, shape, dtype) in registration order -> ParamInfo with its component key and ``order``.

    Unknown names get an ``other`` component; print ``map_parameters(names).report()`` to show them.
    ``fresh``: fresh patterns (see :func:`mark_fresh`); their parameters get the ``fresh`` component.
    """
    for entry in named:
        if len(entry) != 3:
            raise ValueError(f"expected (name, shape, dtype), got {entry!r}")
        name, shape, dtype = entry
        if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape):
            raise ValueError(f"parameter {name!r}: shape must be non-negative ints, got {shape!r}")
        if not isinstance(dtype, str) or not dtype:
            raise ValueError(f"parameter {name!r}: dtype must be a name like 'float32', got {dtype!r}")
    cmap = map_parameters(n for n, _, _ in named)
    infos = [
        ParamInfo(name=n, shape=tuple(int(d) for d in s), dtype=dt, component=cmap.components[n].key, order=i)
        for i, (n, s, dt) in enumerate(named)
    ]
    return mark_fresh(infos, fresh)


@dataclass(frozen=True, kw_only=True, eq=False)
class FusedSplit:
    """Where q, k and v live in a fused parameter: read-only int64 indices along ``dim``.

    ``index[ATTN_Q]``, ``index[ATTN_K]``, ``index[ATTN_V]`` are ascending and together partition
    ``range(shape[dim])``; each lists its heads in order (head-major, then head_dim).
    """

    dim: int
    index: Mapping[ComponentKind, np.ndarray]
    num_kv_heads: int
    head_dim: int


def _heads(layout, shape, num_heads, num_kv_heads, dim) -> tuple[int, int]:
    """(num_kv_heads, head_dim) for a fused parameter, checked against its shape."""
    rows = shape[dim]
    where = f"fused qkv (layout {layout!r}, shape {tuple(shape)}, num_heads {num_heads})"
    if layout in ("gpt2", "gpt_neox", "bloom"):
        if num_kv_heads not in (None, num_heads):
            raise ValueError(f"{where}: layout {layout!r} has num_kv_heads == num_heads, got {num_kv_heads}")
        num_kv_heads = num_heads
    elif num_kv_heads is None:  # infer from a [rows, hidden] weight with head_dim = hidden / num_heads
        if len(shape) != 2 or shape[1] % num_heads:
            raise ValueError(f"{where}: pass num_kv_heads (it can only be inferred from a 2-D weight)")
        head_dim = shape[1] // num_heads
        extra = rows // head_dim - num_heads if head_dim and rows % head_dim == 0 else -1
        if extra <= 0 or extra % 2:
            raise ValueError(f"{where}: {rows} rows fit no num_kv_heads with head_dim {head_dim}")
        num_kv_heads = extra // 2
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"{where}: num_kv_heads {num_kv_heads} must divide num_heads")
    width = num_heads + 2 * num_kv_heads
    if rows % width or rows == 0:
        raise ValueError(f"{where}: {rows} along dim {dim} is not a multiple of {width} heads")
    head_dim = rows // width
    if layout == "gpt2" and len(shape) == 2 and shape[1] != 3 * shape[0]:
        raise ValueError(f"{where}: a GPT-2 Conv1D weight is [hidden, 3*hidden]")
    if layout in ("gpt_neox", "bloom", "falcon") and len(shape) == 2 and shape[1] != num_heads * head_dim:
        raise ValueError(f"{where}: hidden {shape[1]} != num_heads * head_dim {num_heads * head_dim}")
    return num_kv_heads, head_dim


def split_fused_qkv(
    *, layout: str, shape: tuple[int, ...], num_heads: int, num_kv_heads: int | None = None
) -> FusedSplit:
    """Head-aware indices of q, k and v in a fused weight or bias (see the module docstring).

    ``shape`` is the parameter's shape: a 2-D weight or a 1-D bias. ``num_kv_heads`` defaults to
    ``num_heads`` for gpt2 / gpt_neox / bloom; for falcon and contiguous it is inferred from a 2-D
    weight (head_dim = hidden / num_heads) and must be given for a bias. Raises ValueError when the
    shape does not fit the layout and head counts.

    >>> s = split_fused_qkv(layout="gpt_neox", shape=(12, 4), num_heads=2)
    >>> s.index[ComponentKind.ATTN_K].tolist()
    [2, 3, 8, 9]
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown fused qkv layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    shape = tuple(int(d) for d in shape)
    if len(shape) not in (1, 2):
        raise ValueError(f"fused qkv shape must be 1-D (bias) or 2-D (weight), got {shape}")
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    dim = 1 if layout == "gpt2" and len(shape) == 2 else 0
    kv, d = _heads(layout, shape, num_heads, num_kv_heads, dim)
    rows = np.arange(shape[dim], dtype=np.int64)
    if layout in ("gpt2", "contiguous"):
        q_end, k_end = num_heads * d, (num_heads + kv) * d
        parts = (rows[:q_end], rows[q_end:k_end], rows[k_end:])
    else:  # grouped: per kv group, its query heads, one k head, one v head (groups of one for MHA)
        group = num_heads // kv
        r = rows.reshape(kv, group + 2, d)
        parts = (r[:, :group].ravel(), r[:, group].ravel(), r[:, group + 1].ravel())
    index = {}
    for kind, part in zip((K.ATTN_Q, K.ATTN_K, K.ATTN_V), parts):
        arr = np.ascontiguousarray(part)
        arr.setflags(write=False)
        index[kind] = arr
    return FusedSplit(dim=dim, index=MappingProxyType(index), num_kv_heads=kv, head_dim=d)
