"""A tiny decoder-only language model whose parameter names map to real components (tests only)."""

from __future__ import annotations

import torch
from torch import nn

from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.vocab import ComponentClass, ParamInfo

VOCAB = 50


class _Layer(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.self_attn = nn.ModuleDict(
            {n: nn.Linear(d, d, bias=False) for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
        )
        self.mlp = nn.ModuleDict(
            {"gate_proj": nn.Linear(d, 2 * d, bias=False), "up_proj": nn.Linear(d, 2 * d, bias=False),
             "down_proj": nn.Linear(2 * d, d, bias=False)}
        )  # fmt: skip
        self.input_layernorm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.self_attn
        h = self.input_layernorm(x)
        x = x + a["o_proj"](a["q_proj"](h) * torch.sigmoid(a["k_proj"](h)) + a["v_proj"](h))
        m = self.mlp
        return x + m["down_proj"](m["up_proj"](x) * nn.functional.silu(m["gate_proj"](x)))


class TinyLM(nn.Module):
    """embed_tokens -> layers -> norm -> lm_head; ``loss(tokens)`` is next-token cross-entropy."""

    def __init__(self, *, d: int = 16, num_layers: int = 2, vocab: int = VOCAB) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab, d)
        self.model.layers = nn.ModuleList([_Layer(d) for _ in range(num_layers)])
        self.model.norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self(tokens[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def make_plan(infos: list[ParamInfo], *, release_period: int, low_every: int = 2) -> SyncPlan:
    """A plan over the model's components: every ``low_every``-th component (sorted) is low."""
    keys = sorted({i.component for i in infos})
    comps = []
    for j, key in enumerate(keys):
        low = j % low_every == 1
        comps.append(
            ComponentPlan(
                key=key,
                score=float(len(keys) - j),
                cls=ComponentClass.LOW if low else ComponentClass.IMPORTANT,
                phase=(j // low_every) % release_period if low else None,
                expected_bytes=100 * (j + 1),
            )
        )
    return SyncPlan(release_period=release_period, components=tuple(comps))
