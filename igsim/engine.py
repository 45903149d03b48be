"""The step engine: replay a policy's decisions on a workload and cost every bucket on a topology.

Per simulated step ``t`` (timeline in seconds since the step started, all ranks starting together):

1. The decisions are :func:`igpolicy.decide.decide_step`'s (the function the runtime calls), on
   nominal payload sizes, with phases from :func:`igpolicy.decide.release_phases` computed once.
2. Rank r runs forward for ``f_r`` and backward for ``b_r``; parameter i is ready at
   ``f_r + s_r · ready_s[i]`` (``s_r`` is the rank's jitter factor). A bucket is ready when its last
   parameter is ready on the slowest rank.
3. The collectives go on ONE stream, each starting when it is ready and the previous one has ended,
   in the order the runtime issues them:
   - ``overlap=True`` (``igrt.ddp_hook``): buckets in decision order, each as it becomes ready. A
     sparse bucket of a bounded sparsifier (top-k, ADTopk, random-k) is one all-gather of payloads
     padded to the nominal k, the count in an 8-byte header; other sparsifiers exchange counts (an
     all-gather of one int64 per rank) first. A dense bucket is an all-reduce of numel values.
   - ``overlap=False`` (``igrt.synchronizer``, after backward): at backward end one count exchange
     for all sparse buckets, then the sparse gathers padded to the largest k (none when k is 0), then
     the dense all-reduces.
   Each collective is costed by :func:`igsim.collectives.predict_collective` (closed form where
   contention-free, flow simulation otherwise); alone on the stream, its time depends only on its
   spec, so costs are cached.
4. ``comm_end`` is the end of the last collective (0 without one). Rank r's step time is
   ``max(f_r + b_r, comm_end) + o_r``; its exposed communication ``max(0, comm_end - (f_r + b_r))``;
   ``comm_s`` is the union of collective intervals (their sum, on one stream).

Bytes per rank and step are the payload handed to collectives, as ``igrt.comm`` counts them:
``values_bytes = k · value_bytes`` and ``indices_bytes = k · index_bytes`` per sparse bucket,
``dense_bytes = numel · value_bytes`` per dense bucket, ``metadata_bytes = 8`` per sparse bucket;
padding is not payload. ``k`` is the workload's recorded count when it was recorded at the
simulated density, else nominal. See docs/simulator.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from igpolicy.config import PolicyConfig
from igpolicy.decide import nominal_k, release_phases
from igpolicy.plan import SyncPlan
from igpolicy.vocab import ComponentId, ParamInfo, StepMetrics
from igsim.costs import CostCache
from igsim.decisions import Decider, StepLayout
from igsim.results import SPAN_KINDS, SimResult
from igsim.workload import Jitter, Workload

__all__ = ["BOUNDED_SPARSIFIERS", "METADATA_BYTES_PER_BUCKET", "MODES", "encoded_pairs_bytes", "simulate"]

METADATA_BYTES_PER_BUCKET = 8  # one int64 pair count per sparse bucket
HEADER_BYTES = 8  # the count at the head of every encoded sparse payload
BOUNDED_SPARSIFIERS = ("topk", "adtopk", "randomk")  # never select more than the nominal k
MODES = ("auto", "flow", "analytic")
_META, _SPARSE, _DENSE = (SPAN_KINDS.index(k) for k in ("metadata", "sparse_gather", "dense_allreduce"))


def simulate(
    *,
    workload: Workload,
    config: PolicyConfig,
    plan: SyncPlan | None,
    topology: Any,
    calibration: Any = None,
    num_steps: int,
    seed: int = 0,
    mode: str = "auto",
    jitter: Jitter | None = None,
    overlap: bool = True,
    dense_algorithm: str = "ring",
    sparse_algorithm: str = "ring",
    label: str | None = None,
    exact_costs: bool = False,
) -> SimResult:
    """Simulate ``num_steps`` training steps of ``config`` on ``topology``; returns a :class:`SimResult`.

    ``topology`` is an :class:`igsim.topology.Topology` (its ``ranks`` give the world size);
    ``calibration`` an optional :class:`igsim.calibration.Calibration`. ``mode`` is passed to
    ``predict_collective`` (``auto``: closed forms where the topology is contention-free, flow
    simulation otherwise). ``jitter`` makes ranks differ (seeded by ``seed`` and ``jitter.seed``);
    without it one representative rank is simulated. ``label`` names the policy in the result
    (default: ``config.policy``). ``exact_costs=True`` evaluates every distinct collective size
    exactly (see :class:`igsim.costs.CostCache` for the verified affine shortcut used otherwise
    with closed forms).
    Deterministic: the same arguments give identical rows.

    Raises ValueError for ``num_steps < 1``, an unknown mode, or a plan that does not cover the
    workload's components (from ``release_phases``).
    """
    if int(num_steps) < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    world_size = len(topology.ranks)
    if world_size < 1:
        raise ValueError("topology has no ranks")
    params = workload.params
    phases = release_phases(plan=plan, config=config, component_keys=[p.component for p in params])
    k_matrix, k_source = _k_matrix(workload, config)
    decider = Decider(config=config, params=params, world_size=world_size, phases=phases)
    costs = CostCache(
        topology=topology,
        calibration=calibration,
        mode=mode,
        world_size=world_size,
        dense_algorithm=dense_algorithm,
        sparse_algorithm=sparse_algorithm,
        affine=exact_costs is False
        and (mode == "analytic" or (mode == "auto" and _uniform_star(topology) and calibration is None)),
    )
    representative = jitter is None or jitter.is_identity
    num_rows_per_step = 1 if representative else world_size
    jit = Jitter(seed=0) if jitter is None else jitter
    jit_seeded = Jitter(
        seed=_mix(seed, jit.seed),
        compute_cv=jit.compute_cv,
        straggler_rank=jit.straggler_rank,
        straggler_slowdown=jit.straggler_slowdown,
    )
    cols = _Columns(num_steps * num_rows_per_step)
    steps = {
        k: np.zeros(num_steps) for k in ("start_s", "step_s", "forward_s", "backward_end_s", "comm_end_s")
    }
    spans: dict[str, list] = {k: [] for k in ("step", "bucket", "kind", "start_s", "end_s", "size_bytes")}
    sent: list[frozenset[str]] = []
    ib, vb = config.index_bytes, config.value_bytes
    clock = 0.0
    for t in range(num_steps):
        rec = workload.recorded_index(t)
        layout = decider.layout(t)
        sent.append(layout.sending_params)
        f, b, o = workload.forward_s[rec], workload.backward_s[rec], workload.optimizer_s[rec]
        factors = jit_seeded.factors(step=t, num_ranks=world_size)
        s_max = float(factors.max())
        ready = workload.ready_since_backward(rec) if overlap else np.full(len(params), b)
        bucket_ready, bucket_k = layout.reduce(ready, k_matrix[rec])
        stream = _run_stream(
            layout=layout,
            ready_s=s_max * (f + bucket_ready),
            bucket_k=bucket_k,
            costs=costs,
            config=config,
            after_backward=not overlap,
            step=t,
            spans=spans,
        )
        comm_end = stream.comm_end_s
        low_bytes = layout.low_bytes(k_matrix[rec], index_bytes=ib, value_bytes=vb)
        s = factors[:1] if representative else factors
        bend = s * (f + b)
        step_s = np.maximum(bend, comm_end) + s * o
        row = slice(t * num_rows_per_step, (t + 1) * num_rows_per_step)
        cols.fill(
            row,
            step=t,
            rank=np.arange(num_rows_per_step),
            values_bytes=stream.values_bytes,
            indices_bytes=stream.indices_bytes,
            dense_bytes=stream.dense_bytes,
            metadata_bytes=stream.metadata_bytes,
            num_collectives=stream.num_collectives,
            num_sending_components=layout.num_sending_components,
            low_bytes=low_bytes,
            compute_s=s * (f + b + o),
            comm_s=stream.comm_s,
            exposed_comm_s=np.maximum(0.0, comm_end - bend),
            step_s=step_s,
            bucket_imbalance=layout.imbalance,
        )
        global_step_s = float(max(step_s.max(), s_max * (f + b + o)))
        steps["start_s"][t] = clock
        steps["step_s"][t] = global_step_s
        steps["forward_s"][t] = s_max * f
        steps["backward_end_s"][t] = s_max * (f + b)
        steps["comm_end_s"][t] = comm_end
        clock += global_step_s
    return SimResult(
        policy=label or config.policy,
        world_size=world_size,
        num_steps=int(num_steps),
        representative=representative,
        columns=cols.arrays,
        steps=steps,
        spans={
            k: np.asarray(v, dtype=np.float64 if k.endswith("_s") else np.int64) for k, v in spans.items()
        },
        sent_params=tuple(sent),
        settings={
            "config": config.to_dict(),
            "plan_fingerprint": plan.fingerprint if plan is not None else None,
            "workload": workload.name,
            "world_size": world_size,
            "mode": mode,
            "overlap": overlap,
            "dense_algorithm": dense_algorithm,
            "sparse_algorithm": sparse_algorithm,
            "k_source": k_source,
            "seed": seed,
            "jitter": None if jitter is None else vars(jitter).copy(),
            "num_collective_evaluations": costs.num_evaluations,
        },
    )


@dataclass(frozen=True, kw_only=True)
class _Stream:
    """One step's communication stream: when it ends (since step start), busy time, bytes by kind."""

    comm_end_s: float
    comm_s: float
    num_collectives: int
    values_bytes: int
    indices_bytes: int
    dense_bytes: int
    metadata_bytes: int


def encoded_pairs_bytes(capacity: int, *, index_bytes: int, value_bytes: int) -> int:
    """Bytes per rank of one encoded sparse payload: an 8-byte count header, then ``capacity``
    (index, value) pairs, rounded up to a multiple of 8 (as ``igrt.comm.encode_pairs`` lays it out)."""
    raw = HEADER_BYTES + capacity * (index_bytes + value_bytes)
    return -(-raw // 8) * 8


def _run_stream(
    *,
    layout: StepLayout,
    ready_s: np.ndarray,
    bucket_k: np.ndarray,
    costs: CostCache,
    config: PolicyConfig,
    after_backward: bool,
    step: int,
    spans: dict[str, list],
) -> _Stream:
    """The step's collectives, one after another on one stream (see the module docstring).

    ``after_backward=False`` (the DDP comm hook): buckets in order, each when ready; a bounded
    sparsifier's gather is padded to the nominal k with the count in its header, others exchange
    counts first. ``after_backward=True`` (the synchronizer): one count exchange for every sparse
    bucket, then the sparse gathers (skipped when k is 0), then the dense all-reduces.
    """
    ib, vb = config.index_bytes, config.value_bytes
    bounded = config.sparsifier in BOUNDED_SPARSIFIERS
    cur = comm_s = 0.0
    values = indices = dense = meta = num = 0

    def put(kind: int, bucket: int, ready: float, cost: float, size: int) -> None:
        nonlocal cur, comm_s
        start = max(ready, cur)
        _span(spans, step, bucket, kind, start, start + cost, size)
        cur, comm_s = start + cost, comm_s + cost

    order = range(layout.num_buckets)
    sparse = [j for j in order if layout.sparse[j]]
    if after_backward:
        if sparse:
            put(
                _META,
                layout.index[sparse[0]],
                float(ready_s.max()),
                costs.metadata(len(sparse)),
                8 * len(sparse),
            )
        order = [*sparse, *(j for j in order if not layout.sparse[j])]
    for j in order:
        if layout.sparse[j]:
            k = int(bucket_k[j])
            values, indices, meta = values + k * vb, indices + k * ib, meta + METADATA_BYTES_PER_BUCKET
            if not after_backward and not bounded:
                put(_META, layout.index[j], float(ready_s[j]), costs.metadata(1), 8)
            capacity = int(layout.nominal_nnz[j]) if bounded and not after_backward else k
            if capacity > 0:
                wire = encoded_pairs_bytes(capacity, index_bytes=ib, value_bytes=vb)
                put(_SPARSE, layout.index[j], float(ready_s[j]), costs.sparse(wire), wire)
                num += 1
        else:
            size = int(layout.numel[j]) * vb
            put(_DENSE, layout.index[j], float(ready_s[j]), costs.dense(size), size)
            dense, num = dense + size, num + 1
    return _Stream(
        comm_end_s=cur,
        comm_s=comm_s,
        num_collectives=num,
        values_bytes=values,
        indices_bytes=indices,
        dense_bytes=dense,
        metadata_bytes=meta,
    )


def _uniform_star(topology: Any) -> bool:
    check = getattr(topology, "uniform_star", None)
    return bool(check is not None and check() is not None)


def _mix(a: int, b: int) -> int:
    return (int(a) * 1_000_003 + int(b)) % (2**63)


def _span(
    spans: dict[str, list], step: int, bucket: int, kind: int, start: float, end: float, size: int
) -> None:
    spans["step"].append(step)
    spans["bucket"].append(bucket)
    spans["kind"].append(kind)
    spans["start_s"].append(start)
    spans["end_s"].append(end)
    spans["size_bytes"].append(size)


def _kind(param: ParamInfo) -> str:
    return ComponentId.from_key(param.component).kind.value


def _k_matrix(workload: Workload, config: PolicyConfig) -> tuple[np.ndarray, str]:
    """Selected entries per (recorded step, param): the workload's when recorded at this density."""
    numel = workload.numel
    if (
        workload.k is not None
        and config.sparse
        and workload.k_density is not None
        and not config.density_per_kind
        and math.isclose(workload.k_density, config.density, rel_tol=1e-9)
    ):
        return workload.k, "trace"
    nominal = np.array(
        [nominal_k(int(n), config.density_for(_kind(p))) for n, p in zip(numel, workload.params)]
    )
    return np.broadcast_to(nominal.astype(np.int64), (workload.num_recorded_steps, len(numel))), "nominal"


# every numeric StepMetrics field, as a column ("extra" and the string fields are not stored)
_ROW_DTYPES: dict[str, Any] = {
    f.name: np.int64 if f.type == "int" else np.float64
    for f in fields(StepMetrics)
    if f.type in ("int", "float")
}


class _Columns:
    """Preallocated StepMetrics columns."""

    def __init__(self, n: int) -> None:
        self.arrays = {k: np.zeros(n, dtype=d) for k, d in _ROW_DTYPES.items()}

    def fill(self, rows: slice, **values: Any) -> None:
        for k, v in values.items():
            self.arrays[k][rows] = v
