"""The step plan: a step's decision as the ordered list of collective operations that carry it.

One pure function turns :func:`igpolicy.decide.decide_step`'s decision into what goes on the wire,
for a given *integration*; the runtime (``igrt.sync.executor``) performs exactly these operations on
tensors and the simulator (``igsim.step.engine``) costs exactly these operations on a topology.

Integrations and their issue order:

- ``sync`` (``igrt.sync.synchronizer.Synchronizer``, after backward) and ``deepspeed`` (the same
  synchronizer inside the optimizer's ``step()``): the decision's balanced buckets. At backward
  end, one count exchange carrying every sparse bucket's pair count (``COUNT_BYTES`` each), then
  one sparse gather per sparse bucket padded to the largest rank's count (skipped when every rank
  has 0 pairs), then one dense all-reduce per dense bucket. Every op is gated by backward end.
- ``ddp-hook`` (``igrt.integrations.ddp_hook``): DDP's own buckets, in DDP's order (see :func:`ddp_buckets`).
  Per DDP bucket, its parameters that send this step travel as one collective, gated by the
  bucket's readiness (DDP calls the hook once every gradient of the bucket is ready): a bounded
  sparsifier's gather padded to the nominal k with the count in its header; other sparsifiers
  exchange the bucket's count first; a dense sub-bucket is one all-reduce. A bucket that sends
  nothing issues no op.

The sparse-or-dense choice of a bucket is :func:`igpolicy.choice.choose_collective` on its
nominal sizes, so every rank picks the same. Payload accounting per op is :func:`op_bytes`, and a
step's :class:`~igpolicy.vocab.StepMetrics` bytes are the sum over its executed ops
(:class:`WireTally`), in the runtime and in the simulator alike.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from igpolicy.choice import choose_collective
from igpolicy.config import PolicyConfig
from igpolicy.decide import StepDecision
from igpolicy.vocab import CollectiveKind, ParamInfo
from igpolicy.wire import (
    BOUNDED_SPARSIFIERS,
    COUNT_BYTES,
    ROW_ID_BYTES,
    config_k,
    dense_value_bytes,
    pairs_layout,
    row_dim,
    rows_layout,
)

__all__ = [
    "DDP_FIRST_BUCKET_CAP_BYTES",
    "INTEGRATIONS",
    "CollectiveOp",
    "Gate",
    "OpBytes",
    "OpKind",
    "StepPlan",
    "WireTally",
    "bucket_ops",
    "build_step_plan",
    "ddp_buckets",
    "flush_plan",
    "op_bytes",
    "sparse_size_bytes",
]

INTEGRATIONS = ("sync", "ddp-hook", "deepspeed")
DDP_FIRST_BUCKET_CAP_BYTES = 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


class OpKind(str, enum.Enum):
    """What one collective operation is."""

    COUNT_EXCHANGE = "count_exchange"  # all-gather of one int64 pair count per sparse bucket
    SPARSE_GATHER = "sparse_gather"  # all-gather of encoded (index, value) payloads
    DENSE_ALLREDUCE = "dense_allreduce"  # sum of the zero-filled dense bucket


class Gate(str, enum.Enum):
    """What an op waits for before it is issued."""

    BACKWARD_END = "backward_end"  # the whole backward pass (after-backward integrations)
    BUCKET_READY = "bucket_ready"  # every gradient of ``gate_params`` on every rank (DDP hook)


@dataclass(frozen=True, kw_only=True)
class CollectiveOp:
    """One collective of a step, in issue order.

    ``buckets`` names the bucket(s) it carries: one for a payload op, every sparse bucket whose
    count it carries for a count exchange. ``param_names`` are the payload's parameters in wire
    order, ``param_k`` their nominal k (None: every entry travels). ``padded_to_nominal``: the
    capacity is the nominal pair count (no count exchange; bounded sparsifiers); otherwise a sparse
    gather is padded to the largest exchanged count and skipped when that is 0. ``size_bytes`` is
    the nominal encoded size per rank (a count exchange: ``COUNT_BYTES`` per bucket).
    """

    seq: int
    kind: OpKind
    buckets: tuple[int, ...]
    param_names: tuple[str, ...] = ()
    param_numel: tuple[int, ...] = ()
    param_k: tuple[int | None, ...] = ()
    numel: int = 0
    nominal_nnz: int = 0
    padded_to_nominal: bool = False
    size_bytes: int = 0
    gate: Gate = Gate.BACKWARD_END
    gate_params: tuple[str, ...] = ()
    value_bytes: int | None = None  # None: the config's (the flush sends fp32 whatever the config)
    param_row_dim: tuple[int, ...] = ()  # > 0: that parameter travels as whole rows of this width

    @property
    def row_entries(self) -> int:
        """Entries of the op's row-sparse parameters (always exactly their k: no count needed)."""
        return sum(int(k) for k, d in zip(self.param_k, self.param_row_dim) if d > 0)

    @property
    def has_pairs(self) -> bool:
        """Whether the payload has a pairs section (some parameter is not row-sparse)."""
        return not self.param_row_dim or any(d == 0 for d in self.param_row_dim)

    @property
    def bucket(self) -> int:
        return self.buckets[0]

    def key(self) -> tuple:
        """What identifies the op across runtime and simulator (kind, buckets, params, capacity rule)."""
        return (self.kind.value, self.buckets, self.param_names, self.padded_to_nominal)


@dataclass(frozen=True, kw_only=True)
class StepPlan:
    """A step's ordered collective operations, with the decision facts metrics need."""

    step: int
    integration: str
    ops: tuple[CollectiveOp, ...]
    sending_params: frozenset[str]
    num_sending_components: int
    bucket_imbalance: float

    @property
    def payload_ops(self) -> tuple[CollectiveOp, ...]:
        return tuple(op for op in self.ops if op.kind != OpKind.COUNT_EXCHANGE)


# --------------------------------------------------------------------------- accounting
@dataclass(frozen=True, kw_only=True)
class OpBytes:
    """One executed op's payload bytes for one rank (see :mod:`igpolicy.wire`); ``issued`` is
    False for a sparse gather skipped because every rank had nothing."""

    values_bytes: int = 0
    indices_bytes: int = 0
    dense_bytes: int = 0
    metadata_bytes: int = 0
    padding_bytes: int = 0
    wire_size_bytes: int = 0  # encoded bytes per rank handed to the collective
    issued: bool = True


def op_bytes(op: CollectiveOp, *, k: int, capacity: int, config: PolicyConfig) -> OpBytes:
    """Bytes of ``op`` for a rank that sends ``k`` pairs into a gather of ``capacity`` pairs.

    ``k`` / ``capacity`` matter only to sparse gathers (``capacity``: the nominal pair count when
    ``op.padded_to_nominal``, else the largest count any rank exchanged). A count exchange counts
    ``COUNT_BYTES`` metadata per bucket; a gather padded to nominal counts its header as metadata;
    an issued gather counts its block table and scale (compact widths) as metadata too. A dense
    all-reduce travels at :func:`igpolicy.wire.dense_value_bytes` per value.
    """
    ib, vb = config.index_bytes, config.value_bytes if op.value_bytes is None else op.value_bytes
    if op.kind == OpKind.COUNT_EXCHANGE:
        size = COUNT_BYTES * len(op.buckets)
        return OpBytes(metadata_bytes=size, wire_size_bytes=size)
    if op.kind == OpKind.DENSE_ALLREDUCE:
        size = op.numel * dense_value_bytes(vb)
        return OpBytes(dense_bytes=size, wire_size_bytes=size)
    assert 0 <= k <= capacity, f"op {op.seq}: {k} pairs exceed the capacity {capacity}"
    rows = op.row_entries
    if rows:  # row sections first (module doc of igpolicy.wire), then the pairs of the rest
        assert k >= rows and capacity >= rows, (
            f"op {op.seq}: k {k} / capacity {capacity} below its row entries"
        )
        r = _rows_bytes(op, vb)
        if not op.has_pairs:
            return r
        p = _pairs_bytes(op, k - rows, capacity - rows, ib, vb, issued_empty=True)
        return OpBytes(**{f: getattr(r, f) + getattr(p, f) for f in _SUMMED})
    return _pairs_bytes(op, k, capacity, ib, vb)


_SUMMED = (
    "values_bytes",
    "indices_bytes",
    "dense_bytes",
    "metadata_bytes",
    "padding_bytes",
    "wire_size_bytes",
)


def _pairs_bytes(
    op: CollectiveOp, k: int, capacity: int, ib: int, vb: int, *, issued_empty: bool = False
) -> OpBytes:
    meta = COUNT_BYTES if op.padded_to_nominal else 0
    if capacity == 0 and not issued_empty:
        return OpBytes(metadata_bytes=meta, issued=False)
    lay = pairs_layout(capacity, index_bytes=ib, value_bytes=vb, numel=op.numel)
    return OpBytes(
        values_bytes=k * vb,
        indices_bytes=k * ib,
        metadata_bytes=meta + lay.extra_metadata_bytes,
        padding_bytes=(capacity - k) * (ib + vb),
        wire_size_bytes=lay.size_bytes,
    )


def _rows_bytes(op: CollectiveOp, vb: int) -> OpBytes:
    """The rows sections of ``op`` (each exactly its nominal rows; header counted as metadata)."""
    values = ids = meta = size = 0
    for k, d in zip(op.param_k, op.param_row_dim):
        if d > 0:
            rows = int(k) // d
            lay = rows_layout(rows, dim=d, value_bytes=vb)
            values += rows * d * vb
            ids += rows * ROW_ID_BYTES
            meta += COUNT_BYTES + lay.extra_metadata_bytes
            size += lay.size_bytes
    return OpBytes(values_bytes=values, indices_bytes=ids, metadata_bytes=meta, wire_size_bytes=size)


def sparse_size_bytes(op: CollectiveOp, capacity: int, *, index_bytes: int, value_bytes: int) -> int:
    """Encoded bytes per rank of sparse gather ``op`` at ``capacity`` entries (rows included)."""
    rows = op.row_entries
    size = _rows_bytes(op, value_bytes).wire_size_bytes if rows else 0
    if op.has_pairs:
        size += pairs_layout(
            capacity - rows, index_bytes=index_bytes, value_bytes=value_bytes, numel=op.numel
        ).size_bytes
    return size


class WireTally:
    """Running sums of :class:`OpBytes` over one step's executed ops (the StepMetrics byte fields)."""

    FIELDS = ("values_bytes", "indices_bytes", "dense_bytes", "metadata_bytes", "padding_bytes")

    def __init__(self) -> None:
        self.values_bytes = self.indices_bytes = self.dense_bytes = 0
        self.metadata_bytes = self.padding_bytes = self.num_collectives = 0

    def add(self, b: OpBytes) -> OpBytes:
        for f in self.FIELDS:
            setattr(self, f, getattr(self, f) + getattr(b, f))
        self.num_collectives += int(b.issued)
        return b

    @property
    def wire_bytes(self) -> int:
        return self.values_bytes + self.indices_bytes + self.dense_bytes + self.metadata_bytes

    def as_dict(self) -> dict[str, int]:
        return {**{f: getattr(self, f) for f in self.FIELDS}, "num_collectives": self.num_collectives}


# --------------------------------------------------------------------------- building plans
def _payload_op(
    *,
    seq: int,
    bucket: int,
    names: Sequence[str],
    infos: Mapping[str, ParamInfo],
    ks: Mapping[str, int | None],
    config: PolicyConfig,
    world_size: int,
    gate: Gate,
    gate_params: tuple[str, ...],
    padded_to_nominal: bool,
    kind: CollectiveKind | None = None,
) -> CollectiveOp:
    numel = sum(infos[n].numel for n in names)
    nnz = sum(ks[n] if ks[n] is not None else infos[n].numel for n in names)
    if kind is None:
        kind = (
            choose_collective(
                numel=numel,
                nnz_per_rank=[nnz] * world_size,
                index_bytes=config.index_bytes,
                value_bytes=config.value_bytes,
                mode=config.collective,
            )
            if config.sparse
            else CollectiveKind.DENSE_ALLREDUCE
        )
    dense = kind == CollectiveKind.DENSE_ALLREDUCE
    ib, vb = config.index_bytes, config.value_bytes
    op = CollectiveOp(
        seq=seq,
        kind=OpKind.DENSE_ALLREDUCE if dense else OpKind.SPARSE_GATHER,
        buckets=(bucket,),
        param_names=tuple(names),
        param_numel=tuple(infos[n].numel for n in names),
        param_k=tuple(ks[n] for n in names),
        numel=numel,
        nominal_nnz=numel if dense else nnz,
        padded_to_nominal=padded_to_nominal and not dense,
        size_bytes=numel * dense_value_bytes(vb)
        if dense
        else pairs_layout(nnz, index_bytes=ib, value_bytes=vb, numel=numel).size_bytes,
        gate=gate,
        gate_params=gate_params,
        param_row_dim=tuple(0 if dense else row_dim(infos[n], config) for n in names),
    )
    if dense or not any(op.param_row_dim):
        return op
    return replace(op, size_bytes=sparse_size_bytes(op, nnz, index_bytes=ib, value_bytes=vb))


def _count_exchange(seq: int, buckets: Sequence[int], gate: Gate, gate_params=()) -> CollectiveOp:
    return CollectiveOp(
        seq=seq,
        kind=OpKind.COUNT_EXCHANGE,
        buckets=tuple(buckets),
        size_bytes=COUNT_BYTES * len(buckets),
        gate=gate,
        gate_params=tuple(gate_params),
    )


def _renumber(ops: Iterable[CollectiveOp], start: int = 0) -> tuple[CollectiveOp, ...]:
    return tuple(op if op.seq == start + i else replace(op, seq=start + i) for i, op in enumerate(ops))


def _after_backward_ops(decision: StepDecision, *, infos, ks, config, world_size) -> list[CollectiveOp]:
    payload = [
        _payload_op(
            seq=0,
            bucket=b.index,
            names=b.param_names,
            infos=infos,
            ks=ks,
            config=config,
            world_size=world_size,
            gate=Gate.BACKWARD_END,
            gate_params=(),
            padded_to_nominal=False,
            kind=b.collective,
        )
        for b in decision.buckets
    ]
    sparse = [op for op in payload if op.kind == OpKind.SPARSE_GATHER]
    dense = [op for op in payload if op.kind == OpKind.DENSE_ALLREDUCE]
    head = [_count_exchange(0, [op.bucket for op in sparse], Gate.BACKWARD_END)] if sparse else []
    return [*head, *sparse, *dense]


def bucket_ops(
    decision: StepDecision,
    *,
    bucket: int,
    names: Sequence[str],
    infos: Mapping[str, ParamInfo],
    ks: Mapping[str, int | None],
    config: PolicyConfig,
    world_size: int,
    first_seq: int = 0,
) -> tuple[CollectiveOp, ...]:
    """The ops of one DDP bucket (its parameters ``names`` in DDP's order) under the DDP hook."""
    sending = [n for n in names if n in decision.sending_params]
    if not sending:
        return ()
    bounded = config.sparsifier in BOUNDED_SPARSIFIERS
    gate_params = tuple(names)
    op = _payload_op(
        seq=0,
        bucket=bucket,
        names=sending,
        infos=infos,
        ks=ks,
        config=config,
        world_size=world_size,
        gate=Gate.BUCKET_READY,
        gate_params=gate_params,
        padded_to_nominal=bounded,
    )
    ops = [op]
    if op.kind == OpKind.SPARSE_GATHER and not bounded:
        ops.insert(0, _count_exchange(0, [bucket], Gate.BUCKET_READY, gate_params))
    return _renumber(ops, first_seq)


def build_step_plan(
    decision: StepDecision,
    *,
    integration: str,
    params: Sequence[ParamInfo],
    config: PolicyConfig,
    world_size: int,
    ddp_bucket_names: Sequence[Sequence[str]] | None = None,
) -> StepPlan:
    """The ordered collective ops of ``decision``'s step under ``integration`` (see module doc).

    ``ddp_bucket_names`` (``ddp-hook`` only, required there): DDP's buckets of this step, each
    its parameter names in DDP's order (:func:`ddp_buckets` predicts them). Raises ValueError for
    an unknown integration or a missing / inconsistent bucket assignment.
    """
    if integration not in INTEGRATIONS:
        raise ValueError(f"integration {integration!r} is not one of {', '.join(INTEGRATIONS)}")
    infos = {p.name: p for p in params}
    ks = {p.name: config_k(p, config) for p in params}
    if integration == "ddp-hook":
        if ddp_bucket_names is None:
            raise ValueError("integration 'ddp-hook' needs DDP's bucket assignment (ddp_bucket_names)")
        placed = [n for b in ddp_bucket_names for n in b]
        if sorted(placed) != sorted(infos):
            raise ValueError("ddp_bucket_names must place every parameter exactly once")
        ops: list[CollectiveOp] = []
        for j, names in enumerate(ddp_bucket_names):
            ops.extend(
                bucket_ops(
                    decision, bucket=j, names=names, infos=infos, ks=ks, config=config,
                    world_size=world_size, first_seq=len(ops),
                )
            )  # fmt: skip
        imbalance = _imbalance([op.size_bytes for op in ops if op.kind != OpKind.COUNT_EXCHANGE])
    else:
        ops = _after_backward_ops(decision, infos=infos, ks=ks, config=config, world_size=world_size)
        imbalance = float(decision.packing.imbalance)
    components = {p.component for p in params}
    return StepPlan(
        step=decision.step,
        integration=integration,
        ops=_renumber(ops),
        sending_params=decision.sending_params,
        num_sending_components=len(decision.release.send & components),
        bucket_imbalance=imbalance,
    )


def _imbalance(sizes: Sequence[int]) -> float:
    sizes = [s for s in sizes if s > 0]
    return max(sizes) / (sum(sizes) / len(sizes)) if sizes else 1.0


def flush_plan(buckets: Sequence[Sequence[str]], *, params: Sequence[ParamInfo]) -> tuple[CollectiveOp, ...]:
    """The end-of-training flush: one fp32 dense all-reduce per bucket of residuals (``buckets``:
    parameter names per bucket, e.g. from :func:`igpolicy.packing.pack` at 4 bytes per element)."""
    infos = {p.name: p for p in params}
    ops = []
    for j, names in enumerate(buckets):
        numel = sum(infos[n].numel for n in names)
        ops.append(
            CollectiveOp(
                seq=j,
                kind=OpKind.DENSE_ALLREDUCE,
                buckets=(j,),
                param_names=tuple(names),
                param_numel=tuple(infos[n].numel for n in names),
                param_k=tuple(None for _ in names),
                numel=numel,
                nominal_nnz=numel,
                size_bytes=4 * numel,
                value_bytes=4,
            )
        )
    return tuple(ops)


# --------------------------------------------------------------------------- DDP's bucketing
def ddp_buckets(
    params: Sequence[ParamInfo],
    *,
    bucket_cap_bytes: int = 25 * 2**20,
    first_bucket_cap_bytes: int | None = DDP_FIRST_BUCKET_CAP_BYTES,
    ready_order: Sequence[str] | None = None,
    find_unused_parameters: bool = False,
) -> tuple[tuple[str, ...], ...]:
    """DDP's bucket assignment (names per bucket, in the order DDP launches them).

    Mirrors ``torch.distributed._compute_bucket_assignment_by_size`` and DDP's use of it
    (torch 2.x): parameters are walked in order and grouped per dtype; a bucket closes when its
    bytes reach the current limit, and the limits advance from ``first_bucket_cap_bytes`` to
    ``bucket_cap_bytes`` per dtype.

    - ``ready_order=None``: the buckets DDP builds at construction (first iteration). Without
      ``find_unused_parameters`` that is one bucket of every parameter in registration order;
      with it, buckets over registration order sorted by their first parameter, then reversed.
    - ``ready_order``: the rebuilt buckets DDP uses from the second iteration on, over the order in
      which rank 0's gradients became ready in the first backward (no sorting, no reversal).

    ``first_bucket_cap_bytes=None`` means DDP was given a ``bucket_cap_mb`` explicitly (then the
    first bucket uses the same cap). Example::

        >>> from igpolicy.vocab import ParamInfo
        >>> ps = [ParamInfo(name=f"p{i}", shape=(2**18,), dtype="float32", component="0.norm", order=i)
        ...       for i in range(4)]
        >>> ddp_buckets(ps, bucket_cap_bytes=2**21, ready_order=["p3", "p2", "p1", "p0"])
        (('p3',), ('p2', 'p1'), ('p0',))
    """
    by_name = {p.name: p for p in params}
    first = bucket_cap_bytes if first_bucket_cap_bytes is None else int(first_bucket_cap_bytes)
    if ready_order is None:
        order = [p.name for p in sorted(params, key=lambda p: p.order)]
        if not find_unused_parameters:
            return (tuple(order),)
        limits = [first, bucket_cap_bytes] if first < bucket_cap_bytes else [bucket_cap_bytes]
        buckets = _assign(order, by_name, limits)
        index = {n: i for i, n in enumerate(order)}
        buckets.sort(key=lambda b: min(index[n] for n in b))
        return tuple(reversed(buckets))
    if sorted(ready_order) != sorted(by_name):
        raise ValueError("ready_order must name every parameter exactly once")
    return tuple(_assign(list(ready_order), by_name, [first, bucket_cap_bytes]))


_ELEMENT_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4}


def _assign(order: Sequence[str], by_name: Mapping[str, ParamInfo], limits: Sequence[int]):
    open_: dict[str, list] = {}  # dtype -> [names, bytes, limit index]
    done: list[tuple[str, ...]] = []
    for n in order:
        p = by_name[n]
        size = p.numel * _ELEMENT_BYTES.get(p.dtype, 4)
        b = open_.setdefault(p.dtype, [[], 0, 0])
        b[0].append(n)
        b[1] += size
        if b[1] >= limits[b[2]]:
            done.append(tuple(b[0]))
            open_[p.dtype] = [[], 0, min(b[2] + 1, len(limits) - 1)]
    done.extend(tuple(b[0]) for b in open_.values() if b[0])
    return done
