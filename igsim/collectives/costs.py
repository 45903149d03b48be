"""Collective costs for the step engine: seconds per collective, cached by (op, bytes per rank).

The engine's stream runs one collective at a time, so a collective's time depends only on its
spec; :class:`CostCache` evaluates each distinct size once with
:func:`igsim.collectives.predict.predict_collective` (and, for closed forms, reads further sizes off a
verified line). Three ops: ``dense`` (all-reduce of the bucket), ``sparse`` (all-gather of equal
encoded payloads) and ``metadata`` (the int64 count exchange).
"""

from __future__ import annotations

from typing import Any

from igsim.collectives.predict import CollectiveSpec, predict_collective

__all__ = ["CostCache"]


class CostCache:
    """Collective times in seconds, cached by (op, bytes per rank).

    With ``affine`` (closed-form costing: ``mode="analytic"``, or ``auto`` on a uniform star), the
    time of each op is checked to be affine in its size: the first two sizes define a line, the next
    three exact evaluations must lie on it to 1e-9 relative, and only then are further sizes read
    off the line. Any miss turns the shortcut off for that op. Per-step sizes from a trace then cost
    one line evaluation instead of one closed form over every rank.
    """

    _CHECKS = 3

    def __init__(
        self,
        *,
        topology: Any,
        calibration: Any,
        mode: str,
        world_size: int,
        dense_algorithm: str,
        sparse_algorithm: str,
        affine: bool,
    ) -> None:
        self.topology, self.calibration, self.mode = topology, calibration, mode
        self.world_size = world_size
        self.dense_algorithm, self.sparse_algorithm = dense_algorithm, sparse_algorithm
        self.affine = affine
        self._cache: dict[tuple[str, int], float] = {}
        self._points: dict[str, list[tuple[int, float]]] = {}
        self._line: dict[str, tuple[float, float]] = {}  # op -> (intercept, slope)
        self._broken: set[str] = set()
        self.num_evaluations = 0

    def _predict(self, op: str, size: int) -> float:
        if self.world_size == 1:
            return 0.0
        p = self.world_size
        if op == "dense":
            spec = CollectiveSpec(op="all_reduce", algorithm=self.dense_algorithm, size_bytes=size)
        elif op == "sparse":
            spec = CollectiveSpec(
                op="sparse_all_gather",
                algorithm=self.sparse_algorithm,
                size_bytes=size,
                sizes_bytes=(size,) * p,
            )
        else:  # the count exchange: every rank contributes ``size`` bytes of int64 counts
            spec = CollectiveSpec(op="all_gather", algorithm="ring", size_bytes=size * p)
        self.num_evaluations += 1
        return float(
            predict_collective(spec, self.topology, calibration=self.calibration, mode=self.mode).time_s
        )

    def _get(self, op: str, size: int) -> float:
        key = (op, size)
        t = self._cache.get(key)
        if t is not None:
            return t
        learning = self.affine and op not in self._broken
        if learning and len(self._points.get(op, ())) >= 2 + self._CHECKS:
            intercept, slope = self._line[op]
            t = intercept + slope * size
        else:
            t = self._predict(op, size)
            if learning:
                self._learn(op, size, t)
        self._cache[key] = t
        return t

    def _learn(self, op: str, size: int, t: float) -> None:
        pts = self._points.setdefault(op, [])
        pts.append((size, t))
        if len(pts) == 2:
            (s0, t0), (s1, t1) = pts
            slope = (t1 - t0) / (s1 - s0)
            self._line[op] = (t0 - slope * s0, slope)
        elif len(pts) > 2:
            intercept, slope = self._line[op]
            if abs(intercept + slope * size - t) > 1e-9 * max(abs(t), 1e-12):
                self._broken.add(op)  # not affine: exact evaluations from now on

    def dense(self, size_bytes: int) -> float:
        return self._get("dense", int(size_bytes))

    def sparse(self, size_bytes: int) -> float:
        return self._get("sparse", int(size_bytes))

    def metadata(self, num_counts: int) -> float:
        """The count exchange: an all-gather of ``num_counts`` int64 per rank."""
        return self._get("metadata", 8 * int(num_counts))
