"""What a Synchronizer is built from: the model's named parameters, their ParamInfos, the default
sparsifier, and the fingerprints every rank (and a resumed run) must agree on."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import torch

from igpolicy.config import PolicyConfig
from igpolicy.plan import SyncPlan
from igpolicy.vocab import ParamInfo
from igrt.sync.sparsifiers import Sparsifier, make_sparsifier, sparsifier_state

__all__ = ["build_param_infos", "default_sparsifier", "fingerprint_parts", "named_parameters"]

_FP_LEN = 16
# PolicyConfig keys added after the igsync/1 state format, with their defaults: left out of the
# config digest at their default value, so a checkpoint written before them still resumes
_ADDED_KEYS = {
    "catch_up": False, "nonfinite": "skip", "fresh_patterns": [], "dense_small_numel": 0, "warmup_steps": 0,
    "online_window": 0, "replan_every": 0, "max_share": 0.0, "density_per_component": {}, "low_mode": "hold",
    "online_control": "",
}  # fmt: skip


def named_parameters(model_or_named: Any) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) pairs that require grad, from a module or an iterable of pairs."""
    if isinstance(model_or_named, torch.nn.Module):
        pairs = list(model_or_named.named_parameters())
    else:
        pairs = list(model_or_named)
    out = [(str(n), p) for n, p in pairs if p.requires_grad]
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ValueError("Synchronizer: parameter names must be unique")
    return out


def build_param_infos(named: Sequence[tuple[str, torch.Tensor]], *, fresh: Sequence[str] = ()) -> list[ParamInfo]:
    """ParamInfo per parameter via :func:`igpolicy.components.param_infos` (name → component;
    ``fresh``: fresh patterns, ``PolicyConfig.fresh_patterns``)."""
    from igpolicy.components import param_infos

    return list(
        param_infos([(n, tuple(p.shape), str(p.dtype).removeprefix("torch.")) for n, p in named], fresh=fresh)
    )


def default_sparsifier(config: PolicyConfig) -> Sparsifier:
    """``config.sparsifier`` (``adtopk`` whenever the policy is ``adtopk``), seeded by ``config.seed``.

    ``threshold`` needs its threshold: pass ``sparsifier=make_sparsifier("threshold", threshold=...)``.
    """
    name = "adtopk" if config.policy == "adtopk" else config.sparsifier
    return make_sparsifier(name, seed=config.seed)


def _digest(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:_FP_LEN]


def fingerprint_parts(
    *, plan: SyncPlan | None, config: PolicyConfig, infos: Sequence[ParamInfo], sparsifier: Sparsifier
) -> dict[str, str]:
    """16-character digests that must agree on every rank (and between a checkpoint and a resume)."""
    sp = {k: v for k, v in sparsifier_state(sparsifier).items() if k != "rank"}
    cfg = config.to_dict()
    for key, default in _ADDED_KEYS.items():  # so that states saved before the key existed still match
        if cfg.get(key) == default:
            cfg.pop(key)
    return {
        "plan": plan.fingerprint if plan is not None else "none",
        "config": _digest(cfg),
        "params": _digest([[i.name, list(i.shape), i.component] for i in infos]),
        "sparsifier": _digest(sp),
    }
