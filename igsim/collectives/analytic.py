"""Closed-form collective costs: the contention-free fast path of the simulator.

Notation: ``p`` ranks, ``n = size_bytes`` (each rank's full buffer), ``alpha_s`` per message
(path latency + calibrated overhead), ``bandwidth_bytes_per_s`` B, ``gamma_s_per_byte`` the
reduction cost. Every function returns seconds. On a uniform star (and, for the hierarchical
all-reduce, a uniform two-level cluster) the flow-level simulation of the schedules in
:mod:`igsim.collectives.predict` reproduces these numbers exactly; the tests check it to 1e-9.

The exceptions are labelled: :func:`double_binary_tree_all_reduce_s` ignores the contention of its
two concurrent trees (an estimate; the flow mode is the reference) and
:func:`allgatherv_bound_s` is the textbook gatherv cost, a lower bound that a ring meets only when
every rank sends the same amount (:func:`ring_allgatherv_s` is the ring's exact cost).

>>> ring_all_reduce_s(p=4, size_bytes=1e6, alpha_s=1e-5, bandwidth_bytes_per_s=1e9)
0.00156
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "allgatherv_bound_s",
    "binomial_broadcast_s",
    "binomial_tree_all_reduce_s",
    "direct_all_gather_s",
    "direct_all_reduce_s",
    "direct_broadcast_s",
    "direct_reduce_scatter_s",
    "double_binary_tree_all_reduce_s",
    "halving_doubling_all_reduce_s",
    "heap_tree_depth_weight",
    "hierarchical_all_reduce_s",
    "log2_exact",
    "padded_sparse_all_gather_s",
    "pipelined_tree_all_reduce_s",
    "pipelined_tree_broadcast_s",
    "recursive_doubling_all_gather_s",
    "recursive_doubling_all_reduce_s",
    "recursive_halving_reduce_scatter_s",
    "ring_all_gather_s",
    "ring_all_reduce_s",
    "ring_allgatherv_s",
    "ring_broadcast_s",
    "ring_reduce_scatter_s",
]


def _check(p: int, n: float, b: float) -> None:
    if int(p) < 1:
        raise ValueError(f"p={p!r} ranks must be >= 1")
    if not (n >= 0 and math.isfinite(n)):
        raise ValueError(f"size_bytes={n!r} must be >= 0 and finite")
    if not (b > 0):
        raise ValueError(f"bandwidth_bytes_per_s={b!r} must be > 0")


def log2_exact(p: int, *, what: str) -> int:
    """log2(p) for a power of two; ValueError naming ``what`` otherwise."""
    if p < 1 or p & (p - 1):
        raise ValueError(f"{what} needs a power-of-two number of ranks, got {p}")
    return p.bit_length() - 1


def _ceil_log2(p: int) -> int:
    return (p - 1).bit_length()


# -- rings -------------------------------------------------------------------------------------


def ring_all_reduce_s(
    *, p: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float, gamma_s_per_byte: float = 0.0
) -> float:
    """2(p-1)α + 2(p-1)/p · n/B + (p-1)/p · nγ (reduce-scatter then all-gather, chunks of n/p)."""
    _check(p, size_bytes, bandwidth_bytes_per_s)
    f = (p - 1) / p
    return (
        2 * (p - 1) * alpha_s + 2 * f * size_bytes / bandwidth_bytes_per_s + f * size_bytes * gamma_s_per_byte
    )


def ring_all_gather_s(*, p: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """(p-1)α + (p-1)/p · n/B, n the gathered buffer."""
    _check(p, size_bytes, bandwidth_bytes_per_s)
    return (p - 1) * alpha_s + (p - 1) / p * size_bytes / bandwidth_bytes_per_s


def ring_reduce_scatter_s(
    *, p: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float, gamma_s_per_byte: float = 0.0
) -> float:
    """(p-1)α + (p-1)/p · n/B + (p-1)/p · nγ, n the input buffer."""
    _check(p, size_bytes, bandwidth_bytes_per_s)
    f = (p - 1) / p
    return (p - 1) * alpha_s + f * size_bytes / bandwidth_bytes_per_s + f * size_bytes * gamma_s_per_byte


def ring_broadcast_s(
    *, p: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float, num_chunks: int = 1
) -> float:
    """Pipelined chain from the root: (c + p - 2)(α + n/(cB)) with c chunks."""
    _check(p, size_bytes, bandwidth_bytes_per_s)
    if p == 1:
        return 0.0
    c = int(num_chunks)
    return (c + p - 2) * (alpha_s + size_bytes / c / bandwidth_bytes_per_s)


# -- recursive halving / doubling --------------------------------------------------------------


def halving_doubling_all_reduce_s(
    *, p: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float, gamma_s_per_byte: float = 0.0
) -> float:
    """Rabenseifner, p a power of 2: 2 log2(p) α + 2(p-1)/p · n/B + (p-1)/p · nγ."""
    _check(p, size_bytes, bandwidth_bytes_per_s)
    k = log2_exact(p, what="halving_doubling")
    f = (p - 1) / p
    return 2 * k * alpha_s + 2 * f * size_bytes / bandwidth_bytes_per_s + f * size_bytes * gamma_s_per_byte


def recursive_halving_reduce_scatter_s(
    *, p: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float, gamma_s_per_byte: float = 0.0
) -> float:
    """p a power of 2: log2(p) α + (p-1)/p · n/B + (p-1)/p · nγ."""
    _check(p, size_bytes, bandwidth_bytes_per_s)
    k = log2_exact(p, what="halving_doubling reduce_scatter")
    f = (p - 1) / p
    return k * alpha_s + f * size_bytes / bandwidth_bytes_per_s + f * size_bytes * gamma_s_per_byte


def recursive_doubling_all_gather_s(
    *, p: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float
) -> float:
    """p a power of 2: log2(p) α + (p-1)/p · n/B."""
    _check(p, size_bytes, bandwidth_bytes_per_s)
    k = log2_exact(p, what="recursive_doubling all_gather")
    return k * alpha_s + (p - 1) / p * size_bytes / bandwidth_bytes_per_s


def recursive_doubling_all_reduce_s(
    *, p: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float, gamma_s_per_byte: float = 0.0
) -> float:
    """p a power of 2: log2(p) (α + n/B + nγ) — whole buffers exchanged with partner i xor 2^k."""
    _check(p, size_bytes, bandwidth_bytes_per_s)
    k = log2_exact(p, what="recursive_doubling")
    return k * (alpha_s + size_bytes / bandwidth_bytes_per_s + size_bytes * gamma_s_per_byte)


# -- trees -------------------------------------------------------------------------------------


def binomial_tree_all_reduce_s(
    *, p: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float, gamma_s_per_byte: float = 0.0
) -> float:
    """Binomial reduce then broadcast: 2⌈log2 p⌉(α + n/B) + ⌈log2 p⌉ nγ."""
    _check(p, size_bytes, bandwidth_bytes_per_s)
    k = _ceil_log2(p)
    return 2 * k * (alpha_s + size_bytes / bandwidth_bytes_per_s) + k * size_bytes * gamma_s_per_byte


def binomial_broadcast_s(*, p: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """⌈log2 p⌉(α + n/B)."""
    _check(p, size_bytes, bandwidth_bytes_per_s)
    return _ceil_log2(p) * (alpha_s + size_bytes / bandwidth_bytes_per_s)


def heap_tree_depth_weight(p: int) -> int:
    """max over nodes of the weighted depth in the heap-ordered binary tree (children of v are
    2v+1, 2v+2), a first child's edge weighing 1 and a second child's 2: the number of message
    times after which the last node holds a chunk that left the root at time 0 (single port)."""
    depth = [0] * p
    for v in range(1, p):
        depth[v] = depth[(v - 1) // 2] + (1 if v % 2 else 2)
    return max(depth)


def pipelined_tree_broadcast_s(
    *, p: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float, num_chunks: int
) -> float:
    """Binary heap tree, c chunks, each node sending to its children one message at a time
    (first child, then second): T = α + n/(cB); p = 2: cT; p >= 3: 2(c-1)T + D·T with D from
    :func:`heap_tree_depth_weight` (a node with two children forwards one chunk per 2T)."""
    _check(p, size_bytes, bandwidth_bytes_per_s)
    if p == 1:
        return 0.0
    c = int(num_chunks)
    t = alpha_s + size_bytes / c / bandwidth_bytes_per_s
    if p == 2:
        return c * t
    return (2 * (c - 1) + heap_tree_depth_weight(p)) * t


def pipelined_tree_all_reduce_s(
    *,
    p: int,
    size_bytes: float,
    alpha_s: float,
    bandwidth_bytes_per_s: float,
    num_chunks: int,
    gamma_s_per_byte: float = 0.0,
) -> float:
    """Pipelined reduce up the heap tree (the time-reverse of the broadcast), then the broadcast:
    twice :func:`pipelined_tree_broadcast_s`. Exact for γ = 0; with γ > 0 the reductions overlap
    the pipeline in a way this form does not capture, so it raises (use the flow mode)."""
    if gamma_s_per_byte:
        raise ValueError(
            "pipelined tree all_reduce has no closed form with gamma_s_per_byte > 0; use mode='flow'"
        )
    return 2 * pipelined_tree_broadcast_s(
        p=p,
        size_bytes=size_bytes,
        alpha_s=alpha_s,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        num_chunks=num_chunks,
    )


def double_binary_tree_all_reduce_s(
    *, p: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float, num_chunks: int
) -> float:
    """Estimate: two pipelined trees of n/2 each, run side by side, contention between them
    ignored. Not exact on any topology; the flow mode shares the links properly."""
    return pipelined_tree_all_reduce_s(
        p=p,
        size_bytes=size_bytes / 2,
        alpha_s=alpha_s,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        num_chunks=num_chunks,
    )


# -- direct (all pairs at once) ----------------------------------------------------------------


def direct_reduce_scatter_s(
    *, p: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float, gamma_s_per_byte: float = 0.0
) -> float:
    """Every rank sends n/p to each other rank at once, all sharing its link: α + (p-1)/p·n/B
    + (p-1)/p·nγ."""
    _check(p, size_bytes, bandwidth_bytes_per_s)
    if p == 1:
        return 0.0
    f = (p - 1) / p
    return alpha_s + f * size_bytes / bandwidth_bytes_per_s + f * size_bytes * gamma_s_per_byte


def direct_all_gather_s(*, p: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """α + (p-1)/p · n/B."""
    return direct_reduce_scatter_s(
        p=p, size_bytes=size_bytes, alpha_s=alpha_s, bandwidth_bytes_per_s=bandwidth_bytes_per_s
    )


def direct_all_reduce_s(
    *, p: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float, gamma_s_per_byte: float = 0.0
) -> float:
    """Direct reduce-scatter then direct all-gather: 2α + 2(p-1)/p · n/B + (p-1)/p · nγ."""
    rs = direct_reduce_scatter_s(
        p=p,
        size_bytes=size_bytes,
        alpha_s=alpha_s,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        gamma_s_per_byte=gamma_s_per_byte,
    )
    return rs + direct_all_gather_s(
        p=p, size_bytes=size_bytes, alpha_s=alpha_s, bandwidth_bytes_per_s=bandwidth_bytes_per_s
    )


def direct_broadcast_s(*, p: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """The root sends n to every other rank at once over its one link: α + (p-1) n/B."""
    _check(p, size_bytes, bandwidth_bytes_per_s)
    return 0.0 if p == 1 else alpha_s + (p - 1) * size_bytes / bandwidth_bytes_per_s


# -- two-level ---------------------------------------------------------------------------------


def hierarchical_all_reduce_s(
    *,
    ranks_per_node: int,
    num_nodes: int,
    size_bytes: float,
    intra_alpha_s: float,
    intra_bandwidth_bytes_per_s: float,
    inter_alpha_s: float,
    inter_bandwidth_bytes_per_s: float,
    gamma_s_per_byte: float = 0.0,
) -> float:
    """Ring reduce-scatter inside each node (g ranks), ring all-reduce of n/g across the m nodes
    among ranks with the same local index, ring all-gather inside each node:

    2[(g-1)α_in + (g-1)/g · n/B_in] + 2(m-1)α_out + 2(m-1)/m · (n/g)/B_out
    + (g-1)/g · nγ + (m-1)/m · (n/g)γ.

    ``inter_bandwidth_bytes_per_s`` is what one of the g concurrent inter-node rings gets (with
    one NIC shared by the node, the NIC's bandwidth / g).
    """
    g, m, n = int(ranks_per_node), int(num_nodes), size_bytes
    _check(g * m, n, intra_bandwidth_bytes_per_s)
    intra_rs = ring_reduce_scatter_s(
        p=g,
        size_bytes=n,
        alpha_s=intra_alpha_s,
        bandwidth_bytes_per_s=intra_bandwidth_bytes_per_s,
        gamma_s_per_byte=gamma_s_per_byte,
    )
    inter = ring_all_reduce_s(
        p=m,
        size_bytes=n / g,
        alpha_s=inter_alpha_s,
        bandwidth_bytes_per_s=inter_bandwidth_bytes_per_s,
        gamma_s_per_byte=gamma_s_per_byte,
    )
    intra_ag = ring_all_gather_s(
        p=g, size_bytes=n, alpha_s=intra_alpha_s, bandwidth_bytes_per_s=intra_bandwidth_bytes_per_s
    )
    return intra_rs + inter + intra_ag


# -- sparse gathers ----------------------------------------------------------------------------


def _sizes(sizes_bytes: Sequence[float], b: float) -> np.ndarray:
    s = np.asarray(sizes_bytes, dtype=float)
    if s.ndim != 1 or s.size == 0:
        raise ValueError("sizes_bytes must list one payload size per rank")
    _check(s.size, float(s.max()), b)
    if (s < 0).any():
        raise ValueError(f"sizes_bytes must be >= 0, got {list(s)}")
    return s


def allgatherv_bound_s(
    *, sizes_bytes: Sequence[float], alpha_s: float, bandwidth_bytes_per_s: float
) -> float:
    """(p-1)α + max_i Σ_{j≠i} s_j / B: what the busiest receiver must take in, one message per
    peer. A lower bound for any gatherv made of p-1 sequential receives per rank; the ring meets it
    when all sizes are equal."""
    s = _sizes(sizes_bytes, bandwidth_bytes_per_s)
    return (s.size - 1) * alpha_s + float((s.sum() - s).max()) / bandwidth_bytes_per_s


def ring_allgatherv_s(*, sizes_bytes: Sequence[float], alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """Exact time of the ring all-gatherv: (p-1)(α + max_j s_j / B), the padded ring's time.

    In step t rank i forwards block (i - t) mod p to i + 1 once it has sent step t-1 and received
    block (i - t) in step t-1, so its finish time obeys

    T(i, t) = max(T(i, t-1), T(i-1, t-1)) + α + s_{(i-t) mod p} / B,  answer max_i T(i, p-2).

    Unrolled, T(i, t) is the heaviest chain of t+1 forwards ending at (i, t), each weighing
    α + s/B of the block it carries. Every chain has p-1 links at most, so no chain outweighs
    (p-1)(α + max s / B), and the largest block's own p-1 hops around the ring form such a chain.
    With unequal sizes the ring therefore takes as long as padding every payload to the largest
    (it sends fewer bytes, not less time), which exceeds :func:`allgatherv_bound_s`. O(p)."""
    s = _sizes(sizes_bytes, bandwidth_bytes_per_s)
    p = s.size
    return (p - 1) * (alpha_s + float(s.max()) / bandwidth_bytes_per_s) if p > 1 else 0.0


def padded_sparse_all_gather_s(
    *, sizes_bytes: Sequence[float], alpha_s: float, bandwidth_bytes_per_s: float
) -> float:
    """Every payload padded to the largest, then a ring all-gather: (p-1)(α + max_j s_j / B)."""
    s = _sizes(sizes_bytes, bandwidth_bytes_per_s)
    return (s.size - 1) * (alpha_s + float(s.max()) / bandwidth_bytes_per_s)


def ideal_s(
    *,
    op: str,
    p: int,
    size_bytes: float,
    alpha_s: float,
    bandwidth_bytes_per_s: float,
    sizes_bytes: Sequence[float] = (),
) -> float:
    """A bound, not an algorithm: one α plus the bandwidth lower bound of ``op`` —
    2(p-1)/p·n/B (all-reduce), (p-1)/p·n/B (all-gather, reduce-scatter), n/B (broadcast),
    max_i Σ_{j≠i} s_j/B (sparse all-gather)."""
    if op == "sparse_all_gather":
        s = _sizes(sizes_bytes, bandwidth_bytes_per_s)
        return 0.0 if s.size == 1 else alpha_s + float((s.sum() - s).max()) / bandwidth_bytes_per_s
    _check(p, size_bytes, bandwidth_bytes_per_s)
    if p == 1:
        return 0.0
    factor = {"all_reduce": 2 * (p - 1) / p, "all_gather": (p - 1) / p, "reduce_scatter": (p - 1) / p,
              "broadcast": 1.0}[op]  # fmt: skip
    return alpha_s + factor * size_bytes / bandwidth_bytes_per_s


def _binomial_children(rel: int, p: int) -> int:
    low = (rel & -rel).bit_length() - 1 if rel else (p - 1).bit_length()
    return sum(1 for k in range(low) if rel + (1 << k) < p)


def _heap_children(v: int, p: int) -> int:
    return sum(1 for c in (2 * v + 1, 2 * v + 2) if c < p)


def collective_traffic(
    *,
    op: str,
    algorithm: str,
    p: int,
    size_bytes: float,
    sizes_bytes: Sequence[float] = (),
    num_chunks: int = 1,
    root: int = 0,
    ranks_per_node: int | None = None,
) -> tuple[tuple[float, ...], int]:
    """(bytes each rank sends, number of messages) of the schedules in :mod:`igsim.collectives.predict`,
    without building them. ``ideal`` reports what the ring would send."""
    n, c = float(size_bytes), int(num_chunks)
    if p == 1:
        return (0.0,), 0
    alg = "ring" if algorithm == "ideal" else algorithm
    if op == "sparse_all_gather":
        s = [float(x) for x in sizes_bytes]
        if alg == "direct":
            return tuple((p - 1) * x for x in s), p * (p - 1)
        if alg == "padded":
            return tuple([(p - 1) * max(s)] * p), p * (p - 1)
        total = sum(s)
        return tuple(total - s[(i + 1) % p] for i in range(p)), p * (p - 1)
    if op == "broadcast":
        rel = [(i - root) % p for i in range(p)]
        if alg == "ring":
            return tuple(n if r < p - 1 else 0.0 for r in rel), (p - 1) * c
        if alg == "direct":
            return tuple((p - 1) * n if r == 0 else 0.0 for r in rel), p - 1
        if c == 1:
            return tuple(n * _binomial_children(r, p) for r in rel), p - 1
        return tuple(n * _heap_children(r, p) for r in rel), (p - 1) * c
    if alg in ("ring", "direct", "halving_doubling"):
        factor = 2 if op == "all_reduce" else 1
        k = (p - 1).bit_length()
        msgs = {"ring": p * (p - 1), "direct": p * (p - 1), "halving_doubling": p * k}[alg]
        return tuple([factor * (p - 1) / p * n] * p), factor * msgs
    if alg == "recursive_doubling":
        k = (p - 1).bit_length()
        if op == "all_reduce":
            return tuple([k * n] * p), k * p
        return tuple([(p - 1) / p * n] * p), k * p
    if alg == "hierarchical":
        g = int(ranks_per_node or p)
        m = p // g
        per = 2 * (g - 1) / g * n + 2 * (m - 1) / m * n / g
        return tuple([per] * p), 2 * m * g * (g - 1) + 2 * g * m * (m - 1)
    if alg == "tree" and c == 1:
        return tuple(n * ((i != 0) + _binomial_children(i, p)) for i in range(p)), 2 * (p - 1)
    if alg == "tree":
        return tuple(n * ((i != 0) + _heap_children(i, p)) for i in range(p)), 2 * (p - 1) * c
    if alg == "double_binary_tree":
        return (
            tuple(n / 2 * (2 + _heap_children(i, p) + _heap_children(p - 1 - i, p)) - n / 2 * (i == 0)
                  - n / 2 * (i == p - 1) for i in range(p)),
            4 * (p - 1) * c,
        )  # fmt: skip
    raise ValueError(f"no traffic formula for {op} {algorithm}")
