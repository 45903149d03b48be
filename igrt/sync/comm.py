"""Collectives on torch.distributed (gloo on CPU, NCCL on GPU) that count the bytes they carry.

The bytes counted are this rank's own payload, before any algorithm's replication, exactly as the
simulator counts them (:class:`igpolicy.vocab.StepMetrics`):

- a sparse gather of k (index, value) pairs: ``k · index_bytes`` index bytes + ``k · value_bytes``
  value bytes, plus 8 metadata bytes (this rank's int64 pair count);
- a dense all-reduce of n elements: ``n · value_bytes``.

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
from igpolicy.wire import HEADER_BYTES, pairs_layout

__all__ = [
    "CommCounter",
    "GatherResult",
    "aggregate_pairs",
    "check_agreement",
    "decode_pairs",
    "dense_all_reduce",
    "encode_pairs",
    "exchange_counts",
    "gather_pairs",
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


def wire_dtypes(config: PolicyConfig) -> tuple[torch.dtype, torch.dtype]:
    """(index dtype, value dtype) on the wire: int32/int64 and float32/bfloat16."""
    index = torch.int32 if config.index_bytes == 4 else torch.int64
    value = torch.float32 if config.value_bytes == 4 else torch.bfloat16
    return index, value


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
def encode_pairs(indices: torch.Tensor, values: torch.Tensor, *, capacity: int) -> torch.Tensor:
    """One rank's pairs as a uint8 buffer laid out by :func:`igpolicy.wire.pairs_layout`: int64
    count, indices, values, each padded to ``capacity``."""
    k = indices.numel()
    if k != values.numel():
        raise ValueError(f"encode_pairs: {k} indices but {values.numel()} values")
    assert k <= capacity, f"encode_pairs: {k} pairs exceed the capacity {capacity}"
    ib, vb = indices.element_size(), values.element_size()
    lay = pairs_layout(capacity, index_bytes=ib, value_bytes=vb)
    buf = torch.zeros(lay.size_bytes, dtype=torch.uint8, device=values.device)
    buf[:HEADER_BYTES].view(torch.int64).fill_(k)
    i0, v0 = lay.index_offset, lay.value_offset
    if k:
        buf[i0 : i0 + k * ib].view(indices.dtype).copy_(indices)
        buf[v0 : v0 + k * vb].view(values.dtype).copy_(values)
    return buf


def decode_pairs(
    flat: torch.Tensor,
    *,
    num_ranks: int,
    capacity: int,
    index_dtype: torch.dtype,
    value_dtype: torch.dtype,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Inverse of :func:`encode_pairs` over the all-gathered buffers of ``num_ranks`` ranks."""
    ib = torch.empty(0, dtype=index_dtype).element_size()
    vb = torch.empty(0, dtype=value_dtype).element_size()
    lay = pairs_layout(capacity, index_bytes=ib, value_bytes=vb)
    chunk = lay.size_bytes
    assert flat.numel() == num_ranks * chunk, "decode_pairs: buffer length does not match"
    out = []
    i0, v0 = lay.index_offset, lay.value_offset
    for r in range(num_ranks):
        buf = flat[r * chunk : (r + 1) * chunk]
        k = int(buf[:HEADER_BYTES].view(torch.int64).item())
        assert 0 <= k <= capacity, f"decode_pairs: rank {r} claims {k} pairs, capacity {capacity}"
        out.append((buf[i0 : i0 + k * ib].view(index_dtype), buf[v0 : v0 + k * vb].view(value_dtype)))
    return out


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

    def wait(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self.flat is None:  # every rank had nothing: no collective was run
            dev = self.empty_device
            return [
                (
                    torch.empty(0, dtype=self.index_dtype, device=dev),
                    torch.empty(0, dtype=self.value_dtype, device=dev),
                )
            ] * self.num_ranks
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
        )


def gather_pairs(
    indices: torch.Tensor,
    values: torch.Tensor,
    *,
    capacity: int,
    group=None,
    counter: CommCounter | None = None,
    async_op: bool = False,
) -> GatherResult:
    """All-gather (index, value) pairs padded to ``capacity`` (known to every rank); one collective.

    ``capacity`` must be the same on every rank and at least this rank's pair count (the maximum
    of :func:`exchange_counts`, or a bound every rank knows such as the nominal k). With
    ``capacity == 0`` no collective runs. Counts payload bytes (not padding) in ``counter``.
    """
    p = world_size(group)
    k = indices.numel()
    if counter is not None:
        counter.indices_bytes += k * indices.element_size()
        counter.values_bytes += k * values.element_size()
        counter.padding_bytes += (capacity - k) * (indices.element_size() + values.element_size())
    if capacity == 0:
        return GatherResult(None, None, p, 0, indices.dtype, values.dtype, empty_device=values.device)
    buf = encode_pairs(indices, values, capacity=capacity)
    flat, work = _all_gather_flat(buf, group, async_op=async_op)
    if counter is not None:
        counter.num_collectives += 1
    return GatherResult(flat, work, p, capacity, indices.dtype, values.dtype)


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
