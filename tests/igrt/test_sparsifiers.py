"""Sparsifier properties: magnitude selection, budgets, ADTopk's per-dimension shares, seeding."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from igpolicy.decide import nominal_k
from igrt.sparsifiers import SPARSIFIER_NAMES, ADTopK, Sparsifier, make_sparsifier

torch.set_num_threads(1)


def _tensor(
    seed: int, shape: tuple[int, ...], *, zero_rows: float = 0.0, zero_frac: float = 0.0
) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(2 * torch.randn(shape, generator=g))
    if zero_frac:
        x[torch.rand(shape, generator=g) < zero_frac] = 0.0
    if zero_rows and len(shape) >= 2:
        x[torch.rand(shape[0], generator=g) < zero_rows] = 0.0
    return x


def _mask(idx: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    m = torch.zeros(x.numel(), dtype=torch.bool)
    m[idx] = True
    return m.view(x.shape)


shapes = st.one_of(
    st.tuples(st.integers(1, 200)),
    st.tuples(st.integers(1, 40), st.integers(1, 40)),
    st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 6)),
)


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["topk", "adtopk", "randomk"]),
    shape=shapes,
    density=st.floats(0.001, 1.0),
    seed=st.integers(0, 10_000),
    zero_rows=st.sampled_from([0.0, 0.5, 0.95]),
)
def test_budget_sorted_unique_int64(name, shape, density, seed, zero_rows):
    x = _tensor(seed, shape, zero_rows=zero_rows)
    k = nominal_k(x.numel(), density)
    idx = make_sparsifier(name, seed=3).select(x, k, step=seed, key="w")
    assert idx.dtype == torch.int64
    assert bool((idx[1:] > idx[:-1]).all()), "indices must be strictly ascending"
    assert idx.numel() == 0 or (int(idx.min()) >= 0 and int(idx.max()) < x.numel())
    nnz = int(torch.count_nonzero(x))
    if name == "randomk":
        assert idx.numel() == k
    else:  # magnitude sparsifiers never pick an exact zero, and fill their budget otherwise
        assert idx.numel() == min(k, nnz)
        assert bool((x.flatten()[idx] != 0).all())


@settings(max_examples=60, deadline=None)
@given(shape=shapes, density=st.floats(0.001, 1.0), seed=st.integers(0, 10_000))
def test_topk_is_the_magnitude_oracle(shape, density, seed):
    x = _tensor(seed, shape, zero_frac=0.3)
    k = nominal_k(x.numel(), density)
    idx = make_sparsifier("topk").select(x, k)
    mag = x.flatten().abs()
    chosen = torch.zeros(x.numel(), dtype=torch.bool)
    chosen[idx] = True
    if idx.numel() and (~chosen).any():
        # every kept magnitude is >= every dropped one (ties may go either way)
        assert float(mag[chosen].min()) >= float(mag[~chosen].max())


def test_large_negatives_are_kept():
    """[1.0, -1.0]-style rows carry gradient: selection is by |x|, never by a signed value or a row sum."""
    x = torch.tensor([[1.0, -1.0], [0.01, 0.02], [-5.0, 0.0], [0.03, -0.04]])
    for name in ("topk", "adtopk"):
        idx = make_sparsifier(name).select(x, 3)
        assert set(idx.tolist()) == {0, 1, 4}, name
    thr = make_sparsifier("threshold", threshold=0.5).select(x, 1)
    assert thr.tolist() == [0, 1, 4]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(2, 40),
    cols=st.integers(2, 40),
    density=st.floats(0.01, 0.9),
    seed=st.integers(0, 10_000),
    zero_rows=st.sampled_from([0.0, 0.3, 0.9]),
)
def test_adtopk_every_dimension_keeps_its_share(rows, cols, density, seed, zero_rows):
    x = _tensor(seed, (rows, cols), zero_rows=zero_rows)
    k = nominal_k(x.numel(), density)
    idx = ADTopK().select(x, k)
    nz = x != 0
    nnz = int(nz.sum())
    assert idx.numel() == min(k, nnz)
    m = _mask(idx, x)
    live_rows = nz.any(1)
    live_cols = nz.any(0)
    kk = min(k, nnz)
    row_share = (kk // 2) // max(int(live_rows.sum()), 1)
    col_share = (kk - kk // 2) // max(int(live_cols.sum()), 1)
    per_row, nnz_row = m.sum(1), nz.sum(1)
    per_col, nnz_col = m.sum(0), nz.sum(0)
    assert bool((per_row[live_rows] >= torch.clamp(nnz_row[live_rows], max=row_share)).all())
    assert bool((per_col[live_cols] >= torch.clamp(nnz_col[live_cols], max=col_share)).all())
    assert int(per_row[~live_rows].sum()) == 0, "row-sparse rule: zero rows get nothing"


def test_adtopk_does_not_starve_rows_that_topk_starves():
    x = torch.full((8, 16), 0.01)
    x[0] = 100.0  # one row dominates: plain top-k spends its whole budget there
    k = 16
    top = _mask(make_sparsifier("topk").select(x, k), x)
    ad = _mask(make_sparsifier("adtopk").select(x, k), x)
    assert int(top[1:].sum()) == 0
    assert bool((ad.sum(1) >= 1).all()), "every row keeps at least one entry"
    assert int(ad.sum()) == k


def test_embedding_row_sparse_rule():
    emb = torch.zeros(1000, 8)
    touched = torch.tensor([3, 77, 500, 999])
    emb[touched] = torch.randn(4, 8)
    k = nominal_k(emb.numel(), 0.01)  # 80 entries for 32 non-zero ones
    for name in ("topk", "adtopk"):
        idx = make_sparsifier(name).select(emb, k)
        assert idx.numel() == 32
        assert set((idx // 8).tolist()) == set(touched.tolist())


def test_randomk_seeding_and_sharing():
    x = torch.randn(50, 20)
    shared = [make_sparsifier("randomk", seed=5, shared_indices=True, rank=r) for r in range(3)]
    picks = [s.select(x * (r + 1), 40, step=7, key="layer.w") for r, s in enumerate(shared)]
    assert all(torch.equal(picks[0], p) for p in picks), "shared indices must not depend on rank or values"
    private = [make_sparsifier("randomk", seed=5, rank=r) for r in range(2)]
    a, b = (s.select(x, 40, step=7, key="layer.w") for s in private)
    assert not torch.equal(a, b)
    s = shared[0]
    assert torch.equal(s.select(x, 40, step=7, key="layer.w"), picks[0]), (
        "same (seed, step, key) -> same draw"
    )
    assert not torch.equal(s.select(x, 40, step=8, key="layer.w"), picks[0])
    assert not torch.equal(s.select(x, 40, step=7, key="other.w"), picks[0])
    # uniform: over many steps every entry is drawn about k/n of the time
    counts = torch.zeros(x.numel())
    for t in range(200):
        counts[s.select(x, 100, step=t, key="u")] += 1
    assert abs(float(counts.mean()) - 200 * 100 / 1000) < 1e-9
    assert float(counts.std()) < 3 * math.sqrt(200 * 0.1 * 0.9)


def test_threshold_and_none():
    x = torch.tensor([0.0, 0.2, -0.7, 0.5, -0.5])
    assert make_sparsifier("threshold", threshold=0.5).select(x, 1).tolist() == [2, 3, 4]
    assert make_sparsifier("none").select(x, 1).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="threshold"):
        make_sparsifier("threshold")
    with pytest.raises(ValueError, match="threshold must be > 0"):
        make_sparsifier("threshold", threshold=0.0)
    with pytest.raises(ValueError, match="unknown sparsifier 'top_k'"):
        make_sparsifier("top_k")


@pytest.mark.parametrize("name", SPARSIFIER_NAMES)
def test_protocol_dtypes_and_empty(name):
    s = make_sparsifier(name, threshold=0.1)
    assert isinstance(s, Sparsifier) and s.name == name
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(7, 5).to(dtype)
        idx = s.select(x, 4, step=1, key="p")
        assert idx.dtype == torch.int64
    assert s.select(torch.zeros(0), 0).numel() == 0
    if name != "none" and name != "randomk":
        assert s.select(torch.zeros(4, 4), 3).numel() == 0, "nothing to send in an all-zero tensor"
