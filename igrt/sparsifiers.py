"""Sparsifiers: which entries of a (residual-corrected) gradient go on the wire.

Every sparsifier answers one question, ``select(x, k, step=, key=)``: the int64 indices into
``x.flatten()`` to send, sorted ascending. The recorder, the synchronizer and the DDP hook all call
the same objects, so a trace and a training run select the same entries.

Rules shared by every magnitude-based sparsifier (``topk``, ``adtopk``, ``threshold``):

- Entries are ranked by ``|x|``, never by a signed value or a row sum: ``[1.0, -1.0]`` carries
  gradient in both entries and both can be selected.
- An exact zero is never selected: it carries no gradient. So at most ``min(k, nnz(x))`` indices
  come back. This is the *row-sparse rule*: an embedding gradient whose batch touched a few hundred
  of 30,522 rows spends its whole budget on its non-zero rows (and ADTopk spreads its per-row share
  over the non-zero rows only), instead of sending zeros.

``randomk`` draws uniformly from all entries (zeros included; with ``shared_indices`` the draw must
not depend on the local values, or ranks would disagree). ``none`` returns every index.

k comes from :func:`igpolicy.decide.nominal_k` (``ceil(density · numel)``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = [
    "SPARSIFIER_NAMES",
    "ADTopK",
    "NoSparsifier",
    "RandomK",
    "Sparsifier",
    "Threshold",
    "TopK",
    "make_sparsifier",
    "sparsifier_state",
]

SPARSIFIER_NAMES = ("topk", "adtopk", "threshold", "randomk", "none")


@runtime_checkable
class Sparsifier(Protocol):
    """Selects the entries of a tensor to send.

    ``select`` returns int64 indices into ``x.flatten()``, sorted ascending and unique, on
    ``x.device``. ``step`` and ``key`` (a parameter's fully qualified name) matter only to seeded
    sparsifiers; ``k`` is the budget (ignored by ``threshold`` and ``none``).
    """

    name: str

    def select(self, x: torch.Tensor, k: int, *, step: int = 0, key: str = "") -> torch.Tensor: ...


def _empty(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64, device=x.device)


def _topk_nonzero(mag: torch.Tensor, k: int) -> torch.Tensor:
    """Flat indices of the k largest entries of the 1-D magnitude vector ``mag``, zeros excluded."""
    nnz = int(torch.count_nonzero(mag))
    k = min(int(k), nnz)
    if k <= 0:
        return _empty(mag)
    if k == mag.numel():
        return torch.arange(k, device=mag.device, dtype=torch.int64)
    if k == nnz:  # every non-zero goes: no ranking needed
        return torch.nonzero(mag, as_tuple=True)[0]
    if 4 * nnz < mag.numel():  # mostly zeros (row-sparse embedding grads): rank the non-zeros only
        nz = torch.nonzero(mag, as_tuple=True)[0]
        return nz[torch.topk(mag[nz], k, sorted=False).indices]
    return torch.topk(mag, k, sorted=False).indices


@dataclass(frozen=True, kw_only=True)
class TopK:
    """The k entries of largest magnitude (fewer when ``x`` has fewer non-zeros)."""

    name: str = "topk"

    def select(self, x: torch.Tensor, k: int, *, step: int = 0, key: str = "") -> torch.Tensor:
        mag = x.detach().flatten().abs()
        return torch.sort(_topk_nonzero(mag, k)).values


@dataclass(frozen=True, kw_only=True)
class ADTopK:
    """All-dimension top-k: every row and every column keeps its share of the budget.

    Plain top-k on a matrix can spend the whole budget on a few rows with large gradients and
    starve the rest for many steps. All-dimension top-k splits the budget ``k`` between the two
    dimensions of the matrix view ``(shape[0], numel // shape[0])``:

    1. half of ``k`` is shared equally by the non-zero rows: each keeps its ``floor(k/2 / R)``
       largest-magnitude entries (R = number of rows with a non-zero entry, the row-sparse rule);
    2. the other half is shared equally by the non-zero columns the same way;
    3. the union of the two selections is topped up to ``min(k, nnz)`` entries with the largest
       remaining magnitudes (the union is smaller than k where row and column picks overlap, and
       when the budget is below one entry per row or column).

    So every non-zero row holds at least ``min(floor(k/2 / R), nnz(row))`` entries and every
    non-zero column ``min(floor(k/2 / C), nnz(column))``. Magnitudes throughout, never signed
    values. Tensors with one dimension (biases, norms) have only one dimension to cover and fall
    back to plain top-k.
    """

    name: str = "adtopk"

    def select(self, x: torch.Tensor, k: int, *, step: int = 0, key: str = "") -> torch.Tensor:
        mag = x.detach().abs()
        if mag.dim() < 2 or mag.shape[0] <= 1 or mag.numel() // mag.shape[0] <= 1:
            return torch.sort(_topk_nonzero(mag.flatten(), k)).values
        mag = mag.reshape(mag.shape[0], -1)
        nonzero = mag != 0
        nnz = int(nonzero.sum())
        k = min(int(k), nnz)
        if k <= 0:
            return _empty(x)
        if k == nnz:
            return torch.nonzero(nonzero.flatten()).flatten()
        chosen = torch.zeros_like(nonzero)
        half = k // 2
        for dim, budget in ((1, half), (0, k - half)):
            live = nonzero.any(dim=dim)  # rows (dim=1) or columns (dim=0) with a non-zero
            num_live = int(live.sum())
            share = budget // num_live if num_live else 0
            share = min(share, mag.shape[dim])
            if share == 0:
                continue
            idx = torch.topk(mag, share, dim=dim, sorted=False).indices
            chosen.scatter_(dim, idx, True)
        chosen &= nonzero
        flat_chosen = chosen.flatten()
        missing = k - int(flat_chosen.sum())
        if missing > 0:
            rest = mag.flatten().masked_fill(flat_chosen, 0)
            flat_chosen[_topk_nonzero(rest, missing)] = True
        elif missing < 0:  # shares rounded so the union can't exceed k; guard the invariant anyway
            raise AssertionError(f"adtopk selected {k - missing} entries for a budget of {k}")
        return torch.nonzero(flat_chosen).flatten()


@dataclass(frozen=True, kw_only=True)
class Threshold:
    """Every entry with ``|x| >= threshold`` (``threshold > 0``); ``k`` is ignored."""

    threshold: float
    name: str = "threshold"

    def __post_init__(self) -> None:
        if not (float(self.threshold) > 0.0):
            raise ValueError(f"sparsifier 'threshold': threshold must be > 0, got {self.threshold!r}")

    def select(self, x: torch.Tensor, k: int, *, step: int = 0, key: str = "") -> torch.Tensor:
        return torch.nonzero(x.detach().flatten().abs() >= self.threshold).flatten()


def _seed_for(*parts: object) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@dataclass(frozen=True, kw_only=True)
class RandomK:
    """k entries drawn uniformly without replacement, seeded by ``(seed, step, key)``.

    With ``shared_indices`` every rank draws the same indices for the same (step, key), so values
    can be summed position by position (an all-reduce of k values would do). Otherwise the rank
    joins the seed: ``rank`` when given, else the torch.distributed rank (0 without a group).
    The draw is a pure function of its seed, so there is no RNG state to checkpoint beyond these
    fields. Draws on CUDA and on the CPU differ; all ranks must use the same device type.
    """

    seed: int = 0
    shared_indices: bool = False
    rank: int | None = None
    name: str = "randomk"

    def _rank(self) -> int:
        if self.rank is not None:
            return int(self.rank)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank()
        return 0

    def select(self, x: torch.Tensor, k: int, *, step: int = 0, key: str = "") -> torch.Tensor:
        n = x.numel()
        k = min(int(k), n)
        if k <= 0:
            return _empty(x)
        parts: tuple[object, ...] = (self.seed, int(step), key)
        if not self.shared_indices:
            parts = (*parts, self._rank())
        gen = torch.Generator(device=x.device)
        gen.manual_seed(_seed_for(*parts))
        if k == n:
            return torch.arange(n, device=x.device, dtype=torch.int64)
        idx = torch.randperm(n, generator=gen, device=x.device)[:k]
        return torch.sort(idx).values


@dataclass(frozen=True, kw_only=True)
class NoSparsifier:
    """Every entry (dense); ``k`` is ignored."""

    name: str = "none"

    def select(self, x: torch.Tensor, k: int, *, step: int = 0, key: str = "") -> torch.Tensor:
        return torch.arange(x.numel(), device=x.device, dtype=torch.int64)


def make_sparsifier(
    name: str,
    *,
    seed: int = 0,
    shared_indices: bool = False,
    threshold: float | None = None,
    rank: int | None = None,
) -> Sparsifier:
    """Build a sparsifier by name: ``topk``, ``adtopk``, ``threshold``, ``randomk`` or ``none``.

    ``threshold`` is required for (and only used by) ``threshold``; ``seed``, ``shared_indices`` and
    ``rank`` by ``randomk``. Raises ValueError for an unknown name or a missing threshold.

    >>> make_sparsifier("topk").select(torch.tensor([1.0, -3.0, 0.5, 2.0]), 2).tolist()
    [1, 3]
    """
    if name == "topk":
        return TopK()
    if name == "adtopk":
        return ADTopK()
    if name == "threshold":
        if threshold is None:
            raise ValueError("sparsifier 'threshold' needs threshold=<float > 0>")
        return Threshold(threshold=float(threshold))
    if name == "randomk":
        return RandomK(seed=int(seed), shared_indices=bool(shared_indices), rank=rank)
    if name == "none":
        return NoSparsifier()
    raise ValueError(f"unknown sparsifier {name!r} (known: {', '.join(SPARSIFIER_NAMES)})")


def sparsifier_state(sparsifier: Sparsifier) -> dict[str, Any]:
    """The fields that fully determine a sparsifier's choices (for checkpoints and fingerprints)."""
    fields = getattr(sparsifier, "__dataclass_fields__", None)
    if fields is None:
        return {"name": sparsifier.name}
    return {f: getattr(sparsifier, f) for f in fields}
