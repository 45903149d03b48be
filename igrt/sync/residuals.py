"""Per-rank residuals (error feedback), keyed by parameter name, always fp32.

Per parameter ``p`` at each optimizer step (the semantics of ARCHITECTURE.md):

1. ``u = g + e``: :meth:`ResidualState.accumulate` adds the new local gradient (any float dtype)
   to the fp32 residual and returns ``u`` (fp32, the residual buffer itself, updated in place);
2. :meth:`after_send` records what went on the wire and leaves ``e = u`` with the sent entries
   zeroed (or holding the wire's rounding error when values travel in bf16/fp16, or as int8 with a
   payload scale: :func:`select_param` selects first, the caller quantizes the whole payload,
   then hands the values as they travel to :meth:`after_send`);
   :meth:`hold` leaves ``e = u`` when nothing is sent.

Keys are fully qualified parameter names, never bucket indices: DDP rebuilds its buckets after the
first iteration and a bucket-keyed state then feeds one parameter's residual into another.

With ``track_sums=True`` the state also keeps fp64 running sums Σg and Σsent per parameter, so the
invariant ``Σg == Σsent + e`` can be checked on every step (:meth:`conservation_gap`). The sums cost
two fp64 copies of every parameter: use them in tests and audits, not in production runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from igrt.sync.sparsifiers import Sparsifier

__all__ = ["ResidualState", "select_param", "send_param"]


class ResidualState:
    """fp32 residuals of one rank, keyed by parameter name; created lazily on first use."""

    def __init__(self, *, track_sums: bool = False) -> None:
        self.track_sums = bool(track_sums)
        self._e: dict[str, torch.Tensor] = {}
        self._sum_grad: dict[str, torch.Tensor] = {}
        self._sum_sent: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ the update
    def _buffer(self, name: str, like: torch.Tensor) -> torch.Tensor:
        e = self._e.get(name)
        if e is None:
            e = torch.zeros(like.shape, dtype=torch.float32, device=like.device)
            self._e[name] = e
        elif e.shape != like.shape:
            raise ValueError(
                f"residual {name!r}: shape {tuple(e.shape)} does not match gradient {tuple(like.shape)}"
            )
        elif e.device != like.device:
            e = e.to(like.device)
            self._e[name] = e
        if self.track_sums and name not in self._sum_grad:
            self._sum_grad[name] = torch.zeros(like.shape, dtype=torch.float64, device=like.device)
            self._sum_sent[name] = torch.zeros(like.shape, dtype=torch.float64, device=like.device)
        return e

    def accumulate(
        self, name: str, grad: torch.Tensor | None, *, like: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``u = grad + e`` in fp32; returns ``u`` (the residual buffer, updated in place).

        ``grad=None`` (a parameter without a gradient on this rank) counts as zeros; ``like`` then
        gives the shape and device of a residual not seen before.
        """
        ref = grad if grad is not None else (like if like is not None else self._e.get(name))
        if ref is None:
            raise ValueError(f"residual {name!r}: no gradient and no shape to build a residual from")
        e = self._buffer(name, ref)
        if grad is not None:
            g = grad.detach()
            e.add_(g)  # promotes bf16/fp16 to the fp32 buffer
            if self.track_sums:
                self._sum_grad[name].add_(g.to(torch.float64))
        return e

    def after_send(
        self,
        name: str,
        u: torch.Tensor,
        indices: torch.Tensor | None,
        *,
        sent_values: torch.Tensor | None = None,
    ) -> None:
        """Record that ``u.flatten()[indices]`` went on the wire; ``e = u`` with those entries zeroed.

        ``indices=None`` means every entry (a dense send). ``sent_values`` are the values as they
        travelled (e.g. rounded to bf16); the rounding error ``u[S] - sent`` then stays in the
        residual, so no gradient mass is lost. Call it after the values were copied for the wire:
        ``u`` is the residual and changes in place.
        """
        e = self._buffer(name, u)
        if u is not e:
            e.copy_(u)
        flat = e.view(-1)
        if indices is None:
            wire = None if sent_values is None else sent_values.reshape(-1).to(torch.float32)
            if self.track_sums:
                self._sum_sent[name].view(-1).add_((flat if wire is None else wire).to(torch.float64))
            if wire is None:
                flat.zero_()
            else:
                flat.sub_(wire)
            return
        idx = indices.to(device=flat.device, dtype=torch.int64)
        if sent_values is None:
            sent = flat[idx].clone()
        else:
            sent = sent_values.to(device=flat.device, dtype=torch.float32)
            if sent.numel() != idx.numel():
                raise ValueError(f"residual {name!r}: {idx.numel()} indices but {sent.numel()} sent values")
        if self.track_sums:
            self._sum_sent[name].view(-1).index_add_(0, idx, sent.to(torch.float64))
        if sent_values is None:
            flat[idx] = 0.0
        else:
            flat[idx] -= sent

    def unsend(self, name: str, indices: torch.Tensor | None, values: torch.Tensor) -> None:
        """Undo :meth:`after_send` for a step that was skipped: the sent ``values`` (as they
        travelled) go back into the residual, so the step's gradient is held instead of sent."""
        flat = self._e[name].view(-1)
        vals = values.reshape(-1).to(device=flat.device, dtype=torch.float32)
        if indices is None:
            flat.add_(vals)
        else:
            flat.index_add_(0, indices.to(device=flat.device, dtype=torch.int64), vals)
        if self.track_sums:
            s = self._sum_sent[name].view(-1)
            if indices is None:
                s.sub_(vals.to(torch.float64))
            else:
                s.index_add_(0, indices.to(device=s.device, dtype=torch.int64), vals.to(torch.float64).neg())

    def hold(self, name: str, u: torch.Tensor) -> None:
        """Nothing was sent: ``e = u``."""
        e = self._buffer(name, u)
        if u is not e:
            e.copy_(u)

    # ------------------------------------------------------------------ views
    def names(self) -> list[str]:
        return sorted(self._e)

    def get(self, name: str) -> torch.Tensor | None:
        """The residual of ``name`` (fp32, live), or None if it was never touched."""
        return self._e.get(name)

    def norms(self) -> dict[str, float]:
        """{name: L2 norm of the residual} (one device sync for all of them)."""
        names = self.names()
        if not names:
            return {}
        values = torch.stack([self._e[n].norm().to("cpu", torch.float64) for n in names]).tolist()
        return dict(zip(names, values))

    def total_norm(self) -> float:
        """L2 norm of all residuals together."""
        return math.sqrt(sum(v * v for v in self.norms().values()))

    def is_zero(self) -> bool:
        """True when every residual is exactly zero (after a flush)."""
        return all(not bool(torch.any(e != 0)) for e in self._e.values())

    def conservation_gap(self, names: Iterable[str] | None = None) -> dict[str, float]:
        """{name: max |Σg − Σsent − e|} in fp64; needs ``track_sums=True``.

        The gap is not exactly 0: ``u = g + e`` is rounded to fp32 each step. It stays within a few
        fp32 ulps of the largest |u| seen, and grows only linearly with the number of steps.
        """
        if not self.track_sums:
            raise ValueError("conservation_gap needs ResidualState(track_sums=True)")
        out = {}
        for n in sorted(names) if names is not None else self.names():
            gap = self._sum_grad[n] - self._sum_sent[n] - self._e[n].to(torch.float64)
            out[n] = float(gap.abs().max()) if gap.numel() else 0.0
        return out

    def sums(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(Σg, Σsent) of ``name`` in fp64 (needs ``track_sums=True``)."""
        if not self.track_sums:
            raise ValueError("sums need ResidualState(track_sums=True)")
        return self._sum_grad[name], self._sum_sent[name]

    # ------------------------------------------------------------------ checkpoints
    def zero_(self) -> None:
        """Forget every residual (used only after a flush made them zero or on a deliberate reset)."""
        for e in self._e.values():
            e.zero_()

    def state_dict(self) -> dict[str, Any]:
        """CPU copies of the residuals (and running sums when tracked)."""
        sd: dict[str, Any] = {
            "residuals": {n: e.detach().to("cpu").clone() for n, e in sorted(self._e.items())},
            "track_sums": self.track_sums,
        }
        if self.track_sums:
            sd["sum_grad"] = {n: t.to("cpu").clone() for n, t in sorted(self._sum_grad.items())}
            sd["sum_sent"] = {n: t.to("cpu").clone() for n, t in sorted(self._sum_sent.items())}
        return sd

    def load_state_dict(self, sd: dict[str, Any], *, device: torch.device | str | None = None) -> None:
        """Replace the state; tensors move to ``device`` (else stay on the CPU until first use)."""
        if "residuals" not in sd:
            raise ValueError("residual state: missing key 'residuals'")
        self._e = {}
        for n, e in sd["residuals"].items():
            if e.dtype != torch.float32:
                raise ValueError(f"residual state: {n!r} has dtype {e.dtype}, expected torch.float32")
            self._e[n] = e.detach().to(device or e.device, copy=True)
        self._sum_grad, self._sum_sent = {}, {}
        if self.track_sums:
            if "sum_grad" in sd and "sum_sent" in sd:
                self._sum_grad = {n: t.to(device or t.device, copy=True) for n, t in sd["sum_grad"].items()}
                self._sum_sent = {n: t.to(device or t.device, copy=True) for n, t in sd["sum_sent"].items()}
            else:  # restart the audit from here: Σg := e, Σsent := 0
                for n, e in self._e.items():
                    self._sum_grad[n] = e.to(torch.float64)
                    self._sum_sent[n] = torch.zeros_like(e, dtype=torch.float64)


def select_param(
    residuals: ResidualState,
    sparsifier: Sparsifier | None,
    *,
    name: str,
    grad: torch.Tensor | None,
    like: torch.Tensor,
    k: int | None,
    step: int,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``u = g + e`` and the selection S, the residual not yet updated: (u, int64 indices or None
    for every entry, fp32 ``u[S]``). Finish with :meth:`ResidualState.after_send` (``u``, the
    indices and the values as they travel) before ``u`` changes."""
    u = residuals.accumulate(name, grad, like=like)
    if k is None or sparsifier is None:
        return u, None, u.view(-1).clone()
    idx = sparsifier.select(u, k, step=step, key=name)
    return u, idx, u.view(-1)[idx]


def send_param(
    residuals: ResidualState,
    sparsifier: Sparsifier | None,
    *,
    name: str,
    grad: torch.Tensor | None,
    like: torch.Tensor,
    k: int | None,
    step: int,
    value_dtype: torch.dtype,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``u = g + e``; select S (``k=None`` or no sparsifier: every entry); ``e = u`` with S sent.

    Returns (int64 indices into the flat parameter or None for all, values in ``value_dtype``);
    a float ``value_dtype`` (8-bit values are quantized per payload: :func:`select_param`).
    """
    u, idx, exact = select_param(residuals, sparsifier, name=name, grad=grad, like=like, k=k, step=step)
    values = exact if value_dtype == torch.float32 else exact.to(value_dtype)
    residuals.after_send(name, u, idx, sent_values=None if value_dtype == torch.float32 else values)
    return idx, values
