"""Step decisions as index arrays: what the engine needs of each :func:`decide_step` result.

:class:`Decider` calls :func:`igpolicy.decide.decide_step` (the function the runtime calls) for
the first two release periods only and reuses the layouts afterwards (every release schedule is
periodic in the release period, and decisions use nominal sizes; the second period is checked
against the first). A :class:`StepLayout` holds one decision's buckets as arrays over the
workload's parameters, so per-step work (bucket ready times, selected entries) is vectorised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from igpolicy.config import PolicyConfig
from igpolicy.decide import StepDecision, decide_step
from igpolicy.vocab import CollectiveKind, ParamInfo

__all__ = ["Decider", "StepLayout", "layout_key"]


@dataclass(frozen=True, kw_only=True, eq=False)
class StepLayout:
    """One step decision turned into index arrays over the workload's parameters."""

    index: tuple[int, ...]  # bucket indices in launch order
    members: np.ndarray  # parameter indices of all buckets, concatenated
    offsets: np.ndarray  # start of each bucket in ``members``
    sizes: np.ndarray  # parameters per bucket
    sparse: tuple[bool, ...]
    numel: np.ndarray
    nominal_nnz: np.ndarray  # decide_step's nominal pairs per bucket (the padded capacity)
    low_sparse: np.ndarray  # low-importance parameters travelling sparse
    low_dense_numel: int  # elements of low-importance parameters travelling dense
    num_sending_components: int
    imbalance: float
    sending_params: frozenset[str]

    @property
    def num_buckets(self) -> int:
        return len(self.index)

    def reduce(self, ready: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(latest ready time, summed k) per bucket, from per-parameter ``ready`` (seconds) and
        ``k`` (selected entries)."""
        n = self.num_buckets
        if n == 0:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        if np.all(self.sizes > 0):
            r = np.maximum.reduceat(ready[self.members], self.offsets)
            kk = np.add.reduceat(k[self.members], self.offsets)
            return r, kk
        r, kk = np.zeros(n), np.zeros(n, dtype=np.int64)
        for j in range(n):
            m = self.members[self.offsets[j] : self.offsets[j] + self.sizes[j]]
            if len(m):
                r[j], kk[j] = ready[m].max(), k[m].sum()
        return r, kk

    def low_bytes(self, k: np.ndarray, *, index_bytes: int, value_bytes: int) -> int:
        """Bytes of low-importance parameters on the wire this step (sparse pairs + dense values)."""
        return (
            int(k[self.low_sparse].sum()) * (index_bytes + value_bytes) + self.low_dense_numel * value_bytes
        )


class Decider:
    """decide_step for every step, turned into layouts.

    Every release schedule in igpolicy is periodic with the release period and decisions use nominal
    sizes, so decide_step is called for steps 0 .. 2R-1 only; the second period is checked against
    the first (a loud error if a schedule ever stops being periodic) and later steps reuse them.
    """

    def __init__(
        self,
        *,
        config: PolicyConfig,
        params: Sequence[ParamInfo],
        world_size: int,
        phases: dict[str, int | None],
    ) -> None:
        self.config, self.params, self.world_size, self.phases = config, tuple(params), world_size, phases
        self.period = int(config.release_period)
        self.index_of = {p.name: i for i, p in enumerate(self.params)}
        self.numel = np.array([p.numel for p in self.params], dtype=np.int64)
        self.low = np.array([phases[p.component] is not None for p in self.params], dtype=bool)
        self._cache: dict[int, StepLayout] = {}

    def decision(self, step: int) -> StepDecision:
        return decide_step(
            step=step, config=self.config, params=self.params, world_size=self.world_size, phases=self.phases
        )

    def layout(self, step: int) -> StepLayout:
        slot = step % self.period
        if step < self.period:
            self._cache[slot] = self._to_layout(self.decision(step))
        elif step < 2 * self.period:
            again = self._to_layout(self.decision(step))
            if layout_key(again) != layout_key(self._cache[slot]):
                raise AssertionError(f"decide_step is not periodic in release_period at step {step}")
        return self._cache[slot]

    def _to_layout(self, dec: StepDecision) -> StepLayout:
        members: list[int] = []
        offsets, sizes, sparse, numel, nominal, index = [], [], [], [], [], []
        low_sparse: list[int] = []
        low_dense_numel = 0
        for bucket in dec.buckets:
            idx = [self.index_of[n] for n in bucket.param_names]
            offsets.append(len(members))
            sizes.append(len(idx))
            members.extend(idx)
            is_sparse = bucket.collective == CollectiveKind.SPARSE_GATHER
            sparse.append(is_sparse)
            numel.append(bucket.numel)
            nominal.append(bucket.nominal_nnz)
            index.append(bucket.index)
            low_idx = [i for i in idx if self.low[i]]
            if is_sparse:
                low_sparse.extend(low_idx)
            else:
                low_dense_numel += int(self.numel[low_idx].sum()) if low_idx else 0
        components = {p.component for p in self.params}
        return StepLayout(
            index=tuple(index),
            members=np.asarray(members, dtype=np.int64),
            offsets=np.asarray(offsets, dtype=np.int64),
            sizes=np.asarray(sizes, dtype=np.int64),
            sparse=tuple(sparse),
            numel=np.asarray(numel, dtype=np.int64),
            nominal_nnz=np.asarray(nominal, dtype=np.int64),
            low_sparse=np.asarray(low_sparse, dtype=np.int64),
            low_dense_numel=low_dense_numel,
            num_sending_components=len(dec.release.send & components),
            imbalance=float(dec.packing.imbalance),
            sending_params=dec.sending_params,
        )


def layout_key(layout: StepLayout) -> tuple:
    """What must agree between two layouts of the same step (buckets, members, sparse or dense)."""
    return (layout.index, layout.members.tobytes(), layout.offsets.tobytes(), layout.sparse)
