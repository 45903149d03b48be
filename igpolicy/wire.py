"""The wire format, defined once: what one rank puts on the wire for a sparse or dense payload.

The runtime (``igrt.sync.comm``) lays buffers out with these functions and the simulator
(``igsim.step.engine``) sizes its collectives with them, so both agree on every byte.

A sparse payload of one bucket is one rank's ``k`` (index, value) pairs, encoded as one uint8
buffer padded to a ``capacity`` that every rank knows::

    [ int64 k | capacity × index (index_bytes) | capacity × value (value_bytes) | pad to 8 ]

``capacity`` is either the bucket's *nominal* pair count (a bounded sparsifier never selects
more, so no count exchange is needed: the count travels in the header) or the largest count of
any rank, learnt from a *count exchange* (one int64 per sparse bucket per rank, all-gathered).
A dense payload is the bucket's ``numel`` values, zero-filled where nothing was selected.

Payload accounting (what :class:`igpolicy.vocab.StepMetrics` counts, per rank): ``k · value_bytes``
value bytes, ``k · index_bytes`` index bytes, ``numel · value_bytes`` dense bytes, and
``COUNT_BYTES`` metadata bytes per sparse bucket (in the count exchange, or as the header where
there is none). Padding travels but is not payload; it is reported apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from igpolicy.vocab import ComponentId, ParamInfo

__all__ = [
    "ALIGN_BYTES",
    "BOUNDED_SPARSIFIERS",
    "COUNT_BYTES",
    "HEADER_BYTES",
    "PairsLayout",
    "config_k",
    "encoded_pairs_bytes",
    "nominal_k",
    "pairs_layout",
    "pairs_of",
    "param_k",
]

HEADER_BYTES = 8  # int64 pair count at the head of every encoded sparse payload
ALIGN_BYTES = 8  # encoded payloads are padded to a multiple of this
COUNT_BYTES = 8  # one int64 pair count per sparse bucket (count exchange or header)
BOUNDED_SPARSIFIERS = ("topk", "adtopk", "randomk")  # never select more than the nominal k


def nominal_k(numel: int, density: float) -> int:
    """Entries a sparsifier keeps: ceil(density · numel), at least 1 and at most numel (0 for empty)."""
    if numel <= 0:
        return 0
    return min(numel, max(1, math.ceil(density * numel - 1e-9)))


def param_k(param: ParamInfo, *, sparse: bool, density_for, dense_small_numel: int = 0) -> int | None:
    """Nominal k of one parameter (its kind's density), or None when every entry travels.

    ``density_for`` maps a component kind ("attn_q", ...) to its density (``PolicyConfig.density_for``).
    None for a dense policy, and for a parameter of at most ``dense_small_numel`` entries
    (``PolicyConfig.dense_small_numel``: biases and norm weights send all their entries, as pairs
    inside a sparse gather or as values inside a dense all-reduce).
    """
    if not sparse or (dense_small_numel > 0 and param.numel <= dense_small_numel):
        return None
    return nominal_k(param.numel, density_for(ComponentId.from_key(param.component).kind.value))


def config_k(param: ParamInfo, config) -> int | None:
    """:func:`param_k` under a :class:`igpolicy.config.PolicyConfig` (the one call every planner makes)."""
    return param_k(
        param, sparse=config.sparse, density_for=config.density_for,
        dense_small_numel=config.dense_small_numel,
    )  # fmt: skip


def pairs_of(param: ParamInfo, config) -> int:
    """Entries ``param`` puts on the wire when it sends under a sparse ``config`` (k, or numel)."""
    k = config_k(param, config)
    return param.numel if k is None else k


@dataclass(frozen=True, kw_only=True)
class PairsLayout:
    """Byte offsets of one rank's encoded sparse payload of ``capacity`` pairs."""

    capacity: int
    index_offset: int
    value_offset: int
    size_bytes: int


def pairs_layout(capacity: int, *, index_bytes: int, value_bytes: int) -> PairsLayout:
    """Where the header, the indices and the values of an encoded payload lie (see module doc)."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    index_offset = HEADER_BYTES
    value_offset = index_offset + capacity * index_bytes
    raw = value_offset + capacity * value_bytes
    size = -(-raw // ALIGN_BYTES) * ALIGN_BYTES
    return PairsLayout(capacity=capacity, index_offset=index_offset, value_offset=value_offset, size_bytes=size)


def encoded_pairs_bytes(capacity: int, *, index_bytes: int, value_bytes: int) -> int:
    """Bytes per rank of one encoded sparse payload of ``capacity`` pairs (header and padding included).

    >>> encoded_pairs_bytes(3, index_bytes=4, value_bytes=4)
    32
    """
    return pairs_layout(capacity, index_bytes=index_bytes, value_bytes=value_bytes).size_bytes
