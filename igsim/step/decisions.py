"""Step plans as index arrays: what the engine needs of each :mod:`igpolicy.step_plan` plan.

:class:`PlanSource` holds the run's :class:`igpolicy.planner.StepPlanner` (the object the runtime
holds) and, for the DDP hook, DDP's bucket assignment per step (:func:`igpolicy.step_plan.ddp_buckets`:
the construction-time buckets at step 0, the buckets rebuilt over the first backward's ready order
from step 1 on). A :class:`PlanLayout` holds one plan's ops with their parameters as index arrays
over the workload's parameters, so per-step work (gate times, selected entries) is vectorised.
Layouts are cached per (release slot, bucket assignment).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from igpolicy.config import PolicyConfig
from igpolicy.planner import StepPlanner
from igpolicy.step_plan import DDP_FIRST_BUCKET_CAP_BYTES, CollectiveOp, Gate, OpKind, StepPlan, ddp_buckets
from igpolicy.vocab import ParamInfo
from igpolicy.wire import dense_value_bytes

__all__ = ["PlanLayout", "PlanSource"]


def _reduce(ufunc, values: np.ndarray, members: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, empty):
    n = len(sizes)
    out = np.full((*values.shape[:-1], n), empty, dtype=values.dtype)
    nz = sizes > 0
    if np.any(nz):
        out[..., nz] = ufunc.reduceat(values[..., members], offsets[nz], axis=-1)
    return out


@dataclass(frozen=True, kw_only=True, eq=False)
class PlanLayout:
    """One step plan's ops, their parameters as index arrays over the workload's parameters."""

    plan: StepPlan
    members: np.ndarray  # payload parameters of every op, concatenated (count exchanges: none)
    offsets: np.ndarray
    sizes: np.ndarray
    gate_members: np.ndarray  # gating parameters of every op (bucket-ready gates), concatenated
    gate_offsets: np.ndarray
    gate_sizes: np.ndarray
    bucket_gated: np.ndarray  # [num_ops] bool: gated by its bucket's readiness (else backward end)
    low_sparse: np.ndarray  # low-importance parameters travelling in sparse gathers
    low_dense_numel: int  # elements of low-importance parameters travelling dense

    @property
    def ops(self) -> tuple[CollectiveOp, ...]:
        return self.plan.ops

    def op_k(self, k: np.ndarray) -> np.ndarray:
        """Selected pairs per op from per-parameter ``k`` ([..., P] -> [..., num_ops])."""
        return _reduce(np.add, np.asarray(k, dtype=np.int64), self.members, self.offsets, self.sizes, 0)

    def op_gate_s(self, ready: np.ndarray, backward_end_s: float) -> np.ndarray:
        """When each op may start: backward end, or its gating parameters' latest ready time."""
        out = np.full(len(self.ops), float(backward_end_s))
        if self.bucket_gated.any():
            r = _reduce(np.maximum, np.asarray(ready, dtype=np.float64), self.gate_members,
                        self.gate_offsets, self.gate_sizes, 0.0)  # fmt: skip
            out[self.bucket_gated] = r[self.bucket_gated]
        return out

    def low_bytes(self, k: np.ndarray, *, index_bytes: int, value_bytes: int) -> int:
        """Bytes of low-importance parameters on the wire (sparse pairs + dense values at
        :func:`igpolicy.wire.dense_value_bytes`), as the runtime counts them per parameter."""
        pairs = int(np.asarray(k)[self.low_sparse].sum())
        return pairs * (index_bytes + value_bytes) + self.low_dense_numel * dense_value_bytes(value_bytes)


def _layout(plan: StepPlan, index_of: dict[str, int], low_mask: np.ndarray) -> PlanLayout:
    members, offsets, sizes = [], [], []
    gates, gate_offsets, gate_sizes = [], [], []
    low_sparse, low_dense_numel = [], 0
    for op in plan.ops:
        idx = [index_of[n] for n in op.param_names]
        low = [(i, n) for i, n in zip(idx, op.param_numel) if low_mask[i]]
        if op.kind == OpKind.SPARSE_GATHER:
            low_sparse.extend(i for i, _ in low)
        elif op.kind == OpKind.DENSE_ALLREDUCE:
            low_dense_numel += sum(n for _, n in low)
        offsets.append(len(members))
        sizes.append(len(idx))
        members.extend(idx)
        g = [index_of[n] for n in op.gate_params]
        gate_offsets.append(len(gates))
        gate_sizes.append(len(g))
        gates.extend(g)

    def arr(x):
        return np.asarray(x, dtype=np.int64)

    return PlanLayout(
        plan=plan,
        members=arr(members), offsets=arr(offsets), sizes=arr(sizes),
        gate_members=arr(gates), gate_offsets=arr(gate_offsets), gate_sizes=arr(gate_sizes),
        bucket_gated=np.array([op.gate == Gate.BUCKET_READY for op in plan.ops], dtype=bool),
        low_sparse=arr(low_sparse), low_dense_numel=int(low_dense_numel),
    )  # fmt: skip


class PlanSource:
    """Step plans (as layouts) of every simulated step, for one integration.

    ``first_ready_s`` ([P], seconds since backward start) is the first recorded backward's
    readiness, from which DDP rebuilds its buckets (ddp-hook only).
    """

    def __init__(
        self,
        *,
        config: PolicyConfig,
        params: Sequence[ParamInfo],
        world_size: int,
        phases: dict[str, int | None],
        integration: str,
        first_ready_s: np.ndarray | None = None,
        ddp_bucket_cap_bytes: int = 25 * 2**20,
        ddp_first_bucket_cap_bytes: int | None = DDP_FIRST_BUCKET_CAP_BYTES,
    ) -> None:
        self.params = tuple(params)
        self.planner = StepPlanner(
            config=config, params=self.params, world_size=world_size, phases=phases, integration=integration
        )
        self.integration = integration
        self.k_matrix: np.ndarray | None = None  # the run's k under this plan (set by the engine)
        self.index_of = {p.name: i for i, p in enumerate(self.params)}
        self.low_mask = np.array([phases[p.component] is not None for p in self.params], dtype=bool)
        self.assignments: tuple | None = None
        if integration == "ddp-hook":
            ready = np.zeros(len(self.params)) if first_ready_s is None else np.asarray(first_ready_s)
            # gradients become ready in backward: ascending ready time; ties in reverse registration order
            order = sorted(range(len(self.params)), key=lambda i: (ready[i], -self.params[i].order))
            self.assignments = (
                ddp_buckets(self.params, bucket_cap_bytes=ddp_bucket_cap_bytes,
                            first_bucket_cap_bytes=ddp_first_bucket_cap_bytes),
                ddp_buckets(self.params, bucket_cap_bytes=ddp_bucket_cap_bytes,
                            first_bucket_cap_bytes=ddp_first_bucket_cap_bytes,
                            ready_order=[self.params[i].name for i in order]),
            )  # fmt: skip
        self._cache: dict[tuple[int, int], PlanLayout] = {}

    def ddp_bucket_names(self, step: int):
        """DDP's buckets at ``step`` (None for after-backward integrations)."""
        if self.assignments is None:
            return None
        return self.assignments[0 if step == 0 else 1]

    def layout(self, step: int) -> PlanLayout:
        which = -1 if self.assignments is None else (0 if step == 0 else 1)
        key = (self.planner.slot(step) if step >= 1 or which == -1 else None, which)
        lay = self._cache.get(key)
        if lay is None or step < self.planner.warmup + 2 * self.planner.period:
            plan = self.planner.plan(step, ddp_bucket_names=self.ddp_bucket_names(step))
            lay = _layout(plan, self.index_of, self.low_mask)
            self._cache[key] = lay
        return lay
