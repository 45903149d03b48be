"""Sparsifier properties: magnitude selection, budgets, ADTopk's per-dimension shares, seeding."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.selection_bench import old_adtopk, old_topk
from igpolicy.decide import nominal_k
from igrt.sync.sparsifiers import (
    _SAMPLING,
    SPARSIFIER_NAMES,
    ADTopK,
    Sparsifier,
    TopK,
    _adtopk,
    _direct_adtopk,
    _direct_topk,
    _draw,
    _keys,
    _positions,
    _sample_rank,
    _Sampling,
    _topk,
    make_sparsifier,
)

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


# --- exact, fast selection: the tie rule, the sampled path, its fallbacks -----------------------------
#
# The rule: the min(k, nnz) entries of largest |x|; at the k-th magnitude the lowest flat index wins
# (ADTopk: the lowest column within a row, the lowest row within a column, the lowest flat index in the
# top-up). The oracles below implement it in numpy, independently of igrt; torch.topk and the old
# implementations (benchmarks/selection_bench.py) are oracles where magnitudes are distinct.

# the sampled path on small tensors and at any density (pointless for speed, but it must stay exact)
FORCED = _Sampling(
    min_numel=0,
    adtopk_min_numel=0,
    sample_size=256,
    segment_sample=64,
    segment_sample_frac=1.0,
    max_candidate_frac=1.0,
)
UNLUCKY = _Sampling(  # cuts from the top of the sample: too high, so every miss path runs
    min_numel=0,
    adtopk_min_numel=0,
    sample_size=256,
    segment_sample=64,
    segment_sample_frac=1.0,
    max_candidate_frac=1.0,
    sigmas=-4.0,
    slack=0,
    segment_sigmas=-4.0,
    segment_slack=0,
)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _mag(x: torch.Tensor) -> np.ndarray:
    return x.detach().abs().double().cpu().numpy().reshape(-1)  # exact for every float dtype here


def _first_nonzero(mag: np.ndarray, order: np.ndarray, count: int) -> np.ndarray:
    order = order[mag[order] != 0]
    return order[:count]


def _rule_topk(x: torch.Tensor, k: int) -> list[int]:
    mag = _mag(x)
    order = np.lexsort((np.arange(mag.size), -mag))  # by |x| descending, then index ascending
    return sorted(_first_nonzero(mag, order, max(k, 0)).tolist())


def _rule_adtopk(x: torch.Tensor, k: int) -> list[int]:
    if x.dim() < 2 or x.shape[0] <= 1 or x.numel() // x.shape[0] <= 1:
        return _rule_topk(x, k)
    mag = _mag(x).reshape(x.shape[0], -1)
    rows, cols = mag.shape
    nz = mag != 0
    k = min(k, int(nz.sum()))
    if k <= 0:
        return []
    if k == int(nz.sum()):
        return np.flatnonzero(nz).tolist()
    half = k // 2
    live_rows, live_cols = int(nz.any(1).sum()), int(nz.any(0).sum())
    share_row = min(half // live_rows, cols) if live_rows else 0
    share_col = min((k - half) // live_cols, rows) if live_cols else 0
    chosen = np.zeros(rows * cols, dtype=bool)
    for r in range(rows):
        pick = _first_nonzero(mag[r], np.lexsort((np.arange(cols), -mag[r])), share_row)
        chosen[r * cols + pick] = True
    for c in range(cols):
        pick = _first_nonzero(mag[:, c], np.lexsort((np.arange(rows), -mag[:, c])), share_col)
        chosen[pick * cols + c] = True
    rest = np.where(chosen, 0.0, mag.reshape(-1))
    chosen[_first_nonzero(rest, np.lexsort((np.arange(rest.size), -rest)), k - int(chosen.sum()))] = True
    return np.flatnonzero(chosen).tolist()


def _distinct(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random signs and pairwise-distinct magnitudes (so every tie rule agrees), no zeros."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    if dtype == torch.float32:  # magnitudes 1..n, exact below 2**24
        mag = (torch.randperm(n, generator=g) + 1).to(torch.float32)
    else:  # n distinct finite positive bit patterns
        top = 0x7BFF if dtype == torch.float16 else 0x7F7F
        mag = (torch.randperm(top, generator=g)[:n] + 1).to(torch.int16).view(dtype)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(dtype)
    return (mag * sign).reshape(shape)


def _tie_heavy(shape: tuple[int, ...], dtype: torch.dtype, seed: int, *, levels: int = 4) -> torch.Tensor:
    """Few distinct magnitudes (every cut falls in a large tie), signs mixed, about 1/(2 levels) zeros."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-levels, levels + 1, shape, generator=g).to(dtype) * 0.25


def _torch_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    return torch.sort(torch.topk(x.abs().flatten().float(), k).indices).values


def _check(idx: torch.Tensor, x: torch.Tensor) -> None:
    assert idx.dtype == torch.int64 and idx.device == x.device
    assert bool((idx[1:] > idx[:-1]).all()), "indices must be strictly ascending"


BIG = [(1_048_583,), (1024, 1031), (4099, 257)]  # ~1M entries, odd sizes, sampled by default


@pytest.mark.parametrize("shape", [(1,), (7,), (1000,), (333, 77), *BIG])
@pytest.mark.parametrize("density", [1e-4, 1e-3, 0.01, 0.1, 0.5])
def test_topk_equals_torch_topk_on_distinct_magnitudes(shape, density):
    x = _distinct(shape, torch.float32, seed=len(shape) + int(density * 1e4))
    k = nominal_k(x.numel(), density)
    ref = _torch_topk(x, k)
    for sampling in (_SAMPLING, FORCED, UNLUCKY):
        idx, path = _topk(x, k, sampling)
        _check(idx, x)
        assert torch.equal(idx, ref), (shape, density, path)
    assert torch.equal(make_sparsifier("topk").select(x, k), ref)
    assert torch.equal(old_topk(x, k), ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5,), (100,), (37, 53), (64, 300)])
@pytest.mark.parametrize("density", [1e-4, 0.01, 0.2, 0.5])
def test_topk_and_adtopk_rule_small_all_dtypes(dtype, shape, density):
    paths: dict[bool, set[str]] = {True: set(), False: set()}
    sparse = _tie_heavy(shape, dtype, 4)  # dead rows, and rows with fewer non-zeros than a share
    sparse[: shape[0] // 2] = 0
    if len(shape) == 2:
        sparse[:, ::3] = 0
        sparse[-1, 1:] = 0
    for x in (
        _distinct(shape, dtype, 1),
        _tie_heavy(shape, dtype, 2),
        sparse,
        _tensor(3, shape, zero_frac=0.4).to(dtype),
    ):
        k = nominal_k(x.numel(), density)
        want_top, want_ad = _rule_topk(x, k), _rule_adtopk(x, k)
        for sampling in (_SAMPLING, FORCED, UNLUCKY):
            top, top_path = _topk(x, k, sampling)
            ad, ad_path = _adtopk(x, k, sampling)
            _check(top, x)
            _check(ad, x)
            paths[sampling is _SAMPLING].update({top_path, ad_path})
            assert top.tolist() == want_top, (dtype, shape, density, sampling)
            assert ad.tolist() == want_ad, (dtype, shape, density, sampling)
    assert paths[True] == {"direct"}, "small tensors take the direct path by default"
    assert paths[False] - {"direct"}, "FORCED and UNLUCKY exercise the sampled path"


def test_adtopk_ties_next_to_a_row_with_fewer_non_zeros_than_its_share():
    x = torch.zeros(3, 16)
    x[0] = 1.0  # 16 tied entries: the row's cut falls inside the tie
    x[1, 0] = 2.0  # one non-zero for a share of 3: its zeros must not be picked
    x[2, :3] = 0.5
    for k in (17, 18, 19):
        want = _rule_adtopk(x, k)
        assert len(want) == k and 16 in want and not set(want) & set(range(17, 32)), want
        for sampling in (_SAMPLING, FORCED, UNLUCKY):
            assert _adtopk(x, k, sampling)[0].tolist() == want, (k, sampling)


@settings(max_examples=60, deadline=None)
@given(
    shape=st.one_of(st.tuples(st.integers(1, 3000)), st.tuples(st.integers(2, 60), st.integers(2, 60))),
    density=st.floats(1e-4, 0.5),
    seed=st.integers(0, 10_000),
    levels=st.sampled_from([1, 3, 50, 0]),  # 0: continuous values
    zero_rows=st.sampled_from([0.0, 0.5, 0.95]),
    dtype=st.sampled_from(DTYPES),
    sampling=st.sampled_from([_SAMPLING, FORCED, UNLUCKY]),  # small: _SAMPLING is the direct path
)
def test_sampled_path_follows_the_rule(shape, density, seed, levels, zero_rows, dtype, sampling):
    if levels:
        x = _tie_heavy(shape, dtype, seed, levels=levels)
    else:
        x = _tensor(seed, shape).to(dtype)
    if zero_rows and len(shape) == 2:
        x[torch.rand(shape[0], generator=torch.Generator().manual_seed(seed)) < zero_rows] = 0
    k = nominal_k(x.numel(), density)
    assert _topk(x, k, sampling)[0].tolist() == _rule_topk(x, k)
    assert _adtopk(x, k, sampling)[0].tolist() == _rule_adtopk(x, k)


@pytest.mark.parametrize("shape", BIG[1:])
@pytest.mark.parametrize("density", [1e-4, 1e-3, 0.01, 0.1])
def test_adtopk_equals_the_old_implementation_at_1m(shape, density):
    x = _distinct(shape, torch.float32, seed=int(density * 1e4))
    k = nominal_k(x.numel(), density)
    idx, path = _adtopk(x, k)
    _check(idx, x)
    assert path.startswith("sampled") or density > 0.01, path  # 257-wide rows at 10 %: too dense to sample
    assert torch.equal(idx, old_adtopk(x, k))
    assert torch.equal(idx, _direct_adtopk(_keys(x), k))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("density", [1e-3, 0.01, 0.3])
def test_tie_heavy_1m_matches_the_direct_path(dtype, density):
    """~1M entries with a few magnitudes: every cut lands in a tie of ~100k entries."""
    x = _tie_heavy((1024, 1031), dtype, seed=7, levels=5)
    k = nominal_k(x.numel(), density)
    flat = x.flatten()
    top, path = _topk(x, k)
    assert torch.equal(top, _direct_topk(_keys(flat), k)), path
    assert top.numel() == k and bool((flat[top] != 0).all())
    want = _rule_topk(x, k)  # numpy oracle, ~1M: one lexsort
    assert top.tolist() == want
    ad, path = _adtopk(x, k)
    assert torch.equal(ad, _direct_adtopk(_keys(x), k)), path


@pytest.mark.parametrize("density", [1e-4, 1e-3, 0.01, 0.05])
def test_row_sparse_embedding_gradient(density):
    """An embedding gradient: 2 % of 8,000 rows touched, the rest exactly zero (k may exceed nnz)."""
    g = torch.Generator().manual_seed(11)
    emb = torch.zeros(8000, 128)
    touched = torch.randperm(8000, generator=g)[:160]
    emb[touched] = _distinct((160, 128), torch.float32, seed=12)
    k = nominal_k(emb.numel(), density)
    top, _ = _topk(emb, k)
    assert torch.equal(top, old_topk(emb, k))
    assert top.numel() == min(k, 160 * 128)
    ad, path = _adtopk(emb, k)
    assert torch.equal(ad, old_adtopk(emb, k)), path
    assert torch.equal(ad, _direct_adtopk(_keys(emb), k))
    assert set((ad // 128).unique().tolist()) <= set(touched.tolist())


def test_unlucky_sample_falls_back_to_the_exact_path():
    """Large values placed exactly where the fixed-seed sample looks: the sampled cut is far too high,
    fewer than k entries reach it, and the exact fallback runs (default knobs)."""
    n = _SAMPLING.min_numel
    k = nominal_k(n, 0.01)
    x = torch.randn(n, generator=torch.Generator().manual_seed(5)) * 1e-3
    drawn = _draw(n, _SAMPLING.sample_size, x.device, _SAMPLING.seed).unique()
    rank = _sample_rank(_SAMPLING.sample_size, k / n, _SAMPLING.sigmas, _SAMPLING.slack, 1.0)
    assert rank < k
    x[drawn[:rank]] = 100.0 + torch.arange(rank, dtype=torch.float32)
    idx, path = _topk(x, k)
    assert path == "fallback"
    assert idx.tolist() == _rule_topk(x, k)
    assert torch.equal(idx, _torch_topk(x, k))  # the large values are distinct, the rest continuous


def test_every_miss_path_runs_and_stays_exact():
    events = set()
    for seed in range(12):
        for shape in ((48, 40), (40, 48), (3000,)):
            x = _tensor(seed, shape, zero_frac=0.2)
            k = nominal_k(x.numel(), 0.2)
            top, path = _topk(x, k, UNLUCKY)
            events.add(path)
            assert top.tolist() == _rule_topk(x, k)
            ad, path = _adtopk(x, k, UNLUCKY)
            events.update(path.split("+"))
            assert ad.tolist() == _rule_adtopk(x, k)
    assert {"fallback", "rows_repaired", "columns_repaired", "topup_fallback"} <= events, events


def test_selection_is_deterministic_and_leaves_the_global_rng_alone():
    x = _tensor(0, (1024, 1031))
    k = nominal_k(x.numel(), 0.01)
    state = torch.random.get_rng_state()
    a, b = TopK().select(x, k), TopK().select(x.clone(), k)
    c, d = ADTopK().select(x, k), ADTopK().select(x.clone(), k)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(a, b) and torch.equal(c, d)


def test_nan_ranks_above_inf_and_non_contiguous_input():
    x = torch.tensor([1.0, float("nan"), -float("inf"), 3.0, 0.0, -2.0])
    assert TopK().select(x, 1).tolist() == [1]
    assert TopK().select(x, 3).tolist() == [1, 2, 3]
    y = _tensor(4, (700, 900)).t()  # not contiguous
    k = nominal_k(y.numel(), 0.01)
    assert torch.equal(TopK().select(y, k), TopK().select(y.contiguous(), k))
    assert torch.equal(ADTopK().select(y, k), ADTopK().select(y.contiguous(), k))
    with pytest.raises(ValueError, match="floating-point"):
        TopK().select(torch.arange(5), 2)


@pytest.mark.parametrize("n", [0, 5, 8, 64, 1000, 4096, 100_003])
@pytest.mark.parametrize("density", [0.0, 0.01, 0.3, 1.0])
def test_positions_equals_nonzero(n, density):
    mask = torch.rand(n, generator=torch.Generator().manual_seed(n)) < density
    assert torch.equal(_positions(mask), torch.nonzero(mask).flatten())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_selects_what_the_cpu_selects(dtype):
    cases = [
        _tensor(1, (1024, 1031)).to(dtype),
        _tie_heavy((1024, 1031), dtype, 2),
        _tie_heavy((3000,), dtype, 3),
    ]
    for x in cases:
        for density in (1e-3, 0.01, 0.2):
            k = nominal_k(x.numel(), density)
            for sampling in (_SAMPLING, FORCED, UNLUCKY):
                for fn in (_topk, _adtopk):
                    want, _ = fn(x, k, sampling)
                    got, path = fn(x.cuda(), k, sampling)
                    assert got.device.type == "cuda"
                    assert torch.equal(got.cpu(), want), (fn.__name__, dtype, density, path)
