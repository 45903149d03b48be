"""The sparse-vs-dense choice: cost formulas against hand-computed values, and the crossover density."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import igpolicy.choice as choice
from igpolicy.choice import choose_collective, dense_allreduce_bytes, sparse_gather_bytes
from igpolicy.vocab import CollectiveKind

SPARSE, DENSE = CollectiveKind.SPARSE_GATHER, CollectiveKind.DENSE_ALLREDUCE


def test_sparse_gather_bytes_hand_computed():
    # ranks send 3, 5, 2 pairs of 8 bytes; the busiest receiver is the rank that sent 2: (3 + 5) * 8
    assert sparse_gather_bytes([3, 5, 2]) == 64
    assert sparse_gather_bytes([3, 5, 2], padded=True) == 2 * 5 * 8  # (p-1) * k_max * pair
    assert sparse_gather_bytes([3, 5, 2], index_bytes=8, value_bytes=2) == 80
    assert sparse_gather_bytes([7]) == 0  # one rank receives nothing
    assert sparse_gather_bytes([]) == 0
    with pytest.raises(ValueError, match="nnz_per_rank"):
        sparse_gather_bytes([1, -1])


def test_dense_allreduce_bytes_hand_computed():
    assert dense_allreduce_bytes(1000, world_size=4) == 6000  # 2 * 3/4 * 1000 * 4
    assert dense_allreduce_bytes(1000, world_size=2, value_bytes=2) == 2000  # 2 * 1/2 * 1000 * 2
    assert dense_allreduce_bytes(10, world_size=3, value_bytes=2) == 27  # 26.67 rounded
    assert dense_allreduce_bytes(10**6, world_size=1) == 0
    with pytest.raises(ValueError, match="world_size"):
        dense_allreduce_bytes(10, world_size=0)


def test_choose_collective_ties_go_to_sparse_and_modes_force():
    # p = 4, n = 1000: dense 6000 bytes; sparse (1000 - 250) * 8 = 6000: a tie
    assert choose_collective(numel=1000, nnz_per_rank=[250] * 4) == SPARSE
    assert choose_collective(numel=1000, nnz_per_rank=[251] * 4) == DENSE
    assert choose_collective(numel=1000, nnz_per_rank=[1000] * 4, mode="sparse") == SPARSE
    assert choose_collective(numel=1000, nnz_per_rank=[0] * 4, mode="dense") == DENSE
    assert choose_collective(numel=1000, nnz_per_rank=[1000]) == SPARSE  # one rank: both free
    with pytest.raises(ValueError, match="'fast'"):
        choose_collective(numel=1, nnz_per_rank=[1], mode="fast")


@settings(max_examples=200, deadline=None)
@given(
    ks=st.lists(st.integers(0, 10**6), min_size=1, max_size=64),
    pair=st.sampled_from([(4, 4), (4, 2), (8, 4)]),
)
def test_sparse_bytes_are_what_the_busiest_rank_receives(ks, pair):
    ib, vb = pair
    received = [sum(k for j, k in enumerate(ks) if j != i) * (ib + vb) for i in range(len(ks))]
    assert sparse_gather_bytes(ks, index_bytes=ib, value_bytes=vb) == max(received)
    padded = sparse_gather_bytes(ks, index_bytes=ib, value_bytes=vb, padded=True)
    assert padded == (len(ks) - 1) * max(ks) * (ib + vb) >= max(received)


@settings(max_examples=500, deadline=None)
@given(
    p=st.integers(2, 4096),
    n=st.integers(1, 10**9),
    delta=st.integers(-2, 2),
    widths=st.sampled_from([(4, 4), (4, 2), (8, 4), (8, 2)]),
)
def test_crossover_density(p, n, delta, widths):
    """Equal k on every rank: sparse wins iff k·p·(ib+vb) <= 2·vb·n, i.e. iff density <= 1/p for
    int32 indices and fp32 values (the equality is a tie, which goes to sparse)."""
    ib, vb = widths
    k = min(max(0, (2 * vb * n) // (p * (ib + vb)) + delta), n)  # near the crossover
    got = choose_collective(numel=n, nnz_per_rank=[k] * p, index_bytes=ib, value_bytes=vb)
    assert got == (SPARSE if k * p * (ib + vb) <= 2 * vb * n else DENSE)
    if (ib, vb) == (4, 4):
        density = k / n
        if density < 1 / p:
            assert got == SPARSE
        if density > 1 / p:
            assert got == DENSE


@settings(max_examples=200, deadline=None)
@given(p=st.integers(2, 512), n=st.integers(1, 10**7), data=st.data())
def test_auto_picks_the_cheaper(p, n, data):
    ks = data.draw(st.lists(st.integers(0, n), min_size=p, max_size=p))
    for padded in (False, True):
        got = choose_collective(numel=n, nnz_per_rank=ks, padded=padded)
        sparse = sparse_gather_bytes(ks, padded=padded)
        dense = dense_allreduce_bytes(n, world_size=p)
        assert got == (SPARSE if sparse <= dense else DENSE)


def test_docstring_examples():
    assert doctest.testmod(choice).failed == 0
