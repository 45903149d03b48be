"""Collectives on torch.distributed (gloo on CPU, NCCL on GPU) that count the bytes they carry.

The bytes counted are this rank's own payload, before any algorithm's replication, exactly as the
simulator counts them (:class:`igpolicy.vocab.StepMetrics`):

- a sparse gather of k (index, value) pairs: ``k · index_bytes`` index bytes + ``k · value_bytes``
  value bytes, plus 8 metadata bytes (this rank's int64 pair count) and, for the compact widths,
  the block table and the scale (:mod:`igpolicy.wire`);
- a dense all-reduce of n elements: ``n · value_bytes``.

The layout of an encoded payload is :func:`igpolicy.wire.pairs_layout`'s; :func:`encode_pairs` /
:func:`decode_pairs` write and read it (bucket-local 16-bit indices sorted and block-coded, 8-bit
values with their scale: :func:`quantize_int8`).

Padding to the largest rank's count travels on the wire but is not payload; it is counted apart
(``padding_bytes``).

A sparse gather is tensor-only (no pickled objects) and never hangs on empty payloads: counts are
exchanged first, every rank then knows the largest count, a step where every rank has nothing skips
the payload collective on every rank, and otherwise every rank sends a buffer padded to the largest
count. Indices and values travel together in one uint8 buffer per rank: one collective per bucket.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from igpolicy.config import PolicyConfig
from igpolicy.wire import BLOCK_ENTRIES, HEADER_BYTES, pairs_layout, rows_layout

__all__ = [
    "CommCounter",
    "GatherResult",
    "PayloadGather",
    "RowSelector",
    "RowsPart",
    "aggregate_pairs",
    "check_agreement",
    "decode_pairs",
    "decode_rows",
    "dense_all_reduce",
    "dequantize_int8",
    "encode_pairs",
    "encode_rows",
    "exchange_counts",
    "gather_pairs",
    "gather_payload",
    "quantize_int8",
    "rows_to_pairs",
    "select_rows",
    "sparse_all_gather",
    "wire_dtypes",
    "world_size",
]


@dataclass
class CommCounter:
    """Running byte and collective counters of one rank (reset per step by the caller)."""

    values_bytes: int = 0
    indices_bytes: int = 0
    dense_bytes: int = 0
    metadata_bytes: int = 0
    padding_bytes: int = 0
    num_collectives: int = 0
    comm_s: float = 0.0
    per_kind: dict[str, int] = field(default_factory=dict)

    def reset(self) -> None:
        self.values_bytes = self.indices_bytes = self.dense_bytes = 0
        self.metadata_bytes = self.padding_bytes = self.num_collectives = 0
        self.comm_s = 0.0
        self.per_kind.clear()

    @property
    def wire_bytes(self) -> int:
        return self.values_bytes + self.indices_bytes + self.dense_bytes + self.metadata_bytes


def world_size(group: dist.ProcessGroup | None = None) -> int:
    """Ranks in ``group`` (1 when torch.distributed is not initialized)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def _all_gather_flat(x: torch.Tensor, group, *, async_op: bool = False):
    """All-gather equal-length 1-D ``x`` into one flat (world · len) tensor; returns (out, work)."""
    p = world_size(group)
    out = torch.empty(p * x.numel(), dtype=x.dtype, device=x.device)
    if p == 1:
        out.copy_(x)
        return out, None
    work = dist.all_gather(list(out.chunk(p)), x, group=group, async_op=async_op)
    return out, work


_VALUE_DTYPES = {4: torch.float32, 2: torch.bfloat16, 1: torch.int8}


def wire_dtypes(config: PolicyConfig) -> tuple[torch.dtype, torch.dtype]:
    """(index dtype in memory, value dtype on the wire): int32 for 4-byte indices, int64 for 8
    and for the block-coded 2-byte ones (encoded by :func:`encode_pairs`); float32 / bfloat16 /
    int8 (8-bit values are selected in fp32 and quantized per payload, :func:`quantize_int8`)."""
    index = torch.int32 if config.index_bytes == 4 else torch.int64
    return index, _VALUE_DTYPES[config.value_bytes]


def quantize_int8(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 q, fp32 scale) of one payload's values: ``scale = max |v| / 127`` (0 when every value
    is 0 or there is none), ``q = round(v / scale)``. A non-finite value makes the scale NaN, so
    the payload decodes to NaN (a poisoned payload stays poisoned); its q is 0. No host sync."""
    v = values.detach().to(torch.float32).reshape(-1)
    if v.numel() == 0:
        return torch.empty(0, dtype=torch.int8, device=v.device), torch.zeros((), device=v.device)
    amax = v.abs().amax()
    scale = torch.where(torch.isfinite(amax), amax / 127.0, torch.nan)
    # scale 0 (every value 0, or so tiny that it underflows): q = 0, the values stay in the residual
    q = torch.round(v / torch.where(scale > 0, scale, 1.0)).clamp_(-127, 127)
    return torch.nan_to_num(q, nan=0.0).to(torch.int8), scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 values of int8 ``q`` at ``scale`` (the sender and every receiver compute the same)."""
    return q.to(torch.float32) * scale.to(torch.float32)


def aggregate_pairs(
    gathered: Sequence[tuple[torch.Tensor, torch.Tensor]], *, numel: int, device: torch.device
) -> torch.Tensor:
    """fp32 mean over ranks of scattered (index, value) pairs: a dense flat tensor of ``numel``.

    Ranks are added in rank order, so every rank computes bit-identical results.
    """
    acc = torch.zeros(numel, dtype=torch.float32, device=device)
    for idx, vals in gathered:
        if idx.numel():
            acc.index_add_(
                0, idx.to(device=device, dtype=torch.int64), vals.to(device=device, dtype=torch.float32)
            )
    return acc.div_(max(len(gathered), 1))


# --------------------------------------------------------------------------- encoding
def _put(buf: torch.Tensor, offset: int, t: torch.Tensor) -> None:
    """Copy ``t``'s bytes into ``buf`` at ``offset`` (no alignment needed)."""
    raw = t.contiguous().reshape(-1).view(torch.uint8)
    buf[offset : offset + raw.numel()].copy_(raw)


def _get(buf: torch.Tensor, offset: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """``count`` elements of ``dtype`` at byte ``offset`` of ``buf`` (a copy when misaligned)."""
    size = torch.empty(0, dtype=dtype).element_size()
    raw = buf[offset : offset + count * size]
    if count == 0:
        return torch.empty(0, dtype=dtype, device=buf.device)
    if (buf.storage_offset() + offset) % size:
        raw = raw.clone()
    return raw.view(dtype)


def _block_code(
    indices: torch.Tensor, numel: int, num_blocks: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sort order, uint32 counts per block as int64, int16 offsets) of bucket-local 16-bit indices."""
    idx = indices.to(torch.int64)
    if idx.numel() and not (int(idx.min()) >= 0 and int(idx.max()) < numel):
        raise ValueError(f"encode_pairs: an index lies outside the bucket's {numel} positions")
    order = torch.argsort(idx, stable=True)
    idx = idx[order]
    counts = torch.bincount(idx // BLOCK_ENTRIES, minlength=num_blocks)
    off = idx % BLOCK_ENTRIES
    off = torch.where(off >= 2**15, off - 2**16, off).to(torch.int16)  # uint16 bits in an int16
    return order, counts, off


def encode_pairs(
    indices: torch.Tensor,
    values: torch.Tensor,
    *,
    capacity: int,
    index_bytes: int | None = None,
    numel: int | None = None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """One rank's pairs as a uint8 buffer laid out by :func:`igpolicy.wire.pairs_layout`.

    ``index_bytes`` defaults to the indices' element size; 2 means bucket-local 16-bit indices
    over the bucket's ``numel`` positions (sorted here, the values with them). The value width is
    the values' dtype: int8 values need their fp32 ``scale`` (:func:`quantize_int8`).
    """
    k = indices.numel()
    if k != values.numel():
        raise ValueError(f"encode_pairs: {k} indices but {values.numel()} values")
    assert k <= capacity, f"encode_pairs: {k} pairs exceed the capacity {capacity}"
    ib = indices.element_size() if index_bytes is None else int(index_bytes)
    vb = values.element_size()
    if (vb == 1) != (scale is not None):
        raise ValueError("encode_pairs: int8 values need a scale, and only they take one")
    lay = pairs_layout(capacity, index_bytes=ib, value_bytes=vb, numel=numel)
    buf = torch.zeros(lay.size_bytes, dtype=torch.uint8, device=values.device)
    buf[:HEADER_BYTES].view(torch.int64).fill_(k)
    if ib == 2:
        order, counts, off = _block_code(indices, int(numel), lay.num_blocks)
        _put(buf, lay.table_offset, counts.to(torch.int32))
        indices, values = off, values.reshape(-1)[order]
    elif indices.element_size() != ib:
        raise ValueError(f"encode_pairs: {indices.dtype} indices for index_bytes={ib}")
    if scale is not None:
        _put(buf, lay.scale_offset, scale.reshape(1).to(torch.float32))
    if k:
        _put(buf, lay.index_offset, indices)
        _put(buf, lay.value_offset, values)
    return buf


def decode_pairs(
    flat: torch.Tensor,
    *,
    num_ranks: int,
    capacity: int,
    index_dtype: torch.dtype,
    value_dtype: torch.dtype,
    index_bytes: int | None = None,
    numel: int | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Inverse of :func:`encode_pairs` over the all-gathered buffers of ``num_ranks`` ranks.

    With ``index_bytes=2`` (bucket-local, needs ``numel``) the indices come back as int64 positions,
    sorted; int8 values come back as fp32 ``q · scale``.
    """
    ib = torch.empty(0, dtype=index_dtype).element_size() if index_bytes is None else int(index_bytes)
    vb = torch.empty(0, dtype=value_dtype).element_size()
    lay = pairs_layout(capacity, index_bytes=ib, value_bytes=vb, numel=numel)
    chunk = lay.size_bytes
    assert flat.numel() == num_ranks * chunk, "decode_pairs: buffer length does not match"
    out = []
    for r in range(num_ranks):
        buf = flat[r * chunk : (r + 1) * chunk]
        k = int(buf[:HEADER_BYTES].view(torch.int64).item())
        assert 0 <= k <= capacity, f"decode_pairs: rank {r} claims {k} pairs, capacity {capacity}"
        if ib == 2:
            counts = _get(buf, lay.table_offset, lay.num_blocks, torch.int32).to(torch.int64)
            assert int(counts.sum()) == k, f"decode_pairs: rank {r}'s block table does not hold {k} pairs"
            off = _get(buf, lay.index_offset, k, torch.int16).to(torch.int64) & (BLOCK_ENTRIES - 1)
            blocks = torch.repeat_interleave(torch.arange(lay.num_blocks, device=buf.device), counts)
            idx = blocks * BLOCK_ENTRIES + off
        else:
            idx = _get(buf, lay.index_offset, k, index_dtype)
        vals = _get(buf, lay.value_offset, k, value_dtype)
        if vb == 1:
            vals = dequantize_int8(vals, _get(buf, lay.scale_offset, 1, torch.float32)[0])
        out.append((idx, vals))
    return out


def select_rows(u: torch.Tensor, rows: int, *, dim: int) -> torch.Tensor:
    """int64 ids, ascending, of the ``rows`` rows of ``u`` (viewed as ``[-1, dim]``) with the largest
    squared norm (ties: the lower id first); deterministic, so every rank's rule is the same."""
    norms = u.detach().reshape(-1, dim).to(torch.float32).square().sum(dim=1)
    order = torch.argsort(norms, descending=True, stable=True)[:rows]
    return torch.sort(order).values


class RowSelector:
    """A sparsifier-shaped selection of whole rows: ``select(u, k)`` gives the flat indices of
    ``k // dim`` rows by :func:`select_rows` (the residual code treats them as any selection)."""

    def __init__(self, dim: int) -> None:
        self.dim = int(dim)

    def select(self, u: torch.Tensor, k: int, *, step: int = 0, key: str = "") -> torch.Tensor:
        ids = select_rows(u, int(k) // self.dim, dim=self.dim)
        return (ids.reshape(-1, 1) * self.dim + torch.arange(self.dim, device=ids.device)).reshape(-1)


def encode_rows(
    row_ids: torch.Tensor, values: torch.Tensor, *, dim: int, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """One rank's rows section (:func:`igpolicy.wire.rows_layout`): ``row_ids`` (any int dtype,
    sent as int32) and their ``rows · dim`` values, row after row; int8 values need their scale."""
    rows = row_ids.numel()
    if values.numel() != rows * dim:
        raise ValueError(f"encode_rows: {rows} rows of {dim} need {rows * dim} values, got {values.numel()}")
    vb = values.element_size()
    if (vb == 1) != (scale is not None):
        raise ValueError("encode_rows: int8 values need a scale, and only they take one")
    lay = rows_layout(rows, dim=dim, value_bytes=vb)
    buf = torch.zeros(lay.size_bytes, dtype=torch.uint8, device=values.device)
    buf[:HEADER_BYTES].view(torch.int64).fill_(rows)
    if scale is not None:
        _put(buf, lay.scale_offset, scale.reshape(1).to(torch.float32))
    if rows:
        _put(buf, lay.id_offset, row_ids.to(torch.int32))
        _put(buf, lay.value_offset, values)
    return buf


def decode_rows(
    buf: torch.Tensor, *, rows: int, dim: int, value_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`encode_rows` for one rank's section: (int64 row ids, values; int8 as fp32)."""
    vb = torch.empty(0, dtype=value_dtype).element_size()
    lay = rows_layout(rows, dim=dim, value_bytes=vb)
    assert buf.numel() == lay.size_bytes, "decode_rows: section length does not match"
    got = int(buf[:HEADER_BYTES].view(torch.int64).item())
    assert got == rows, f"decode_rows: the section holds {got} rows, expected {rows}"
    ids = _get(buf, lay.id_offset, rows, torch.int32).to(torch.int64)
    vals = _get(buf, lay.value_offset, rows * dim, value_dtype)
    if vb == 1:
        vals = dequantize_int8(vals, _get(buf, lay.scale_offset, 1, torch.float32)[0])
    return ids, vals


def rows_to_pairs(
    ids: torch.Tensor, vals: torch.Tensor, *, dim: int, offset: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A rows section's entries as (int64 bucket positions, values): row r of a parameter at
    bucket offset ``offset`` covers ``offset + r · dim + [0, dim)``."""
    pos = (offset + ids.reshape(-1, 1) * dim + torch.arange(dim, device=ids.device)).reshape(-1)
    return pos, vals.reshape(-1)


@dataclass(frozen=True)
class RowsPart:
    """One row-sparse parameter of a payload: its row ids, their values, width and bucket offset."""

    row_ids: torch.Tensor
    values: torch.Tensor
    dim: int
    offset: int


@dataclass
class PayloadGather:
    """An in-flight gather of payloads with rows sections (then, if any, a pairs section);
    :meth:`wait` / :meth:`decode` give ``[(int64 positions, values)]`` per rank, like
    :class:`GatherResult`."""

    flat: torch.Tensor
    work: object | None
    num_ranks: int
    rows: list[tuple[int, int, int]]  # (rows, dim, offset) per rows section
    value_dtype: torch.dtype
    pairs: dict | None  # decode_pairs keywords of the pairs section (None: no pairs section)

    def wait(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self.work is not None:
            self.work.wait()
            self.work = None
        return self.decode()

    def decode(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        vb = torch.empty(0, dtype=self.value_dtype).element_size()
        sizes = [rows_layout(r, dim=d, value_bytes=vb).size_bytes for r, d, _ in self.rows]
        chunk = self.flat.numel() // self.num_ranks
        out = []
        for rank in range(self.num_ranks):
            buf = self.flat[rank * chunk : (rank + 1) * chunk]
            at, idx, vals = 0, [], []
            for (r, d, off), size in zip(self.rows, sizes):
                ids, v = decode_rows(buf[at : at + size], rows=r, dim=d, value_dtype=self.value_dtype)
                pos, v = rows_to_pairs(ids, v, dim=d, offset=off)
                idx.append(pos)
                vals.append(v.to(torch.float32))
                at += size
            if self.pairs is not None:
                ((pi, pv),) = decode_pairs(buf[at:], num_ranks=1, **self.pairs)
                idx.append(pi.to(torch.int64))
                vals.append(pv.to(torch.float32))
            out.append((torch.cat(idx), torch.cat(vals)))
        return out


def gather_payload(
    rows: Sequence[RowsPart],
    indices: torch.Tensor | None,
    values: torch.Tensor | None,
    *,
    capacity: int,
    group=None,
    async_op: bool = False,
    index_bytes: int | None = None,
    numel: int | None = None,
    scale: torch.Tensor | None = None,
) -> PayloadGather:
    """All-gather one payload of rows sections followed by a pairs section of ``capacity`` pairs
    (``indices`` None: the op has no pairs section); one collective. Every rank's sections have the
    same sizes (the rows counts are the config's, the capacity is agreed)."""
    parts = [encode_rows(r.row_ids, r.values, dim=r.dim, scale=scale) for r in rows]
    pairs = None
    vdt = (rows[0].values if rows else values).dtype
    if indices is not None:
        parts.append(
            encode_pairs(
                indices, values, capacity=capacity, index_bytes=index_bytes, numel=numel, scale=scale
            )
        )
        pairs = dict(capacity=capacity, index_dtype=indices.dtype, value_dtype=values.dtype,
                     index_bytes=index_bytes, numel=numel)  # fmt: skip
    buf = torch.cat(parts)
    flat, work = _all_gather_flat(buf, group, async_op=async_op)
    return PayloadGather(
        flat, work, world_size(group), [(r.row_ids.numel(), r.dim, r.offset) for r in rows], vdt, pairs
    )


# --------------------------------------------------------------------------- collectives
def exchange_counts(
    counts: Sequence[int],
    *,
    group=None,
    device: torch.device | str = "cpu",
    counter: CommCounter | None = None,
) -> list[list[int]]:
    """All-gather this rank's pair counts for several buckets in one collective.

    Returns ``[rank][bucket] -> count``. Every rank must pass the same number of counts. Counts
    8 metadata bytes per bucket (time is the caller's to measure).
    """
    n = len(counts)
    p = world_size(group)
    if n == 0:
        return [[] for _ in range(p)]
    mine = torch.tensor([int(c) for c in counts], dtype=torch.int64, device=device)
    out, _ = _all_gather_flat(mine, group)
    if counter is not None:
        counter.metadata_bytes += 8 * n
    return out.view(p, n).tolist()


@dataclass
class GatherResult:
    """An in-flight (or finished) gather of pairs; :meth:`wait` returns ``[(indices, values)]`` per rank."""

    flat: torch.Tensor | None
    work: object | None
    num_ranks: int
    capacity: int
    index_dtype: torch.dtype
    value_dtype: torch.dtype
    empty_device: torch.device | None = None
    index_bytes: int | None = None  # None: the index dtype's size; 2: bucket-local over ``numel``
    numel: int | None = None

    def wait(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self.flat is None:  # every rank had nothing: no collective was run
            dev = self.empty_device
            vdt = torch.float32 if self.value_dtype == torch.int8 else self.value_dtype
            idt = torch.int64 if self.index_bytes == 2 else self.index_dtype
            empty = (torch.empty(0, dtype=idt, device=dev), torch.empty(0, dtype=vdt, device=dev))
            return [empty] * self.num_ranks
        if self.work is not None:
            self.work.wait()
            self.work = None
        return self.decode()

    def decode(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Decode without waiting (for a completion callback, where the collective is done)."""
        assert self.flat is not None
        return decode_pairs(
            self.flat,
            num_ranks=self.num_ranks,
            capacity=self.capacity,
            index_dtype=self.index_dtype,
            value_dtype=self.value_dtype,
            index_bytes=self.index_bytes,
            numel=self.numel,
        )


def gather_pairs(
    indices: torch.Tensor,
    values: torch.Tensor,
    *,
    capacity: int,
    group=None,
    counter: CommCounter | None = None,
    async_op: bool = False,
    index_bytes: int | None = None,
    numel: int | None = None,
    scale: torch.Tensor | None = None,
) -> GatherResult:
    """All-gather (index, value) pairs padded to ``capacity`` (known to every rank); one collective.

    ``capacity`` must be the same on every rank and at least this rank's pair count (the maximum
    of :func:`exchange_counts`, or a bound every rank knows such as the nominal k). With
    ``capacity == 0`` no collective runs. ``index_bytes`` / ``numel`` / ``scale`` as in
    :func:`encode_pairs`. Counts payload bytes (not padding) in ``counter``, and the block table
    and scale as metadata.
    """
    p = world_size(group)
    k = indices.numel()
    ib = indices.element_size() if index_bytes is None else int(index_bytes)
    vb = values.element_size()
    if counter is not None:
        counter.indices_bytes += k * ib
        counter.values_bytes += k * vb
        counter.padding_bytes += (capacity - k) * (ib + vb)
    if capacity == 0:
        return GatherResult(None, None, p, 0, indices.dtype, values.dtype, empty_device=values.device,
                            index_bytes=index_bytes, numel=numel)  # fmt: skip
    buf = encode_pairs(indices, values, capacity=capacity, index_bytes=index_bytes, numel=numel, scale=scale)
    flat, work = _all_gather_flat(buf, group, async_op=async_op)
    if counter is not None:
        counter.num_collectives += 1
        lay = pairs_layout(capacity, index_bytes=ib, value_bytes=vb, numel=numel)
        counter.metadata_bytes += lay.extra_metadata_bytes
    return GatherResult(
        flat, work, p, capacity, indices.dtype, values.dtype, index_bytes=index_bytes, numel=numel
    )


def sparse_all_gather(
    indices: torch.Tensor,
    values: torch.Tensor,
    group=None,
    *,
    counter: CommCounter | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every rank's (indices, values) of one bucket, in rank order; blocking.

    Counts first (one int64 all-gather), then one all-gather of the padded buffers; zero-length
    payloads on some or all ranks are fine. ``indices`` are int32 (or int64) positions in the
    bucket; ``values`` any dtype. Counts ``k·index_bytes + k·value_bytes`` payload and 8 metadata
    bytes for this rank.
    """
    t0 = time.perf_counter()
    counts = exchange_counts([indices.numel()], group=group, device=values.device, counter=counter)
    capacity = max(row[0] for row in counts)
    result = gather_pairs(indices, values, capacity=capacity, group=group, counter=counter).wait()
    if counter is not None:
        counter.comm_s += time.perf_counter() - t0
    return result


def dense_all_reduce(
    tensor: torch.Tensor, group=None, *, counter: CommCounter | None = None, async_op: bool = False
):
    """Sum ``tensor`` over ranks in place; returns the work handle (None when blocking or alone).

    Counts ``numel · element_size`` dense bytes.
    """
    t0 = time.perf_counter()
    if counter is not None:
        counter.dense_bytes += tensor.numel() * tensor.element_size()
        counter.num_collectives += 1
    if world_size(group) == 1:
        return None
    work = dist.all_reduce(tensor, group=group, async_op=async_op)
    if counter is not None and not async_op:
        counter.comm_s += time.perf_counter() - t0
    return work


def check_agreement(
    parts: dict[str, str],
    *,
    group=None,
    device: torch.device | str = "cpu",
    who: str = "ranks",
    width: int = 16,
) -> None:
    """All-gather short strings (``width`` ASCII characters each) and raise ValueError on every rank
    naming each part that differs and every rank's value. Tensor-only and fixed-size: never hangs
    on a disagreement, every rank sees the same table and raises together."""
    p = world_size(group)
    if p == 1:
        return
    names = sorted(parts)
    text = "".join(parts[n].ljust(width)[:width] for n in names)
    mine = torch.tensor(list(text.encode("ascii")), dtype=torch.uint8, device=device)
    out, _ = _all_gather_flat(mine, group)
    rows = [bytes(r).decode("ascii") for r in out.view(p, -1).cpu().tolist()]
    problems = []
    for j, part in enumerate(names):
        seen = [row[j * width : (j + 1) * width].strip() for row in rows]
        if len(set(seen)) > 1:
            listing = ", ".join(f"rank {r}: {v}" for r, v in enumerate(seen))
            problems.append(f"{part} differs ({listing})")
    if problems:
        raise ValueError(f"{who}: ranks disagree on the sync setup: " + "; ".join(problems))
