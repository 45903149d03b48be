"""The sparse-vs-dense choice for one bucket: index+value all-gather or dense ring all-reduce.

Costs are in bytes each rank receives (the bandwidth term of the α-β model; both collectives send
about what they receive). With p ranks, n dense elements of ``value_bytes`` and rank j sending k_j
pairs of ``index_bytes + value_bytes``:

- sparse all-gatherv: Σ_{j≠i} k_j · (index_bytes + value_bytes)   (padded: (p-1) · k_max · s)
- dense ring all-reduce: 2 (p-1)/p · n · dense_value_bytes (``igpolicy.wire.dense_value_bytes``:
  ``value_bytes``, except that 8-bit configurations all-reduce in bf16)

So with equal k the sparse path wins while density <= 2·dense_value_bytes / (p·(index_bytes+value_bytes)):
1/p with int32 indices and fp32 values. :func:`crossover_density` gives that density from the same
two cost functions :func:`choose_collective` compares, so a table that explains the choice quotes
the rule that made it.
"""

from __future__ import annotations

from collections.abc import Sequence

from igpolicy.vocab import CollectiveKind
from igpolicy.wire import dense_value_bytes

__all__ = ["choose_collective", "crossover_density", "dense_allreduce_bytes", "sparse_gather_bytes"]


def sparse_gather_bytes(
    nnz_per_rank: Sequence[int], *, index_bytes: int = 4, value_bytes: int = 4, padded: bool = False
) -> int:
    """Bytes the busiest rank receives in a sparse all-gather(v) of (index, value) pairs."""
    ks = [int(k) for k in nnz_per_rank]
    if not ks:
        return 0
    if any(k < 0 for k in ks):
        raise ValueError(f"nnz_per_rank must be >= 0, got {ks}")
    pair = index_bytes + value_bytes
    p = len(ks)
    if padded:
        return (p - 1) * max(ks) * pair
    total = sum(ks)
    return max(total - k for k in ks) * pair


def dense_allreduce_bytes(numel: int, *, world_size: int, value_bytes: int = 4) -> int:
    """Bytes each rank receives in a ring all-reduce of ``numel`` elements (2(p-1)/p · n · s)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if world_size == 1:
        return 0
    return round(2 * (world_size - 1) / world_size * numel * dense_value_bytes(value_bytes))


def choose_collective(
    *,
    numel: int,
    nnz_per_rank: Sequence[int],
    index_bytes: int = 4,
    value_bytes: int = 4,
    padded: bool = False,
    mode: str = "auto",
) -> CollectiveKind:
    """Pick the cheaper way to aggregate one bucket; ties go to the sparse gather.

    ``mode`` forces a choice (``sparse`` / ``dense``) or compares costs (``auto``). Pure: every rank
    given the same nominal sizes picks the same collective.

    >>> choose_collective(numel=1000, nnz_per_rank=[10, 10, 10, 10]).value
    'sparse_gather'
    >>> choose_collective(numel=1000, nnz_per_rank=[400] * 4).value
    'dense_allreduce'
    """
    if mode == "sparse":
        return CollectiveKind.SPARSE_GATHER
    if mode == "dense":
        return CollectiveKind.DENSE_ALLREDUCE
    if mode != "auto":
        raise ValueError(f"collective mode {mode!r} is not one of auto, sparse, dense")
    p = len(nnz_per_rank)
    sparse = sparse_gather_bytes(nnz_per_rank, index_bytes=index_bytes, value_bytes=value_bytes, padded=padded)
    dense = dense_allreduce_bytes(numel, world_size=max(p, 1), value_bytes=value_bytes)
    return CollectiveKind.SPARSE_GATHER if sparse <= dense else CollectiveKind.DENSE_ALLREDUCE


def crossover_density(*, world_size: int, index_bytes: int = 4, value_bytes: int = 4) -> float:
    """The bucket density (pairs per dense element, equal on every rank) up to which
    :func:`choose_collective` in ``auto`` mode picks the sparse gather; above it, the dense all-reduce.

    It is the ratio of the two costs the choice compares, on a bucket of ``world_size`` elements
    with every element sent (both costs are exact integers there): 2·dense_value_bytes /
    (p·(index_bytes + value_bytes)). With one rank nothing travels and the sparse path always
    "wins" (infinity).

    >>> crossover_density(world_size=256)
    0.00390625
    >>> crossover_density(world_size=2, value_bytes=2)
    0.3333333333333333
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if world_size == 1:
        return float("inf")
    n = world_size  # dense bytes 2(p-1)·value_bytes, sparse bytes (p-1)·p·(index+value): no rounding
    dense = dense_allreduce_bytes(n, world_size=world_size, value_bytes=value_bytes)
    sparse = sparse_gather_bytes([n] * world_size, index_bytes=index_bytes, value_bytes=value_bytes)
    return dense / sparse
