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

``topk`` and ``adtopk`` are exact and break ties one documented way, the *tie rule*: among entries of
equal magnitude at a cut, the lowest flat index wins (ADTopk: the lowest column within a row, the
lowest row within a column, the lowest flat index in its top-up). So the indices are a function of
the values alone, whatever the path, size or device, and a tensor whose magnitudes are distinct
gets exactly torch.topk's set. NaN ranks above +inf; +0 and -0 are zeros.

Speed. Selection runs on integer *magnitude keys* (the float's bits with the sign cleared, which
order like ``|x|``). Tensors of at least 2^18 entries (2^20 for ADTopk) take a sampled path: a
fixed-seed sample of the keys (never the global RNG) gives a cut that leaves, by a safety margin,
somewhat more than k candidates; one pass, on the CPU in cache-sized blocks, collects them; the
exact rule then runs on the candidates only. A sample that missed (fewer than k candidates) costs
an exact fallback, never a different answer. On 50 M fp32 entries at density 0.01 (one CPU thread)
``topk`` measured 20x faster than ``torch.topk`` and ``adtopk`` 8x faster than before
(``benchmarks/selection_bench.py``, ``docs/benchmarks.md``).

``randomk`` draws uniformly from all entries (zeros included; with ``shared_indices`` the draw must
not depend on the local values, or ranks would disagree). ``none`` returns every index.

k comes from :func:`igpolicy.decide.nominal_k` (``ceil(density · numel)``).
"""

from __future__ import annotations

import hashlib
import math
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


# --- magnitude keys ---------------------------------------------------------------------------------
# An IEEE float with its sign bit cleared, read as an integer, orders exactly like |x| (+0 and -0 are
# key 0, NaN ranks above +inf). Selection runs on these integer keys: exact, the same code for every
# float dtype, and "non-zero" is simply key >= 1.

_KEY_TYPES = {
    torch.float64: (torch.int64, 0x7FFF_FFFF_FFFF_FFFF),
    torch.float32: (torch.int32, 0x7FFF_FFFF),
    torch.bfloat16: (torch.int16, 0x7FFF),
    torch.float16: (torch.int16, 0x7FFF),
}
_CPU_BLOCK = 1 << 20  # CPU passes work on blocks of this many entries (a cache-sized, reused buffer)


def _keyable(x: torch.Tensor) -> torch.Tensor:
    """``x`` detached, in a dtype with magnitude keys (other floats, e.g. fp8, widen exactly to fp32)."""
    x = x.detach()
    if x.dtype in _KEY_TYPES:
        return x
    if x.is_floating_point():
        return x.float()
    raise ValueError(f"magnitude selection needs a floating-point tensor, got {x.dtype}")


def _keys(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    key_dtype, key_max = _KEY_TYPES[x.dtype]
    return torch.bitwise_and(x.view(key_dtype), key_max, out=out)


def _key_blocks(src: torch.Tensor):
    """Yield ``(first, keys of src[first:first + step])`` over dim 0 of a contiguous ``src``.

    On the CPU a block holds about ``_CPU_BLOCK`` entries and reuses one buffer, so a pass over a
    large tensor reads it once and allocates nothing of its size; on CUDA there is one block."""
    num = src.shape[0]
    step = num if src.device.type != "cpu" else max(1, min(num, _CPU_BLOCK // max(1, src[0].numel())))
    buf = torch.empty((step, *src.shape[1:]), dtype=_KEY_TYPES[src.dtype][0], device=src.device)
    for first in range(0, num, step):
        part = src[first : first + step]
        yield first, _keys(part, out=buf[: part.shape[0]])


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Ascending positions of the true entries of a fresh 1-D ``mask``.

    On the CPU a sparse mask is scanned 8 entries at a time (as int64 words) and only the words with
    a hit are expanded: about 1.4x faster than ``torch.nonzero`` at a few percent density."""
    if mask.device.type != "cpu" or mask.numel() % 8 or mask.storage_offset() % 8:
        return torch.nonzero(mask).flatten()
    words = torch.nonzero(mask.view(torch.int64)).flatten()
    if 4 * words.numel() > mask.numel() // 8:  # dense: expanding the words would cost more
        return torch.nonzero(mask).flatten()
    word, bit = torch.nonzero(mask.view(-1, 8).index_select(0, words), as_tuple=True)
    return words.index_select(0, word).mul_(8).add_(bit)


# --- exact selection on keys (the rule; the direct path) ------------------------------------------


def _kth_largest(keys: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th largest of the 1-D ``keys`` (1 <= k <= numel), as a 0-d tensor."""
    if keys.device.type == "cpu" and 3 * k > keys.numel():  # quickselect wins for large k
        return torch.kthvalue(keys, keys.numel() - k + 1).values
    return torch.topk(keys, k, sorted=False).values.min()  # a heap on the CPU, radix select on CUDA


def _top_mask(keys: torch.Tensor, k: int) -> torch.Tensor:
    """Mask of the ``min(k, nnz)`` largest non-zero 1-D ``keys``; at the cut, lower positions win."""
    if k >= keys.numel():
        return keys > 0
    cut = _kth_largest(keys, k).clamp_min(1)
    above = keys > cut
    tied = keys == cut
    need = k - int(above.sum())
    if int(tied.sum()) > need:
        tied &= torch.cumsum(tied, 0) <= need
    return above | tied


def _segment_top_mask(keys: torch.Tensor, share: int, dim: int) -> torch.Tensor:
    """Mask of every row's (``dim=1``) or column's (``dim=0``) ``share`` largest non-zero keys of the
    matrix ``keys`` (all its non-zeros when it has fewer); at the cut, the lower index wins."""
    length = keys.shape[dim]
    if share >= length:
        return keys > 0
    values, picked = torch.topk(keys, share + 1, dim=dim)  # sorted, one past the cut
    cut, after = values.narrow(dim, share - 1, 1), values.narrow(dim, share, 1)
    if bool(((after == cut) & (cut > 0)).any()):  # a tie crosses some cut: apply the rule
        cut = cut.clamp_min(1)  # (a cut of 0: that segment has fewer than share non-zeros)
        above = keys > cut
        tied = keys == cut
        need = share - above.sum(dim, keepdim=True)
        return above | (tied & (torch.cumsum(tied, dim) <= need))
    mask = torch.zeros(keys.shape, dtype=torch.bool, device=keys.device)
    mask.scatter_(dim, picked.narrow(dim, 0, share), True)
    if bool((cut == 0).any()):  # a segment with fewer than share non-zeros: topk padded it with zeros
        mask &= keys > 0
    return mask


def _shares(k: int, live_rows: int, live_cols: int, rows: int, cols: int) -> tuple[int, int]:
    """ADTopk's budgets: half of k shared by the non-zero rows, the rest by the non-zero columns."""
    half = k // 2
    share_row = min(half // live_rows, cols) if live_rows else 0
    share_col = min((k - half) // live_cols, rows) if live_cols else 0
    return share_row, share_col


def _direct_topk(keys: torch.Tensor, k: int) -> torch.Tensor:
    """Ascending positions of the ``min(k, nnz)`` largest non-zero 1-D ``keys`` (the rule)."""
    if 0 < 16 * k <= keys.numel():  # small k: a sorted top-(k+1) shows whether a tie crosses the cut
        values, picked = torch.topk(keys, k + 1)
        kth, after = values[k - 1 : k + 1].tolist()
        if after < kth:  # no tie across the cut, and (kth >= 1) k non-zeros: topk's pick is the rule's
            return torch.sort(picked[:k]).values
    return torch.nonzero(_top_mask(keys, k)).flatten()


def _direct_adtopk(keys: torch.Tensor, k: int) -> torch.Tensor:
    """ADTopk on the key matrix, one full-size pass per step (the reference the fast path matches)."""
    nonzero = keys > 0
    nnz = int(nonzero.sum())
    k = min(k, nnz)
    if k <= 0:
        return _empty(keys)
    if k == nnz:
        return torch.nonzero(nonzero.flatten()).flatten()
    shares = _shares(k, int(nonzero.any(1).sum()), int(nonzero.any(0).sum()), *keys.shape)
    chosen = torch.zeros_like(nonzero)
    for dim, share in zip((1, 0), shares):
        if share:
            chosen |= _segment_top_mask(keys, share, dim)
    flat = chosen.view(-1)
    missing = k - int(flat.sum())
    if missing < 0:  # shares are rounded down, so the union can't exceed k; guard the invariant
        raise AssertionError(f"adtopk selected {k - missing} entries for a budget of {k}")
    if missing:
        flat.index_fill_(0, _direct_topk(keys.flatten().masked_fill(flat, 0), missing), True)
    return torch.nonzero(flat).flatten()


# --- the sampled fast path ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Sampling:
    """Knobs of the sampled fast path. They change speed only: every setting selects the same indices."""

    min_numel: int = 1 << 18  # smaller tensors take the direct path (TopK)
    adtopk_min_numel: int = 1 << 20  # ... and for ADTopk, whose sampled path has more fixed costs
    sample_size: int = 1 << 16  # keys drawn for a whole-tensor threshold
    sigmas: float = 5.0  # its safety margin in binomial standard deviations (a miss costs a full pass)
    slack: int = 8  # ... plus this many sample ranks
    segment_sample: int = 768  # keys drawn per row (column) for ADTopk's per-row (per-column) cuts
    segment_sample_frac: float = 0.125  # ... but at most this share of a row's (column's) entries
    segment_sigmas: float = 2.5  # smaller: a row whose cut misses is repaired alone, cheaply
    segment_slack: int = 2
    max_candidate_frac: float = 0.125  # sampling can't pay when more would be candidates: direct path
    seed: int = 0x5EED


_SAMPLING = _Sampling()


def _sample_rank(num_sample: int, frac: float, sigmas: float, slack: int, max_frac: float) -> int | None:
    """Rank (1 = largest) of the sampled key to use as a cut that keeps more than ``frac`` of the
    entries with high probability; None when that cut would keep more than ``max_frac`` of them."""
    mu = num_sample * frac
    rank = max(1, math.ceil(mu + sigmas * math.sqrt(mu) + slack))
    return rank if rank <= max_frac * num_sample else None


def _sample_size(numel: int, sampling: _Sampling) -> int:
    return min(sampling.sample_size, max(numel // 16, 1))  # at most 1/16 of the tensor


def _draw(high: int, num: int, device: torch.device, seed: int) -> torch.Tensor:
    """``num`` positions in ``[0, high)`` with replacement, sorted, from a fixed-seed generator."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return torch.sort(torch.randint(high, (num,), generator=gen, device=device)).values


def _sample_cut(flat: torch.Tensor, rank: int, sampling: _Sampling) -> int:
    """The key of ``rank`` in a sample of :func:`_sample_size` keys of ``flat``, at least 1."""
    num = _sample_size(flat.numel(), sampling)
    sample = _keys(flat.index_select(0, _draw(flat.numel(), num, flat.device, sampling.seed)))
    return max(int(torch.topk(sample, rank).values[-1]), 1)


def _candidates(flat: torch.Tensor, cut: int) -> torch.Tensor:
    """Ascending positions in ``flat`` whose key is >= ``cut`` (>= 1), in one pass."""
    found = [_positions(keys >= cut).add_(first) for first, keys in _key_blocks(flat)]
    return torch.cat(found) if len(found) > 1 else found[0]


def _topk(x: torch.Tensor, k: int, sampling: _Sampling = _SAMPLING) -> tuple[torch.Tensor, str]:
    """Top-k positions of ``x.flatten()`` (ascending) and the path taken: direct, sampled or fallback.

    Sampled: the cut is the sampled key of rank :func:`_sample_rank`; one pass keeps the positions at
    or above it, and the exact rule runs on those candidates only. A sample that over-estimated the
    cut (fewer than k candidates) falls back to the direct path."""
    flat = _keyable(x).reshape(-1)
    n, k = flat.numel(), int(k)
    if k <= 0 or n == 0:
        return _empty(x), "direct"
    rank = None
    if n >= sampling.min_numel:
        s = sampling
        rank = _sample_rank(_sample_size(n, s), k / n, s.sigmas, s.slack, s.max_candidate_frac)
    if rank is None:
        return _direct_topk(_keys(flat), k), "direct"
    cut = _sample_cut(flat, rank, sampling)
    cand = _candidates(flat, cut)
    if cand.numel() < k and cut > 1:
        return _direct_topk(_keys(flat), k), "fallback"
    return cand.masked_select(_top_mask(_keys(flat.index_select(0, cand)), k)), "sampled"


def _nonzero_stats(src: torch.Tensor) -> tuple[int, int, int]:
    """``(nnz, rows with a non-zero, columns with a non-zero)`` of a matrix, in one pass."""
    nnz = torch.zeros((), dtype=torch.int64, device=src.device)
    row_max = torch.empty(src.shape[0], dtype=_KEY_TYPES[src.dtype][0], device=src.device)
    col_max = torch.zeros(src.shape[1], dtype=row_max.dtype, device=src.device)
    for first, keys in _key_blocks(src):
        nnz += torch.count_nonzero(keys)
        row_max[first : first + keys.shape[0]] = keys.amax(1)
        torch.maximum(col_max, keys.amax(0), out=col_max)
    return int(nnz), int((row_max > 0).sum()), int((col_max > 0).sum())


def _segment_pick(
    src: torch.Tensor, cand: torch.Tensor, share: int, cut: torch.Tensor, dim: int
) -> tuple[torch.Tensor, int]:
    """Exact per-row (``dim=1``) or per-column (``dim=0``) top-``share`` of ``src`` from candidates.

    ``cand``: ascending flat positions whose key reaches their segment's ``cut``. A segment with fewer
    than ``share`` candidates although its cut is above 1 was over-estimated by its sample; its
    candidates are replaced by all its non-zeros (a repair). Returns the picks (unsorted) and the
    number of repaired segments. One stable sort by (segment, key descending) ranks every segment at
    once; stability keeps ascending positions among equal keys, which is the tie rule."""
    cols = src.shape[1]
    seg = cand // cols if dim == 1 else cand % cols
    keys = _keys(src.view(-1).index_select(0, cand))
    num_seg = src.shape[0] if dim == 1 else cols
    counts = torch.bincount(seg, minlength=num_seg)
    failed = (counts < share) & (cut > 1)
    repaired = int(failed.sum())
    if repaired:
        redo = torch.nonzero(failed).flatten()
        block = _keys(src.index_select(1 - dim, redo))
        i, j = torch.nonzero(block, as_tuple=True)
        redo_seg = redo[i] if dim == 1 else redo[j]
        redo_pos = redo_seg * cols + j if dim == 1 else i * cols + redo_seg
        keep = ~failed.index_select(0, seg)
        cand = torch.cat([cand.masked_select(keep), redo_pos])
        seg = torch.cat([seg.masked_select(keep), redo_seg])
        keys = torch.cat([keys.masked_select(keep), block[i, j]])
        counts = torch.bincount(seg, minlength=num_seg)
    key_bits = 8 * keys.element_size() - 1
    order = torch.sort((seg << key_bits) | ((1 << key_bits) - 1 - keys.long()), stable=True).indices
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(order.numel(), device=order.device) - first.index_select(
        0, seg.index_select(0, order)
    )
    return cand.index_select(0, order.masked_select(rank < share)), repaired


def _top_up(
    flat: torch.Tensor, chosen: torch.Tensor, cand: torch.Tensor, missing: int
) -> tuple[torch.Tensor, bool]:
    """The ``missing`` largest non-zeros outside the sorted ``chosen``: from the candidates (all keys
    at or above a cut) when enough of them lie outside ``chosen``, else exactly from all of ``flat``.
    Returns them and whether the exact fallback ran."""
    if chosen.numel():
        at = torch.searchsorted(chosen, cand).clamp_max_(chosen.numel() - 1)
        cand = cand.masked_select(chosen.index_select(0, at) != cand)
    if cand.numel() >= missing:
        return cand.masked_select(_top_mask(_keys(flat.index_select(0, cand)), missing)), False
    return _direct_topk(_keys(flat).index_fill_(0, chosen, 0), missing), True


def _adtopk_candidates(
    src: torch.Tensor, row_cut: torch.Tensor | None, col_cut: torch.Tensor | None, global_cut: int
) -> list[torch.Tensor | None]:
    """Ascending flat positions reaching their row's cut, their column's cut and the global cut,
    collected in one pass (None for an absent cut)."""
    found: list[list[torch.Tensor]] = [[], [], []]
    for first, keys in _key_blocks(src):
        block_row_cut = None if row_cut is None else row_cut[first : first + keys.shape[0]]
        for hits, cut in zip(found, (block_row_cut, col_cut, global_cut)):
            if cut is not None:
                hits.append(_positions((keys >= cut).view(-1)).add_(first * src.shape[1]))
    return [torch.cat(hits) if hits else None for hits in found]


def _adtopk(x: torch.Tensor, k: int, sampling: _Sampling = _SAMPLING) -> tuple[torch.Tensor, str]:
    """ADTopk positions (ascending) and the path taken: ``direct``, or ``sampled`` with
    ``+rows_repaired`` / ``+columns_repaired`` / ``+topup_fallback`` when a sample missed.

    Sampled: a sample of every row (column) gives that row's (column's) cut; one pass collects the
    candidates of the row pass, the column pass and the top-up at once; exact selection runs on
    candidates only (:func:`_segment_pick`, :func:`_top_up`)."""
    if x.dim() < 2 or x.shape[0] <= 1 or x.numel() // x.shape[0] <= 1:
        return _topk(x, k, sampling)
    src = _keyable(x).reshape(x.shape[0], -1).contiguous()
    rows, cols = src.shape
    if src.numel() < sampling.adtopk_min_numel or src.dtype == torch.float64:
        return _direct_adtopk(_keys(src), int(k)), "direct"
    nnz, live_rows, live_cols = _nonzero_stats(src)
    k = min(int(k), nnz)
    flat = src.view(-1)
    if k <= 0:
        return _empty(x), "sampled"
    if k == nnz:
        return _candidates(flat, 1), "sampled"
    shares = _shares(k, live_rows, live_cols, rows, cols)
    s = sampling
    lengths = (cols, rows)  # a row has cols entries, a column rows
    sizes = [min(s.segment_sample, int(n * s.segment_sample_frac)) for n in lengths]
    ranks = [
        _sample_rank(m, share / n, s.segment_sigmas, s.segment_slack, s.max_candidate_frac) if share else 0
        for m, share, n in zip(sizes, shares, lengths)
    ]
    global_rank = _sample_rank(
        _sample_size(flat.numel(), s), k / flat.numel(), s.sigmas, s.slack, s.max_candidate_frac
    )
    if None in ranks or global_rank is None:
        return _direct_adtopk(_keys(src), k), "direct"
    row_cut = col_cut = None
    if shares[0]:  # (rows, 1): each row's cut
        sample = _keys(src.index_select(1, _draw(cols, sizes[0], src.device, s.seed)))
        row_cut = torch.topk(sample, ranks[0], dim=1).values[:, -1:].clamp_min(1)
    if shares[1]:  # (cols,): each column's cut
        sample = _keys(src.index_select(0, _draw(rows, sizes[1], src.device, s.seed + 1)))
        col_cut = torch.topk(sample, ranks[1], dim=0).values[-1].clamp_min(1)
    found = _adtopk_candidates(src, row_cut, col_cut, _sample_cut(flat, global_rank, s))
    events, picks = ["sampled"], []
    for dim, name, share, cut, hits in zip((1, 0), ("rows", "columns"), shares, (row_cut, col_cut), found):
        if share:
            pick, repaired = _segment_pick(src, hits, share, cut.view(-1), dim)
            picks.append(pick)
            if repaired:
                events.append(f"{name}_repaired")
    chosen = torch.unique(torch.cat(picks)) if picks else _empty(x)
    missing = k - chosen.numel()
    if missing < 0:  # shares are rounded down, so the union can't exceed k; guard the invariant
        raise AssertionError(f"adtopk selected {chosen.numel()} entries for a budget of {k}")
    if missing:
        extra, fell_back = _top_up(flat, chosen, found[2], missing)
        chosen = torch.sort(torch.cat([chosen, extra])).values
        if fell_back:
            events.append("topup_fallback")
    return chosen, "+".join(events)


# --- the sparsifiers ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TopK:
    """The k entries of largest magnitude (fewer when ``x`` has fewer non-zeros); ties at the k-th
    magnitude go to the lowest flat index. Exact on every path (see the module docstring)."""

    name: str = "topk"

    def select(self, x: torch.Tensor, k: int, *, step: int = 0, key: str = "") -> torch.Tensor:
        return _topk(x, k)[0]


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
    values. Ties at a cut go to the lower index: the lower column within a row, the lower row
    within a column, the lower flat index in the top-up. Tensors with one dimension (biases, norms)
    have only one dimension to cover and fall back to plain top-k.
    """

    name: str = "adtopk"

    def select(self, x: torch.Tensor, k: int, *, step: int = 0, key: str = "") -> torch.Tensor:
        return _adtopk(x, k)[0]


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
