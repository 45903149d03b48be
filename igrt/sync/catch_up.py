"""Catch-up: scale a parameter's optimizer update by the steps its gradient stands for.

A low-importance component holds its gradient in the residual for R steps and then releases it;
with ``skip_unsent`` the optimizer steps it once per release. SGD moves it by the accumulated
gradient, R steps' worth. Adam and AdamW do not: their step is normalised by the gradient's running
RMS, so a gradient R times larger moves the weights no further, and the component learns at about
1/R of the pace of one that sends every step. Measured (docs/results.md, RQ5 diagnostic): catch-up
halves MiniLM's training-loss gap to Top-k+EF but not its held-out gap, and makes GPT's held-out
loss worse — an option to try, off by default.

With ``config.catch_up`` the update of each parameter that received a gradient is scaled by
``h``, the number of steps since its previous optimizer step::

    p_after = p_before + h * (p_stepped - p_before)

``h`` is 1 for a parameter that sent on the previous step too, so important components and the
Top-k / dense policies are untouched. :class:`CatchUp` holds the hooks: it snapshots, in an
optimizer step pre-hook, the parameters whose ``h > 1`` and rescales them in the post-hook. Memory:
one copy of the parameters released on that step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["CatchUp"]


class CatchUp:
    """Optimizer hooks that rescale updates by ``scales()`` (parameter name -> steps carried).

    ``params`` maps names to parameters; ``scales`` is called in the pre-hook and must describe the
    gradients about to be applied (the Synchronizer's :meth:`~igrt.sync.synchronizer.Synchronizer.update_scales`).
    """

    def __init__(
        self, params: Mapping[str, torch.nn.Parameter], scales: Callable[[], Mapping[str, int]]
    ) -> None:
        self.params = dict(params)
        self.scales = scales
        self._saved: dict[str, tuple[int, torch.Tensor]] = {}
        self._handles: list[Any] = []
        self.applied = 0  # parameter updates rescaled so far (tests, logs)

    def attach(self, optimizer: torch.optim.Optimizer) -> CatchUp:
        """Register the pre / post step hooks on ``optimizer``; returns self."""
        if self._handles:
            raise RuntimeError("CatchUp: already attached to an optimizer")
        self._handles = [
            optimizer.register_step_pre_hook(lambda *_: self.before_step()),
            optimizer.register_step_post_hook(lambda *_: self.after_step()),
        ]
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    @torch.no_grad()
    def before_step(self) -> None:
        self._saved = {}
        for name, h in self.scales().items():
            p = self.params.get(name)
            if p is None:
                raise KeyError(f"CatchUp: no parameter named {name!r}")
            if h > 1 and p.grad is not None:
                self._saved[name] = (int(h), p.detach().clone())

    @torch.no_grad()
    def after_step(self) -> None:
        for name, (h, before) in self._saved.items():
            p = self.params[name]
            p.mul_(h).sub_(before, alpha=h - 1)  # before + h * (p - before)
            self.applied += 1
        self._saved = {}
