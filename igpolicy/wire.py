"""The wire format, defined once: what one rank puts on the wire for a sparse or dense payload.

The runtime (``igrt.sync.comm``) lays buffers out with these functions and the simulator
(``igsim.step.engine``) sizes its collectives with them, so both agree on every byte.

A sparse payload of one bucket is one rank's ``k`` (index, value) pairs, encoded as one uint8
buffer padded to a ``capacity`` that every rank knows::

    [ int64 k | block table | scale | capacity × index (index_bytes) | capacity × value (value_bytes) | pad to 8 ]

The block table and the scale are present only for the compact widths:

- ``index_bytes`` 4 / 8: int32 / int64 positions in the bucket's flat index space (no table).
- ``index_bytes`` 2 (*bucket-local 16-bit indices*): the bucket's ``numel`` positions are split into
  ``num_blocks(numel) = ceil(numel / 65,536)`` blocks of :data:`BLOCK_ENTRIES` positions; the block
  table is one uint32 pair count per block (``4 · num_blocks`` bytes, a function of the bucket's
  numel only), and the indices are uint16 offsets within their block, sorted ascending, block after
  block: position = ``65,536 · block + offset``. The values travel in the same (sorted) order.
- ``value_bytes`` 4 / 2: fp32 / bf16 values (no scale).
- ``value_bytes`` 1 (*8-bit values*): one fp32 scale per payload (:data:`SCALE_BYTES`), then int8
  values ``q = round(v / scale)`` with ``scale = max |v| / 127`` (symmetric absmax; 0 when every
  value is 0); a value decodes as ``q · scale`` in fp32. The sender computes the same product, so
  the rounding error ``v - q · scale`` stays in its residual (error feedback of the rounding,
  exactly as for bf16).

Sections follow one another without inner alignment (a decoder copies a misaligned section before
viewing it); only the whole buffer is padded to :data:`ALIGN_BYTES`. The encoded size is therefore
a deterministic function of (capacity, bucket numel, widths): :func:`encoded_pairs_bytes`.

``capacity`` is either the bucket's *nominal* pair count (a bounded sparsifier never selects
more, so no count exchange is needed: the count travels in the header) or the largest count of
any rank, learnt from a *count exchange* (one int64 per sparse bucket per rank, all-gathered).
A dense payload is the bucket's ``numel`` values, zero-filled where nothing was selected; it
travels at :func:`dense_value_bytes` per value: int8 values with per-rank scales cannot be summed
by an all-reduce, so the dense ops of a ``value_bytes=1`` configuration travel in bf16 (2 B).

*Row-sparse embeddings* (``PolicyConfig.row_sparse_embeddings``): a parameter of
:func:`row_dim` ``dim > 0`` (a 2-D token embedding, ComponentId kind ``embedding``, that a sparse
config would sparsify) sends whole rows instead of pairs. Its nominal k becomes
``rows · dim`` with ``rows = min(ceil(k / dim), vocab)`` (:func:`config_k`); every step it sends
exactly ``rows`` rows — those of largest accumulated-gradient norm ``‖g + e‖`` (ties: lower row id),
ids ascending — and error feedback keeps every entry not sent, so nothing is dropped. Each such
parameter adds one *rows section* to its op's payload, in wire order, before the pairs section of
the op's other parameters (present only when the op has any)::

    [ int64 rows | scale | rows × int32 row id | rows × dim value (value_bytes) | pad to 8 ]

The scale (8-bit values only) is the payload's one scale, repeated in each section. The rows count
is a function of the config alone, so a rows section needs no count exchange and its size is
:func:`encoded_rows_bytes` (rows, dim, value width): the simulator computes it from the recorded
per-step k (= rows · dim). Accounting: ``rows · dim · value_bytes`` value bytes,
``rows · ROW_ID_BYTES`` index bytes, ``COUNT_BYTES`` + scale metadata, no padding but alignment.

Payload accounting (what :class:`igpolicy.vocab.StepMetrics` counts, per rank): ``k · value_bytes``
value bytes, ``k · index_bytes`` index bytes, ``numel · dense_value_bytes`` dense bytes, and
metadata bytes: ``COUNT_BYTES`` per sparse bucket (in the count exchange, or as the header where
there is none) plus, per issued sparse gather, the block table and the scale
(:attr:`PairsLayout.extra_metadata_bytes`). Padding (``(capacity - k) · (index_bytes + value_bytes)``
and the final alignment) travels but is not payload; it is reported apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from igpolicy.vocab import ComponentId, ParamInfo

__all__ = [
    "ALIGN_BYTES",
    "BLOCK_ENTRIES",
    "BOUNDED_SPARSIFIERS",
    "COUNT_BYTES",
    "HEADER_BYTES",
    "INDEX_WIDTHS",
    "ROW_ID_BYTES",
    "SCALE_BYTES",
    "TABLE_ENTRY_BYTES",
    "VALUE_WIDTHS",
    "PairsLayout",
    "RowsLayout",
    "config_k",
    "dense_value_bytes",
    "encoded_pairs_bytes",
    "encoded_rows_bytes",
    "nominal_k",
    "num_blocks",
    "pairs_layout",
    "pairs_of",
    "row_dim",
    "rows_layout",
]

HEADER_BYTES = 8  # int64 pair count at the head of every encoded sparse payload
ALIGN_BYTES = 8  # encoded payloads are padded to a multiple of this
COUNT_BYTES = 8  # one int64 pair count per sparse bucket (count exchange or header)
BOUNDED_SPARSIFIERS = ("topk", "adtopk", "randomk")  # never select more than the nominal k
INDEX_WIDTHS = (2, 4, 8)  # bytes per index: bucket-local uint16 offsets, int32, int64
VALUE_WIDTHS = (1, 2, 4)  # bytes per value: int8 with a scale, bf16, fp32
BLOCK_ENTRIES = 2**16  # flat positions per block of bucket-local 16-bit indices
TABLE_ENTRY_BYTES = 4  # one uint32 pair count per block
SCALE_BYTES = 4  # one fp32 scale per payload of 8-bit values
ROW_ID_BYTES = 4  # int32 row id of a row-sparse embedding row


def num_blocks(numel: int) -> int:
    """Blocks of :data:`BLOCK_ENTRIES` positions that cover a bucket of ``numel`` (0 for empty)."""
    return -(-max(int(numel), 0) // BLOCK_ENTRIES)


def dense_value_bytes(value_bytes: int) -> int:
    """Bytes per value of a dense all-reduce under a config's ``value_bytes``: the same, except
    that 8-bit configurations all-reduce in bf16 (int8 values with per-rank scales do not sum).

    >>> dense_value_bytes(4), dense_value_bytes(2), dense_value_bytes(1)
    (4, 2, 2)
    """
    return 2 if value_bytes == 1 else int(value_bytes)


def nominal_k(numel: int, density: float) -> int:
    """Entries a sparsifier keeps: ceil(density · numel), at least 1 and at most numel (0 for empty)."""
    if numel <= 0:
        return 0
    return min(numel, max(1, math.ceil(density * numel - 1e-9)))


def _base_k(param: ParamInfo, config) -> int | None:
    """Nominal k of one parameter under ``config`` (its component's density,
    ``PolicyConfig.density_of``), or None when every entry travels: a dense policy, or a parameter
    of at most ``dense_small_numel`` entries (biases and norm weights send all their entries, as
    pairs inside a sparse gather or as values inside a dense all-reduce)."""
    if not config.sparse or (config.dense_small_numel > 0 and param.numel <= config.dense_small_numel):
        return None
    return nominal_k(param.numel, config.density_of(param.component))


def row_dim(param: ParamInfo, config) -> int:
    """Row width of ``param`` when it travels as whole rows under ``config``, else 0: a 2-D
    parameter of ComponentId kind ``embedding`` (the token embedding) that the config sparsifies,
    with ``row_sparse_embeddings`` on."""
    if not getattr(config, "row_sparse_embeddings", False) or len(param.shape) != 2:
        return 0
    if ComponentId.from_key(param.component).kind.value != "embedding" or _base_k(param, config) is None:
        return 0
    return int(param.shape[1])


def config_k(param: ParamInfo, config) -> int | None:
    """Nominal k of ``param`` under a :class:`igpolicy.config.PolicyConfig` (the one call every
    planner makes; None: every entry travels, see :func:`_base_k`); a row-sparse parameter (:func:`row_dim`) sends ``min(ceil(k / dim), vocab) · dim``."""
    k = _base_k(param, config)
    dim = row_dim(param, config)
    if k is None or dim == 0:
        return k
    return min(-(-k // dim), int(param.shape[0])) * dim


def pairs_of(param: ParamInfo, config) -> int:
    """Entries ``param`` puts on the wire when it sends under a sparse ``config`` (k, or numel)."""
    k = config_k(param, config)
    return param.numel if k is None else k


@dataclass(frozen=True, kw_only=True)
class PairsLayout:
    """Byte offsets of one rank's encoded sparse payload of ``capacity`` pairs (see module doc).

    ``num_blocks`` is 0 unless the indices are bucket-local 16-bit ones; ``scale_offset`` is None
    unless the values are 8-bit. ``extra_metadata_bytes`` = block table + scale (the header apart).
    """

    capacity: int
    num_blocks: int
    table_offset: int
    scale_offset: int | None
    index_offset: int
    value_offset: int
    size_bytes: int
    extra_metadata_bytes: int


def _check_widths(index_bytes: int, value_bytes: int) -> None:
    if index_bytes not in INDEX_WIDTHS:
        raise ValueError(f"index_bytes={index_bytes!r} is not one of {INDEX_WIDTHS}")
    if value_bytes not in VALUE_WIDTHS:
        raise ValueError(f"value_bytes={value_bytes!r} is not one of {VALUE_WIDTHS}")


def pairs_layout(
    capacity: int, *, index_bytes: int, value_bytes: int, numel: int | None = None
) -> PairsLayout:
    """Where the header, block table, scale, indices and values of an encoded payload lie.

    ``numel`` (the bucket's flat positions) is required for ``index_bytes=2``, whose block table
    it sizes; it is ignored otherwise. Raises ValueError for a negative capacity, an unknown width,
    or a missing ``numel``.
    """
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    _check_widths(index_bytes, value_bytes)
    nb = 0
    if index_bytes == 2:
        if numel is None or numel < 0:
            raise ValueError(f"index_bytes=2 needs the bucket's numel (got {numel!r})")
        if capacity > numel:
            raise ValueError(f"capacity {capacity} exceeds the bucket's {numel} positions")
        nb = num_blocks(numel)
    table_offset = HEADER_BYTES
    scale_offset = table_offset + nb * TABLE_ENTRY_BYTES
    index_offset = scale_offset + (SCALE_BYTES if value_bytes == 1 else 0)
    value_offset = index_offset + capacity * index_bytes
    raw = value_offset + capacity * value_bytes
    size = -(-raw // ALIGN_BYTES) * ALIGN_BYTES
    return PairsLayout(
        capacity=capacity, num_blocks=nb, table_offset=table_offset,
        scale_offset=scale_offset if value_bytes == 1 else None, index_offset=index_offset,
        value_offset=value_offset, size_bytes=size, extra_metadata_bytes=index_offset - HEADER_BYTES,
    )  # fmt: skip


def encoded_pairs_bytes(
    capacity: int, *, index_bytes: int, value_bytes: int, numel: int | None = None
) -> int:
    """Bytes per rank of one encoded sparse payload of ``capacity`` pairs (header, block table,
    scale and padding included); ``numel`` as in :func:`pairs_layout`.

    >>> encoded_pairs_bytes(3, index_bytes=4, value_bytes=4)
    32
    >>> encoded_pairs_bytes(3, index_bytes=2, value_bytes=1, numel=70_000)  # 8 + 2·4 + 4 + 3·2 + 3·1 -> 32
    32
    """
    return pairs_layout(capacity, index_bytes=index_bytes, value_bytes=value_bytes, numel=numel).size_bytes


@dataclass(frozen=True, kw_only=True)
class RowsLayout:
    """Byte offsets of one rank's rows section of ``rows`` rows of ``dim`` values (module doc)."""

    rows: int
    dim: int
    scale_offset: int | None
    id_offset: int
    value_offset: int
    size_bytes: int
    extra_metadata_bytes: int  # the scale (the rows header apart)


def rows_layout(rows: int, *, dim: int, value_bytes: int) -> RowsLayout:
    """Where the header, scale, row ids and values of a rows section lie; raises ValueError for a
    negative count, a non-positive ``dim`` or an unknown value width."""
    if rows < 0 or dim <= 0:
        raise ValueError(f"rows_layout: rows={rows} must be >= 0 and dim={dim} > 0")
    _check_widths(4, value_bytes)
    scale = SCALE_BYTES if value_bytes == 1 else 0
    id_offset = HEADER_BYTES + scale
    value_offset = id_offset + rows * ROW_ID_BYTES
    raw = value_offset + rows * dim * value_bytes
    return RowsLayout(
        rows=rows, dim=dim, scale_offset=HEADER_BYTES if scale else None, id_offset=id_offset,
        value_offset=value_offset, size_bytes=-(-raw // ALIGN_BYTES) * ALIGN_BYTES,
        extra_metadata_bytes=scale,
    )  # fmt: skip


def encoded_rows_bytes(rows: int, *, dim: int, value_bytes: int) -> int:
    """Bytes per rank of one rows section.

    >>> encoded_rows_bytes(2, dim=3, value_bytes=4)  # 8 + 2·4 + 6·4 = 40
    40
    >>> encoded_rows_bytes(2, dim=3, value_bytes=1)  # 8 + 4 + 2·4 + 6 = 26 -> 32
    32
    """
    return rows_layout(rows, dim=dim, value_bytes=value_bytes).size_bytes
