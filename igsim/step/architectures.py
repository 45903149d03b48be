"""Built-in model shapes, a roofline workload for them, and carrying a plan over to a larger model.

The shapes use the parameter names and registration order of the installed transformers'
``*ForCausalLM`` classes (LLaMA, OPT, GPT-NeoX / Pythia; tied embeddings are listed once, as
``named_parameters()`` does), so :mod:`igpolicy.components` maps them like a real model.

:func:`architecture_workload` estimates compute with a roofline: ``6 · N · tokens`` FLOPs per step on
``N`` matrix parameters (embeddings excluded; attention's sequence-quadratic term ignored), one third
forward and two thirds backward, at ``utilisation`` of the accelerator's dense bf16 peak; AdamW is
memory bound at ``optimizer_bytes_per_param`` of HBM traffic per parameter. Gradients become ready in
reverse execution order, each when the backward FLOPs of everything after it are done.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from igpolicy.decide import nominal_k
from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.vocab import ComponentClass, ComponentId, ComponentKind, ParamInfo
from igsim.step.workload import Workload

__all__ = [
    "ACCELERATORS",
    "ARCHITECTURES",
    "Accelerator",
    "Architecture",
    "architecture_params",
    "architecture_workload",
    "transfer_plan",
]


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    """Dense bf16 peak (FLOP/s) and HBM bandwidth (bytes/s) of one accelerator."""

    name: str
    peak_flops_per_s: float
    hbm_bytes_per_s: float


ACCELERATORS = {
    "a100": Accelerator(name="a100", peak_flops_per_s=312e12, hbm_bytes_per_s=2.039e12),
    "h100": Accelerator(name="h100", peak_flops_per_s=989e12, hbm_bytes_per_s=3.35e12),
    "h200": Accelerator(name="h200", peak_flops_per_s=989e12, hbm_bytes_per_s=4.8e12),
}


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """A decoder-only Transformer's shape. ``family`` is one of llama, opt, gpt_neox."""

    name: str
    family: str
    hidden: int
    num_layers: int
    num_heads: int
    intermediate: int
    vocab: int
    num_kv_heads: int | None = None  # GQA (LLaMA-70B); None = num_heads
    max_positions: int = 2048  # OPT's learned positions
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.family not in ("llama", "opt", "gpt_neox"):
            raise ValueError(f"architecture {self.name!r}: unknown family {self.family!r}")
        if self.hidden % self.num_heads:
            raise ValueError(f"architecture {self.name!r}: hidden {self.hidden} not divisible by heads")

    def named_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every parameter in registration order."""
        return {"llama": _llama, "opt": _opt, "gpt_neox": _gpt_neox}[self.family](self)


def _llama(a: Architecture) -> list[tuple[str, tuple[int, ...]]]:
    h, d = a.hidden, a.hidden // a.num_heads
    kv = (a.num_kv_heads or a.num_heads) * d
    out = [("model.embed_tokens.weight", (a.vocab, h))]
    for i in range(a.num_layers):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "mlp.gate_proj.weight", (a.intermediate, h)),
            (p + "mlp.up_proj.weight", (a.intermediate, h)),
            (p + "mlp.down_proj.weight", (h, a.intermediate)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    out.append(("model.norm.weight", (h,)))
    if not a.tie_embeddings:
        out.append(("lm_head.weight", (a.vocab, h)))
    return out


def _opt(a: Architecture) -> list[tuple[str, tuple[int, ...]]]:
    h, f = a.hidden, a.intermediate
    d = "model.decoder."
    out = [
        (d + "embed_tokens.weight", (a.vocab, h)),
        (d + "embed_positions.weight", (a.max_positions + 2, h)),  # OPT offsets positions by 2
        (d + "final_layer_norm.weight", (h,)),
        (d + "final_layer_norm.bias", (h,)),
    ]
    for i in range(a.num_layers):
        p = f"{d}layers.{i}."
        for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
            out += [(p + f"self_attn.{proj}.weight", (h, h)), (p + f"self_attn.{proj}.bias", (h,))]
        out += [
            (p + "self_attn_layer_norm.weight", (h,)),
            (p + "self_attn_layer_norm.bias", (h,)),
            (p + "fc1.weight", (f, h)),
            (p + "fc1.bias", (f,)),
            (p + "fc2.weight", (h, f)),
            (p + "fc2.bias", (h,)),
            (p + "final_layer_norm.weight", (h,)),
            (p + "final_layer_norm.bias", (h,)),
        ]
    if not a.tie_embeddings:
        out.append(("lm_head.weight", (a.vocab, h)))
    return out


def _gpt_neox(a: Architecture) -> list[tuple[str, tuple[int, ...]]]:
    h, f = a.hidden, a.intermediate
    out = [("gpt_neox.embed_in.weight", (a.vocab, h))]
    for i in range(a.num_layers):
        p = f"gpt_neox.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (h,)),
            (p + "input_layernorm.bias", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.bias", (h,)),
            (p + "attention.query_key_value.weight", (3 * h, h)),
            (p + "attention.query_key_value.bias", (3 * h,)),
            (p + "attention.dense.weight", (h, h)),
            (p + "attention.dense.bias", (h,)),
            (p + "mlp.dense_h_to_4h.weight", (f, h)),
            (p + "mlp.dense_h_to_4h.bias", (f,)),
            (p + "mlp.dense_4h_to_h.weight", (h, f)),
            (p + "mlp.dense_4h_to_h.bias", (h,)),
        ]
    out += [("gpt_neox.final_layer_norm.weight", (h,)), ("gpt_neox.final_layer_norm.bias", (h,))]
    if not a.tie_embeddings:
        out.append(("lm_head.weight", (a.vocab, h)))
    return out


def _arch(
    name: str, family: str, hidden: int, layers: int, heads: int, inter: int, vocab: int, **kw
) -> Architecture:
    return Architecture(
        name=name,
        family=family,
        hidden=hidden,
        num_layers=layers,
        num_heads=heads,
        intermediate=inter,
        vocab=vocab,
        **kw,
    )


# Published configurations (config.json of the released checkpoints).
ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        _arch("llama-7b", "llama", 4096, 32, 32, 11008, 32000),
        _arch("llama-13b", "llama", 5120, 40, 40, 13824, 32000),
        _arch("llama-70b", "llama", 8192, 80, 64, 28672, 32000, num_kv_heads=8),
        _arch("opt-1.3b", "opt", 2048, 24, 32, 8192, 50272, tie_embeddings=True),
        _arch("opt-6.7b", "opt", 4096, 32, 32, 16384, 50272, tie_embeddings=True),
        _arch("gpt-neox-20b", "gpt_neox", 6144, 44, 64, 24576, 50432),
        _arch("pythia-160m", "gpt_neox", 768, 12, 12, 3072, 50304),
        _arch("pythia-410m", "gpt_neox", 1024, 24, 16, 4096, 50304),
        _arch("pythia-1b", "gpt_neox", 2048, 16, 8, 8192, 50304),
        _arch("pythia-1.4b", "gpt_neox", 2048, 24, 16, 8192, 50304),
        _arch("pythia-2.8b", "gpt_neox", 2560, 32, 32, 10240, 50304),
        _arch("pythia-6.9b", "gpt_neox", 4096, 32, 32, 16384, 50432),
        _arch("pythia-12b", "gpt_neox", 5120, 36, 40, 20480, 50688),
    )
}


def _lookup(name: str | Architecture) -> Architecture:
    if isinstance(name, Architecture):
        return name
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(f"unknown architecture {name!r} (known: {', '.join(ARCHITECTURES)})") from None


def architecture_params(name: str | Architecture, *, dtype: str = "bfloat16") -> list[ParamInfo]:
    """The architecture's parameters as ParamInfo, mapped to components by igpolicy.components."""
    from igpolicy.components import param_infos

    arch = _lookup(name)
    return list(param_infos([(n, s, dtype) for n, s in arch.named_shapes()]))


def _is_embedding(p: ParamInfo) -> bool:
    return ComponentId.from_key(p.component).kind in (ComponentKind.EMBEDDING, ComponentKind.POS_EMBEDDING)


def ready_fractions(params: Sequence[ParamInfo]) -> np.ndarray:
    """Fraction of backward time after which each parameter's gradient is ready, [P] in [0, 1].

    Forward executes embeddings, then layers 0..L-1, then final norm and head (registration order
    within each); backward runs in reverse, spending time in proportion to matrix parameters
    (embeddings take none, so they are ready last, at 1.0).
    """
    ids = [ComponentId.from_key(p.component) for p in params]
    num_layers = 1 + max((c.layer for c in ids if c.layer is not None), default=-1)

    def position(i: int) -> tuple[int, int]:
        c = ids[i]
        if c.kind in (ComponentKind.EMBEDDING, ComponentKind.POS_EMBEDDING):
            return (-1, params[i].order)
        return (c.layer if c.layer is not None else num_layers, params[i].order)

    weight = np.array([0 if _is_embedding(p) else p.numel for p in params], dtype=np.float64)
    backward = sorted(range(len(params)), key=position, reverse=True)
    total = weight.sum()
    frac = np.ones(len(params))
    done = 0.0
    for i in backward:
        done += weight[i]
        frac[i] = done / total if total > 0 else 1.0
    return np.clip(frac, 0.0, 1.0)


def architecture_workload(
    name: str | Architecture,
    *,
    accelerator: str = "h100",
    utilisation: float = 0.4,
    tokens_per_step: int = 4096,
    optimizer_bytes_per_param: float = 28.0,
    dtype: str = "bfloat16",
) -> Workload:
    """A one-step workload (cycled by the engine) from the roofline estimate of the module docstring.

    ``tokens_per_step`` is per rank (its micro-batches at the accumulation boundary). The default
    optimizer traffic, 28 bytes per parameter, is mixed-precision AdamW: read bf16 grad, fp32 master,
    m and v; write master, m, v and the bf16 weight.

    >>> w = architecture_workload("llama-7b", accelerator="h100", tokens_per_step=4096)  # doctest: +SKIP
    """
    arch = _lookup(name)
    acc = ACCELERATORS.get(accelerator)
    if acc is None:
        raise ValueError(f"unknown accelerator {accelerator!r} (known: {', '.join(ACCELERATORS)})")
    if not (0 < utilisation <= 1):
        raise ValueError(f"utilisation={utilisation!r} must be in (0, 1]")
    if tokens_per_step < 1:
        raise ValueError(f"tokens_per_step={tokens_per_step!r} must be >= 1")
    params = tuple(architecture_params(arch, dtype=dtype))
    n_matmul = sum(p.numel for p in params if not _is_embedding(p))
    n_total = sum(p.numel for p in params)
    flops = 6.0 * n_matmul * tokens_per_step
    compute_s = flops / (acc.peak_flops_per_s * utilisation)
    backward_s = compute_s * 2.0 / 3.0
    return Workload(
        name=arch.name,
        params=params,
        ready_s=(ready_fractions(params) * backward_s)[None, :],
        forward_s=np.array([compute_s / 3.0]),
        backward_s=np.array([backward_s]),
        optimizer_s=np.array([n_total * optimizer_bytes_per_param / acc.hbm_bytes_per_s]),
        k=None,
        source={
            "architecture": arch.name,
            "accelerator": acc.name,
            "utilisation": utilisation,
            "tokens_per_step": tokens_per_step,
            "num_params": n_total,
        },
    )


# --------------------------------------------------------------------------- transfer
_KIND_FALLBACK: dict[ComponentKind, tuple[ComponentKind, ...]] = {
    ComponentKind.ATTN_Q: (ComponentKind.ATTN_QKV,),
    ComponentKind.ATTN_K: (ComponentKind.ATTN_QKV,),
    ComponentKind.ATTN_V: (ComponentKind.ATTN_QKV,),
    ComponentKind.ATTN_QKV: (ComponentKind.ATTN_Q, ComponentKind.ATTN_K, ComponentKind.ATTN_V),
    ComponentKind.MLP_GATE: (ComponentKind.MLP_GATE_UP, ComponentKind.MLP_UP),
    ComponentKind.MLP_UP: (ComponentKind.MLP_GATE_UP,),
    ComponentKind.MLP_GATE_UP: (ComponentKind.MLP_UP, ComponentKind.MLP_GATE),
}


def transfer_plan(
    plan: SyncPlan,
    src_params: Sequence[ParamInfo] | None,
    dst_params: Sequence[ParamInfo],
    *,
    density: float | None = None,
) -> SyncPlan:
    """Carry ``plan`` (profiled on ``src_params``) to ``dst_params`` by (component kind, relative depth).

    Destination layer l of L maps to source layer floor((l + 0.5) · L_src / L) of the same stack and
    kind (fused / split kinds stand in for each other: q|k|v <-> qkv, gate|up <-> gate_up; with several
    candidates the highest score decides). Layer-less components (embeddings, final norm, head) map
    by kind. A destination component with no counterpart is PINNED (always sent, never silently low)
    and listed in ``source["unmatched"]``. Expected bytes are recomputed for the destination at
    ``density`` (default: the plan's ``settings["density"]``, else 0.01) as nominal pairs · 8 bytes,
    and low components get fresh phases of equal expected bytes. ``src_params`` (optional) is
    checked against the plan.
    """
    from igpolicy.schedule import assign_phases

    if src_params is not None:
        from igpolicy.plan import compare_plans

        missing, extra = compare_plans(plan, [p.component for p in src_params])
        if missing or extra:
            raise ValueError(
                f"transfer_plan: plan {plan.fingerprint} does not match the source model "
                f"(missing {missing[:5]}, extra {extra[:5]})"
            )
    if density is None:
        density = float(plan.settings.get("density", 0.01))
    src = [(ComponentId.from_key(c.key), c) for c in plan.components]
    src_layers: dict[str, int] = {}
    for cid, _ in src:
        if cid.layer is not None:
            src_layers[cid.stack] = max(src_layers.get(cid.stack, 0), cid.layer + 1)
    dst_ids = {p.component: ComponentId.from_key(p.component) for p in dst_params}
    dst_layers: dict[str, int] = {}
    for cid in dst_ids.values():
        if cid.layer is not None:
            dst_layers[cid.stack] = max(dst_layers.get(cid.stack, 0), cid.layer + 1)
    expected: dict[str, int] = {}
    for p in dst_params:
        expected[p.component] = expected.get(p.component, 0) + nominal_k(p.numel, density) * 8

    chosen: dict[str, tuple[ComponentClass, float]] = {}
    unmatched: list[str] = []
    for key, cid in sorted(dst_ids.items()):
        cands = _candidates(cid, src, src_layers, dst_layers)
        if not cands:
            unmatched.append(key)
            chosen[key] = (ComponentClass.PINNED, 1.0)
            continue
        best = max(cands, key=lambda c: (c.score, c.key))
        chosen[key] = (best.cls, best.score)
    low = {k: expected[k] for k, (cls, _) in chosen.items() if cls == ComponentClass.LOW}
    phases = assign_phases(low, num_phases=plan.release_period) if low else {}
    comps = tuple(
        ComponentPlan(key=k, score=score, cls=cls, phase=phases.get(k), expected_bytes=expected[k])
        for k, (cls, score) in sorted(chosen.items())
    )
    settings = dict(plan.settings)
    settings["density"] = density
    return SyncPlan(
        release_period=plan.release_period,
        components=comps,
        settings=settings,
        source={
            "transferred_from": plan.fingerprint,
            "source": dict(plan.source),
            "rule": "component kind + relative depth",
            "unmatched": unmatched,
        },
    )


def _candidates(
    cid: ComponentId,
    src: Iterable[tuple[ComponentId, ComponentPlan]],
    src_layers: dict[str, int],
    dst_layers: dict[str, int],
) -> list[ComponentPlan]:
    src = list(src)
    stacks = [cid.stack, "decoder", "", "encoder"]
    kinds = (cid.kind, *_KIND_FALLBACK.get(cid.kind, ()))
    for kind in kinds:
        for stack in dict.fromkeys(stacks):
            if cid.layer is None:
                found = [c for s, c in src if s.kind == kind and s.stack == stack and s.layer is None]
            else:
                n_src = src_layers.get(stack)
                if not n_src:
                    continue
                n_dst = dst_layers[cid.stack]
                layer = min(n_src - 1, math.floor((cid.layer + 0.5) * n_src / n_dst))
                found = [c for s, c in src if s.kind == kind and s.stack == stack and s.layer == layer]
            if found:
                return found
    return []
